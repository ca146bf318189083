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
// PostgreSQL and MariaDB. On PostgreSQL: plain GORM; the plugin as registered (the wake-up sent after
// commit, at most one NOTIFY per few milliseconds: internal/capture's txwatch.go); the plugin with pg_notify inside
// every transaction, as before (plugin_intx_notify); the plugin WithoutNotify; the plugin with its
// INSERT in a round trip of its own before the COMMIT, on *sql.Tx (plugin_sqltx); and the floor of any
// outbox written by a statement of its own (raw_floor: a hand-built INSERT beside the create). PostgreSQL
// serialises the commits of transactions that notified, which is what concurrency makes costly; a
// connection LISTENs on the outbox's channel meanwhile, as a relay does (no relay claims). On MariaDB,
// which has no notification: plain GORM and the plugin. Variants run in rotating order within each
// round; the medians of the per-round ratios to plain are the figures to read.
//
//	go test -run '^$' -bench BenchmarkConcurrentWriters -benchtime 10x
func BenchmarkConcurrentWriters(b *testing.B) {
	cfg := func() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }
	b.Run("postgres", func(b *testing.B) {
		d := dialects[1]
		cfg := func() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }
		plain := openDB(b, d, cfg())
		resetTables(b, plain, &BenchUser{}, &outboxplugin.OutboxEvent{})
		withPlugin := openDB(b, d, cfg())
		inTx := openDB(b, d, cfg())
		noNotify := openDB(b, d, cfg())
		sqlTx := openDB(b, d, cfg())
		inTxPlugin := outboxplugin.New()
		outboxplugin.UseNotifyInTransaction(inTxPlugin)
		sqlTxPlugin := outboxplugin.New()
		outboxplugin.UseSeparateCommit(sqlTxPlugin)
		for _, u := range []struct {
			db *gorm.DB
			p  *outboxplugin.Plugin
		}{{withPlugin, outboxplugin.New()}, {inTx, inTxPlugin}, {noNotify, outboxplugin.New(outboxplugin.WithoutNotify())}, {sqlTx, sqlTxPlugin}} {
			if err := u.db.Use(u.p); err != nil {
				b.Fatal(err)
			}
		}
		for _, db := range []*gorm.DB{plain, withPlugin, inTx, noNotify, sqlTx} {
			sqlDB, err := db.DB()
			if err != nil {
				b.Fatal(err)
			}
			sqlDB.SetMaxOpenConns(concurrentWriters + 4)
			sqlDB.SetMaxIdleConns(concurrentWriters + 4)
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
		measureWriters(b, []writerVariant{{"plain", plain, nil}, {"plugin", withPlugin, nil}, {"plugin_intx_notify", inTx, nil},
			{"plugin_nonotify", noNotify, nil}, {"plugin_sqltx", sqlTx, nil}, {"raw_floor", plain, rawFloorWriter}})
	})
	b.Run("mysql", func(b *testing.B) {
		d := mariaDB(b)
		plain := openDB(b, d, cfg())
		resetTables(b, plain, &BenchUser{}, &outboxplugin.OutboxEvent{})
		withPlugin := openDB(b, d, cfg())
		if err := withPlugin.Use(outboxplugin.New()); err != nil {
			b.Fatal(err)
		}
		for _, db := range []*gorm.DB{plain, withPlugin} {
			sqlDB, err := db.DB()
			if err != nil {
				b.Fatal(err)
			}
			sqlDB.SetMaxOpenConns(concurrentWriters + 4)
			sqlDB.SetMaxIdleConns(concurrentWriters + 4)
		}
		measureWriters(b, []writerVariant{{"plain", plain, nil}, {"plugin", withPlugin, nil}, {"raw_floor", plain, rawFloorWriter}})
	})
}

const concurrentWriters, perWriter = 16, 200

type writerVariant struct {
	name  string
	db    *gorm.DB
	write func(db *gorm.DB, u *BenchUser) error // nil: db.Create(u) in GORM's own transaction
}

// rawFloorWriter commits the create with a hand-built outbox INSERT beside it: the floor of any outbox
// written by a statement of its own (createWithRawOutboxInsert).
var rawFloorWriter = func(db *gorm.DB, u *BenchUser) error {
	return db.Transaction(func(tx *gorm.DB) error { return createWithRawOutboxInsert(tx, []BenchUser{*u}) })
}

// measureWriters runs b.N rounds of every variant, in rotating order, each round concurrentWriters
// goroutines committing perWriter single Creates, and reports each variant's median ratio to the
// first.
func measureWriters(b *testing.B, variants []writerVariant) {
	const writers = concurrentWriters
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
						u := &BenchUser{Name: fmt.Sprint("w", g)}
						var err error
						if v := variants[k]; v.write != nil {
							err = v.write(v.db, u)
						} else {
							err = v.db.Create(u).Error
						}
						if err != nil {
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

// BenchmarkWakeUpLatency measures the time from a commit returning to its event reaching the
// publisher, at about 500 commits per second, for a worker polling once a minute. On PostgreSQL: one
// on the writer's own *gorm.DB (woken by the commit directly) and one on another *gorm.DB, another
// pool as another process would have (woken by the NOTIFY sent after commit). On MariaDB, which has
// no notifications: a worker of the writer's process with batches of DefaultBatchSize and of
// DefaultMySQLBatchSize (its default there), for what the batch size costs at a low rate. p50 and p99
// per variant (-count 3 repeats each variant three times in a row: these are latencies at a steady low
// rate, read one by one, not ratios). A worker of the same process is woken
// inside the commit, so it may publish before Create has returned: its latencies can be a little
// below zero.
//
//	go test -run '^$' -bench BenchmarkWakeUpLatency -benchtime 1x -count 3
func BenchmarkWakeUpLatency(b *testing.B) {
	const commits, every = 1000, 2 * time.Millisecond
	cfg := func() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }
	byName := map[string]dialect{}
	for _, d := range dialects {
		byName[d.name] = d
	}
	writers := map[string]*gorm.DB{}
	// Opened on the parent benchmark, so that they outlive each variant (a sub-benchmark's cleanups
	// run when it ends); one per database, shared by its variants.
	writerOf := func(d dialect) *gorm.DB {
		if w := writers[d.name]; w != nil {
			return w
		}
		w := openDB(b, d, cfg())
		resetTables(b, w, &BenchUser{}, &outboxplugin.OutboxEvent{})
		if err := w.Use(outboxplugin.New()); err != nil {
			b.Fatal(err)
		}
		writers[d.name] = w
		return w
	}
	for _, v := range []struct {
		name        string
		d           dialect
		sameProcess bool
		opts        []outboxplugin.WorkerOption
	}{
		{"postgres/same-process", byName["postgres"], true, []outboxplugin.WorkerOption{outboxplugin.WithoutListen()}},
		{"postgres/other-pool", byName["postgres"], false, nil},
		{fmt.Sprintf("mysql/same-process/batch%d", outboxplugin.DefaultBatchSize), byName["mysql"], true,
			[]outboxplugin.WorkerOption{outboxplugin.WithBatchSize(outboxplugin.DefaultBatchSize)}},
		{fmt.Sprintf("mysql/same-process/batch%d", outboxplugin.DefaultMySQLBatchSize), byName["mysql"], true, nil},
	} {
		b.Run(v.name, func(b *testing.B) {
			var (
				mu        sync.Mutex
				committed = map[string]time.Time{} // payload -> when its Create returned
				received  = map[string]time.Time{} // payload -> when the publisher got it
				all       = make(chan struct{})
			)
			pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
				now := time.Now()
				mu.Lock()
				defer mu.Unlock()
				for _, m := range msgs {
					received[string(m.Payload)] = now
				}
				if len(received) == commits*b.N {
					close(all)
				}
				return nil
			})
			writer := writerOf(v.d)
			workerDB := writer
			if !v.sameProcess {
				workerDB = openDB(b, v.d, cfg())
			}
			w, err := outboxplugin.NewWorker(workerDB, pub, append([]outboxplugin.WorkerOption{outboxplugin.WithLogger(quietLogger),
				outboxplugin.WithPollInterval(time.Minute)}, v.opts...)...)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }()
			time.Sleep(500 * time.Millisecond) // LISTEN in place, the first poll done
			b.ResetTimer()
			tick := time.NewTicker(every)
			for i := 0; i < commits*b.N; i++ {
				<-tick.C
				u := BenchUser{Name: "latency"}
				if err := writer.Create(&u).Error; err != nil {
					b.Fatal(err)
				}
				at := time.Now()
				mu.Lock()
				committed[fmt.Sprintf(`{"id":%d}`, u.ID)] = at
				mu.Unlock()
			}
			tick.Stop()
			select {
			case <-all:
			case <-time.After(2 * time.Minute):
				b.Fatal("not every event was published")
			}
			b.StopTimer()
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			mu.Lock()
			latencies := make([]time.Duration, 0, len(committed))
			for k, at := range committed {
				latencies = append(latencies, received[k].Sub(at))
			}
			mu.Unlock()
			slices.Sort(latencies)
			b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
