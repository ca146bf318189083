package outboxplugin_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// BenchmarkWritersBesideRelays runs, on MariaDB, 16 application writers (each a transaction with a
// Create through the plugin and an Emit) in phases that alternate between no relay and 3 relays
// running at their defaults, and reports what the relays cost the application: its transactions that
// failed (deadlock victims, 1213; lock wait timeouts, 1205), and its commit latency with relays
// against without. The server's deadlock and row-lock-wait counters over the relay phases are
// reported too (they are the server's: another user of it adds to them).
//
//	OUTBOX_BENCH_SECONDS=300 go test -run '^$' -bench BenchmarkWritersBesideRelays -benchtime 1x -timeout 30m
//
// OUTBOX_BENCH_SECONDS is the length of the whole run (default 40), in phases of 10 s.
func BenchmarkWritersBesideRelays(b *testing.B) {
	d := mariaDB(b)
	total := 40 * time.Second
	if v := os.Getenv("OUTBOX_BENCH_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("OUTBOX_BENCH_SECONDS=%q: want a positive count", v)
		}
		total = time.Duration(n) * time.Second
	}
	const (
		writers = 16
		relays  = 3
		phase   = 10 * time.Second
	)
	db := openDB(b, d, &gorm.Config{Logger: logger.Discard})
	resetTables(b, db, &outboxplugin.OutboxEvent{}, &BenchUser{})
	if err := db.Use(outboxplugin.New()); err != nil {
		b.Fatal(err)
	}
	pool, err := db.DB()
	if err != nil {
		b.Fatal(err)
	}
	pool.SetMaxOpenConns(writers + 2*relays + 4)
	serverCounter := func(name string) int64 {
		var variable string
		var value int64
		if err := db.Raw("SHOW GLOBAL STATUS LIKE '"+name+"'").Row().Scan(&variable, &value); err != nil {
			b.Fatal(err)
		}
		return value
	}

	type phaseStats struct {
		commits, deadlocks, lockWaits int64
		latencies                     []time.Duration
		serverDeadlocks, serverWaits  int64
	}
	var stats [2]phaseStats // 0: no relay, 1: relays
	var mu sync.Mutex
	var otherErr atomic.Pointer[error]

	b.ResetTimer()
	for range b.N {
		for start, k := time.Now(), 0; time.Since(start) < total; k++ {
			withRelays := k%2 == 1
			s := &stats[k%2]
			ctx, cancel := context.WithTimeout(context.Background(), phase)
			var wg sync.WaitGroup
			if withRelays {
				for r := 0; r < relays; r++ {
					w, err := outboxplugin.NewWorker(db, noopPublisher, outboxplugin.WithLogger(quietLogger), outboxplugin.WithoutListen())
					if err != nil {
						b.Fatal(err)
					}
					wg.Go(func() {
						if err := w.Run(ctx); err != nil {
							otherErr.Store(&err)
						}
					})
				}
			}
			dl0, lw0 := serverCounter("Innodb_deadlocks"), serverCounter("Innodb_row_lock_waits")
			var ww sync.WaitGroup
			for i := 0; i < writers; i++ {
				ww.Go(func() {
					var local []time.Duration
					var commits, deadlocks, waits int64
					for ctx.Err() == nil {
						t0 := time.Now()
						err := db.Transaction(func(tx *gorm.DB) error {
							if err := tx.Create(&BenchUser{Name: "writer"}).Error; err != nil {
								return err
							}
							return outboxplugin.Emit(tx, "Written", map[string]int{"writer": i})
						})
						var my *mysql.MySQLError
						switch {
						case err == nil:
							commits++
							local = append(local, time.Since(t0))
						case errors.As(err, &my) && my.Number == 1213:
							deadlocks++
						case errors.As(err, &my) && my.Number == 1205:
							waits++
						default:
							otherErr.Store(&err)
							return
						}
					}
					mu.Lock()
					s.commits += commits
					s.deadlocks += deadlocks
					s.lockWaits += waits
					s.latencies = append(s.latencies, local...)
					mu.Unlock()
				})
			}
			ww.Wait()
			s.serverDeadlocks += serverCounter("Innodb_deadlocks") - dl0
			s.serverWaits += serverCounter("Innodb_row_lock_waits") - lw0
			cancel()
			wg.Wait()
			if p := otherErr.Load(); p != nil {
				b.Fatal(*p)
			}
		}
	}
	b.StopTimer()
	pct := func(l []time.Duration, p float64) time.Duration {
		if len(l) == 0 {
			return 0
		}
		s := slices.Clone(l)
		slices.Sort(s)
		return s[int(float64(len(s)-1)*p)]
	}
	for k, name := range []string{"none", "relays"} {
		s := stats[k]
		b.ReportMetric(float64(s.commits), name+"-commits")
		b.ReportMetric(float64(s.deadlocks+s.lockWaits), name+"-failed")
		b.ReportMetric(float64(pct(s.latencies, 0.5).Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(pct(s.latencies, 0.99).Microseconds()), name+"-p99-µs")
		b.ReportMetric(float64(s.serverDeadlocks), name+"-server-deadlocks")
		b.ReportMetric(float64(s.serverWaits), name+"-server-lock-waits")
	}
	b.ReportMetric(float64(pct(stats[1].latencies, 0.5))/float64(pct(stats[0].latencies, 0.5)), "p50-relays/none")
	b.ReportMetric(float64(pct(stats[1].latencies, 0.99))/float64(pct(stats[0].latencies, 0.99)), "p99-relays/none")
}
