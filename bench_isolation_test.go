package outboxplugin_test

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// BenchmarkInsertDuringClaims measures, on MariaDB, the latency of the application's writes (a Create
// through the plugin, which inserts an outbox row) while a worker claims batches without pause, with
// the claim's transaction at REPEATABLE READ (MySQL's default, and the worker's) and at READ COMMITTED,
// the two alternating in rounds. It was written when claims read their runs with locks: under
// REPEATABLE READ a claim whose scan reached the end of the index (a relay that keeps up) locked the
// gap after the last pending row, where every new event goes, so inserts waited for claims to commit.
// Claims now lock rows by primary key only (docs/relay.md), and the two levels should differ little.
//
//	go test -run '^$' -bench BenchmarkInsertDuringClaims -benchtime 2000x
func BenchmarkInsertDuringClaims(b *testing.B) {
	d := mariaDB(b)
	db := openDB(b, d, &gorm.Config{Logger: logger.Discard})
	resetTables(b, db, &outboxplugin.OutboxEvent{}, &BenchUser{})
	if err := db.Use(outboxplugin.New()); err != nil {
		b.Fatal(err)
	}
	levels := []struct {
		name  string
		level sql.IsolationLevel
	}{{"repeatable-read", sql.LevelRepeatableRead}, {"read-committed", sql.LevelReadCommitted}}
	latencies := make([][]time.Duration, len(levels))
	claimErrors := make([]int, len(levels)) // deadlocks with the inserts: the worker retries them
	const round = 200
	b.ResetTimer()
	for done := 0; done < b.N; {
		for k, lv := range levels {
			b.StopTimer()
			// No backlog: the worker keeps up, its claims come back short, and their scan reaches the
			// end of the index — the steady state of a relay, and the case of the gap lock.
			w, err := outboxplugin.NewWorker(db, noopPublisher, outboxplugin.WithLogger(quietLogger), outboxplugin.WithoutListen())
			if err != nil {
				b.Fatal(err)
			}
			outboxplugin.UseClaimIsolation(w, lv.level)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if _, err := w.ProcessOnce(ctx); err != nil && ctx.Err() == nil {
						claimErrors[k]++
					}
				}
			}()
			b.StartTimer()
			for i := 0; i < round; i++ {
				start := time.Now()
				if err := db.Create(&BenchUser{Name: "during a claim"}).Error; err != nil {
					b.Fatal(err)
				}
				latencies[k] = append(latencies[k], time.Since(start))
			}
			b.StopTimer()
			cancel()
			wg.Wait()
			if err := db.Exec("DELETE FROM outbox_events").Error; err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		done += round
	}
	b.StopTimer()
	pct := func(l []time.Duration, p float64) time.Duration {
		s := slices.Clone(l)
		slices.Sort(s)
		return s[int(float64(len(s)-1)*p)]
	}
	for k, lv := range levels {
		b.ReportMetric(float64(pct(latencies[k], 0.5).Microseconds()), lv.name+"-p50-µs")
		b.ReportMetric(float64(pct(latencies[k], 0.99).Microseconds()), lv.name+"-p99-µs")
		b.ReportMetric(float64(claimErrors[k]), lv.name+"-claim-errors")
	}
	b.ReportMetric(float64(pct(latencies[1], 0.5))/float64(pct(latencies[0], 0.5)), "p50-rc/rr")
	b.ReportMetric(float64(pct(latencies[1], 0.99))/float64(pct(latencies[0], 0.99)), "p99-rc/rr")
}
