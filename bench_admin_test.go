package outboxplugin_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
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

// BenchmarkTableHealth measures what the table health part costs Stats: Admin.TableHealth alone (the
// reads Stats adds), beside a whole Stats, on a table of 10 000 events, plain and (PostgreSQL,
// MariaDB) partitioned by day into 30 partitions and a default one. The figures are catalog reads, so
// they do not grow with the rows; they grow with the partitions.
//
//	go test -run '^$' -bench BenchmarkTableHealth -benchtime 200x
func BenchmarkTableHealth(b *testing.B) {
	for _, d := range relayDialects() {
		for _, partitioned := range []bool{false, true} {
			if partitioned && d.server() == "sqlite" {
				continue
			}
			name := d.name + "/plain"
			if partitioned {
				name = d.name + "/partitioned"
			}
			b.Run(name, func(b *testing.B) {
				db := openDB(b, d, &gorm.Config{Logger: logger.Discard})
				table := benchHealthTable(b, db, d, partitioned)
				admin, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable(table))
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				h, err := admin.TableHealth(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if len(h.Unread) > 0 || (partitioned && len(h.Partitions) != 31) {
					b.Fatalf("fixture: %d partitions, unread %v", len(h.Partitions), h.Unread)
				}
				var health, stats time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					start := time.Now()
					if _, err := admin.TableHealth(ctx); err != nil {
						b.Fatal(err)
					}
					health += time.Since(start)
					start = time.Now()
					if _, err := admin.Stats(ctx); err != nil {
						b.Fatal(err)
					}
					stats += time.Since(start)
				}
				b.StopTimer()
				b.ReportMetric(float64(health.Microseconds())/1000/float64(b.N), "health-ms")
				b.ReportMetric(float64(stats.Microseconds())/1000/float64(b.N), "stats-ms")
			})
		}
	}
}

// benchHealthTable creates an outbox table of the benchmark's own with 10 000 events, 9 000 of them
// processed, created over the last 30 days; partitioned, one partition per day and a default one. It
// is dropped when the benchmark ends.
func benchHealthTable(b *testing.B, db *gorm.DB, d dialect, partitioned bool) string {
	b.Helper()
	table := "bench_health_" + runToken()
	stmts, err := outboxplugin.SchemaSQL(d.server(), table)
	if err != nil {
		b.Fatal(err)
	}
	day := time.Now().UTC().Truncate(24 * time.Hour)
	var parts []string
	for i := -29; i <= 1; i++ {
		from := day.AddDate(0, 0, i)
		parts = append(parts, fmt.Sprintf("PARTITION p%s VALUES LESS THAN ('%s')", from.Format("20060102"), from.AddDate(0, 0, 1).Format("2006-01-02 15:04:05")))
	}
	for _, s := range stmts {
		if partitioned && strings.HasPrefix(s, "ALTER TABLE") {
			continue
		}
		if partitioned && strings.HasPrefix(s, "CREATE TABLE") {
			s = strings.Replace(s, "PRIMARY KEY (id)", "PRIMARY KEY (id, created_at)", 1)
			if d.server() == "postgres" {
				s += " PARTITION BY RANGE (created_at)"
			} else {
				s += " PARTITION BY RANGE COLUMNS(created_at) (" + strings.Join(parts[:30], ", ") + ", PARTITION pmax VALUES LESS THAN (MAXVALUE))"
			}
		}
		if err := db.Exec(s).Error; err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { db.Exec("DROP TABLE " + table) })
	if partitioned && d.server() == "postgres" {
		for i := -29; i <= 0; i++ {
			from := day.AddDate(0, 0, i)
			if err := db.Exec(fmt.Sprintf("CREATE TABLE %s_p%s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')", table, from.Format("20060102"),
				table, from.Format(time.RFC3339), from.AddDate(0, 0, 1).Format(time.RFC3339))).Error; err != nil {
				b.Fatal(err)
			}
		}
		if err := db.Exec("CREATE TABLE " + table + "_default PARTITION OF " + table + " DEFAULT").Error; err != nil {
			b.Fatal(err)
		}
	}
	const n = 10000
	for from := 0; from < n; from += 500 {
		var (
			values []string
			args   []any
		)
		for i := from; i < from+500; i++ {
			values = append(values, "(?, ?, ?, ?, ?)")
			args = append(args, fmt.Sprintf("%s-%d", runToken(), i), "Bench_create", `{"n":1}`,
				day.Add(-time.Duration(n-i)*(30*24*time.Hour/n)), i < n-1000)
		}
		if err := db.Exec("INSERT INTO "+table+" (message_id, event_type, payload, created_at, processed) VALUES "+strings.Join(values, ", "), args...).Error; err != nil {
			b.Fatal(err)
		}
	}
	switch d.server() {
	case "postgres":
		db.Exec("VACUUM ANALYZE " + table)
	case "mysql":
		db.Exec("ANALYZE TABLE " + table)
	}
	return table
}
