package outboxplugin_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// BenchmarkAdminAtScale measures the Admin's reads on a table that keeps many processed rows
// (OUTBOX_BENCH_KEPT, default 1 000 000; the documented figures use 10 000 000), created over the last
// seven days (OUTBOX_BENCH_KEEP_TABLE=1 leaves the table in place afterwards, to look at), beside 1 000 pending and 100 dead events: Stats, the first page of every state, a page
// of processed events of one type, and one processed event by its message id. ms/op per operation.
//
//	OUTBOX_BENCH_KEPT=10000000 go test -run '^$' -bench BenchmarkAdminAtScale -benchtime 20x -timeout 60m
func BenchmarkAdminAtScale(b *testing.B) {
	kept := benchKept(b)
	for _, d := range relayDialects() {
		if d.name == "sqlite" {
			continue // no targets there; a 10-million-row SQLite outbox is not what it is for
		}
		b.Run(d.name, func(b *testing.B) {
			db := openDB(b, d, &gorm.Config{Logger: logger.Discard})
			resetTables(b, db, &outboxplugin.OutboxEvent{})
			if err := outboxplugin.AutoMigrate(db); err != nil {
				b.Fatal(err)
			}
			fillKept(b, db, d, kept)
			fillOutbox(b, db, d, outboxplugin.DefaultTableName, 1100, false)
			rows := db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{})
			var deadIDs []int64
			if err := rows.Where("processed = false").Order("id").Limit(100).Pluck("id", &deadIDs).Error; err != nil {
				b.Fatal(err)
			}
			if err := db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id IN ?", deadIDs).
				Updates(map[string]any{"dead_at": time.Now().UTC(), "attempts": 10, "last_error": "refused"}).Error; err != nil {
				b.Fatal(err)
			}
			// One event written as the plugin writes them, then processed: found by its UUIDv7.
			var one outboxplugin.OutboxEvent
			if err := db.Transaction(func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Lookup", map[string]int{"n": 1})
			}); err != nil {
				b.Fatal(err)
			}
			if err := db.Where("event_type = ?", "Lookup").First(&one).Error; err != nil {
				b.Fatal(err)
			}
			if err := db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", one.ID).Updates(map[string]any{"processed": true, "processed_at": time.Now().UTC()}).Error; err != nil {
				b.Fatal(err)
			}
			switch d.name {
			case "postgres":
				db.Exec("VACUUM ANALYZE " + outboxplugin.DefaultTableName)
			case "mysql":
				db.Exec("ANALYZE TABLE " + outboxplugin.DefaultTableName)
			}
			admin, err := outboxplugin.NewAdmin(db)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			ops := []struct {
				name string
				run  func() error
			}{
				{"stats", func() error { _, err := admin.Stats(ctx); return err }},
				{"list-all", func() error { _, err := admin.ListEvents(ctx, outboxplugin.EventFilter{}); return err }},
				{"list-pending", func() error {
					_, err := admin.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StatePending})
					return err
				}},
				{"list-dead", func() error {
					_, err := admin.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StateDead})
					return err
				}},
				{"list-processed-type", func() error {
					_, err := admin.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StateProcessed, EventType: "Bench_create", Limit: 100})
					return err
				}},
				{"event", func() error { _, err := admin.Event(ctx, one.MessageID); return err }},
				{"dead-groups", func() error { _, _, err := admin.DeadGroups(ctx, 0); return err }},
				// The console's chart: 15 one-minute intervals (about 1 000 rows each here), and
				// 15 one-hour ones, where every interval reaches ActivityIntervalLimit: the worst case.
				{"activity", func() error { _, err := admin.Activity(ctx, 15, time.Minute); return err }},
				{"activity-capped", func() error { _, err := admin.Activity(ctx, 15, time.Hour); return err }},
			}
			st, err := admin.Stats(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if st.Pending != 1000 || st.Dead != 100 {
				b.Fatalf("fixture: %d pending and %d dead, want 1000 and 100", st.Pending, st.Dead)
			}
			b.Logf("%s: Stats says %d processed (approximate: %v) of %d kept", d.name, st.Processed, st.ProcessedApproximate, kept+1)
			spent := make([]time.Duration, len(ops))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for k, op := range ops {
					start := time.Now()
					if err := op.run(); err != nil {
						b.Fatalf("%s: %v", op.name, err)
					}
					spent[k] += time.Since(start)
				}
			}
			b.StopTimer()
			for k, op := range ops {
				b.ReportMetric(float64(spent[k].Microseconds())/1000/float64(b.N), op.name+"-ms")
			}
			if os.Getenv("OUTBOX_BENCH_KEEP_TABLE") == "" {
				resetTables(b, db, &outboxplugin.OutboxEvent{})
			}
		})
	}
}

// benchKept is how many processed rows the Admin benchmarks keep: OUTBOX_BENCH_KEPT, default 1 000 000.
func benchKept(b *testing.B) int {
	v := os.Getenv("OUTBOX_BENCH_KEPT")
	if v == "" {
		return 1000000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("OUTBOX_BENCH_KEPT=%q: want a count of rows", v)
	}
	return n
}

// fillKept inserts n processed events created over the last seven days, oldest first.
func fillKept(b *testing.B, db *gorm.DB, d dialect, n int) {
	b.Helper()
	step := (7 * 24 * time.Hour / time.Duration(n)).Microseconds()
	switch d.name {
	case "postgres":
		q := `INSERT INTO outbox_events (message_id, event_type, aggregate_type, aggregate_id, payload, created_at, processed, processed_at)
			SELECT md5(g::text)::uuid::text, 'Bench_create', 'Bench', g::text, jsonb_build_object('id', g),
			       now() - interval '1 microsecond' * ((? - g)::float8 * ?), true, now()
			FROM generate_series(1, ?) g`
		if err := db.Exec(q, n, step, n).Error; err != nil {
			b.Fatal(err)
		}
	case "mysql":
		// At most 999 999 rows per statement (six cross-joined digits).
		for from := 0; from < n; from += 999999 {
			count := min(999999, n-from)
			q := `INSERT INTO outbox_events (message_id, event_type, aggregate_type, aggregate_id, payload, created_at, processed, processed_at)
				WITH d(x) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
				              UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9),
				     g(n) AS (SELECT 1 + a.x + 10*b.x + 100*c.x + 1000*e.x + 10000*f.x + 100000*h.x
				              FROM d a, d b, d c, d e, d f, d h)
				SELECT uuid(), 'Bench_create', 'Bench', n + ?, JSON_OBJECT('id', n + ?),
				       UTC_TIMESTAMP(6) - INTERVAL (? - n - ?) * ? MICROSECOND, true, UTC_TIMESTAMP(6)
				FROM g WHERE n <= ? ORDER BY n`
			if err := db.Exec(q, from, from, n, from, step, count).Error; err != nil {
				b.Fatal(err)
			}
		}
	}
}
