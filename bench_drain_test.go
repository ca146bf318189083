package outboxplugin_test

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// BenchmarkDrainAfterOutage measures one worker draining 100 000 events in three states, alternating:
// fresh; as a broker outage leaves them (every event tried and not delivered: last_error set, the
// attempt given back); and refused once by the broker (attempts 1, due again). Before, events that
// had failed once were published one per call, so the backlog of an outage drained at one broker
// round trip per event; the target is at least 0.8 of the fresh rate.
//
//	go test -run '^$' -bench BenchmarkDrainAfterOutage -benchtime 3x -timeout 30m
func BenchmarkDrainAfterOutage(b *testing.B) {
	const events = 100000
	for _, d := range relayDialects() {
		b.Run(d.name, func(b *testing.B) {
			db := openDB(b, d, &gorm.Config{Logger: logger.Discard})
			states := []struct {
				name string
				set  string // how the failed deliveries left the rows
			}{
				{"fresh", ""},
				{"after-outage", `UPDATE outbox_events SET last_error = 'dial tcp: connection refused'`},
				{"refused-once", `UPDATE outbox_events SET attempts = 1, last_error = 'nack', next_attempt_at = ?`},
			}
			spent := make([]time.Duration, len(states))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range states {
					k := (i + j) % len(states)
					b.StopTimer()
					resetTables(b, db, &outboxplugin.OutboxEvent{})
					if err := outboxplugin.AutoMigrate(db); err != nil {
						b.Fatal(err)
					}
					fillOutbox(b, db, d, "outbox_events", events, false)
					if set := states[k].set; set != "" {
						var args []any
						if k == 2 {
							args = append(args, time.Now().UTC().Add(-time.Minute))
						}
						if err := db.Exec(set, args...).Error; err != nil {
							b.Fatal(err)
						}
					}
					if d.name == "postgres" {
						if err := db.Exec("VACUUM ANALYZE outbox_events").Error; err != nil {
							b.Fatal(err)
						}
						if err := db.Exec("CHECKPOINT").Error; err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
					start := time.Now()
					drainWithWorkers(b, db, 1, events)
					spent[k] += time.Since(start)
				}
			}
			b.StopTimer()
			rate := func(k int) float64 { return float64(events*b.N) / spent[k].Seconds() }
			for k, s := range states {
				b.ReportMetric(rate(k), s.name+"-ev/s")
			}
			b.ReportMetric(rate(1)/rate(0), "after-outage/fresh")
			b.ReportMetric(rate(2)/rate(0), "refused-once/fresh")
		})
	}
}
