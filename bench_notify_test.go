package outboxplugin_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// BenchmarkConcurrentWriters measures 16 goroutines each committing 200 single Creates at once, on
// PostgreSQL: plain GORM; the plugin as registered (the wake-up sent after commit, at most one NOTIFY
// per few milliseconds: commitwatch.go); the plugin with pg_notify inside every transaction, as
// before (plugin_intx_notify); and the plugin WithoutNotify. PostgreSQL serialises the commits of
// transactions that notified, which is what concurrency makes costly. A connection LISTENs on the outbox's channel meanwhile, as a relay
// does (no relay claims). Variants run in rotating order within each round; the medians of the
// per-round ratios to plain are the figures to read.
//
//	go test -run '^$' -bench BenchmarkConcurrentWriters -benchtime 10x
func BenchmarkConcurrentWriters(b *testing.B) {
	const writers, perWriter = 16, 200
	d := dialects[1]
	cfg := func() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }
	plain := openDB(b, d, cfg())
	resetTables(b, plain, &BenchUser{}, &outboxplugin.OutboxEvent{})
	withPlugin := openDB(b, d, cfg())
	inTx := openDB(b, d, cfg())
	noNotify := openDB(b, d, cfg())
	inTxPlugin := outboxplugin.New()
	outboxplugin.UseNotifyInTransaction(inTxPlugin)
	for _, u := range []struct {
		db *gorm.DB
		p  *outboxplugin.Plugin
	}{{withPlugin, outboxplugin.New()}, {inTx, inTxPlugin}, {noNotify, outboxplugin.New(outboxplugin.WithoutNotify())}} {
		if err := u.db.Use(u.p); err != nil {
			b.Fatal(err)
		}
	}
	for _, db := range []*gorm.DB{plain, withPlugin, inTx, noNotify} {
		sqlDB, err := db.DB()
		if err != nil {
			b.Fatal(err)
		}
		sqlDB.SetMaxOpenConns(writers + 4)
		sqlDB.SetMaxIdleConns(writers + 4)
	}
	// A relay LISTENs, as in production: the notifications are then queued for it and signalled at
	// commit, which is the work PostgreSQL serialises.
	conn, err := pgx.Connect(context.Background(), replaceDSNField(postgresServerDSN(), "dbname", testDatabase))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), `LISTEN "outbox_events"`); err != nil {
		b.Fatal(err)
	}
	listenCtx, stopListening := context.WithCancel(context.Background())
	listened := make(chan struct{})
	go func() {
		defer close(listened)
		for listenCtx.Err() == nil {
			_, _ = conn.WaitForNotification(listenCtx)
		}
	}()
	defer func() {
		stopListening()
		<-listened
		conn.Close(context.Background())
	}()
	variants := []struct {
		name string
		db   *gorm.DB
	}{{"plain", plain}, {"plugin", withPlugin}, {"plugin_intx_notify", inTx}, {"plugin_nonotify", noNotify}}
	spent := make([][]time.Duration, len(variants))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range variants {
			k := (i + j) % len(variants)
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for g := 0; g < writers; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; n < perWriter; n++ {
						if err := variants[k].db.WithContext(context.Background()).Create(&BenchUser{Name: fmt.Sprint("w", g)}).Error; err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			spent[k] = append(spent[k], time.Since(start))
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	// Ratios of each round's times, then their median: a shared machine's drift hits a round alike.
	for k := 1; k < len(variants); k++ {
		ratios := make([]float64, len(spent[k]))
		for r := range spent[k] {
			ratios[r] = float64(spent[k][r]) / float64(spent[0][r])
		}
		slices.Sort(ratios)
		b.ReportMetric(ratios[len(ratios)/2], variants[k].name+"/plain")
	}
	var total time.Duration
	for _, s := range spent[0] {
		total += s
	}
	b.ReportMetric(float64(writers*perWriter*len(spent[0]))/total.Seconds(), "plain-commits/s")
}
