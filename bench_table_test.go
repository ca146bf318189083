package outboxplugin_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// BenchmarkRelayGormTable drains 100 000 pre-inserted events from a table made by GORM's own
// db.AutoMigrate(&outboxplugin.OutboxEvent{}) and from one made by outboxplugin.AutoMigrate, with one
// worker and with two. Each round runs every variant once on a fresh table, in rotating order; the
// ratios gorm/migrated are the figures to read (the cost TableWarning's storage settings warning
// quotes on PostgreSQL; on MySQL and MariaDB the two tables are the same, and on SQLite they differ by
// the dead index only, which no claim reads).
//
//	go test -run '^$' -bench BenchmarkRelayGormTable -benchtime 4x -timeout 60m
func BenchmarkRelayGormTable(b *testing.B) {
	const events = 100000
	for _, d := range relayDialects() {
		b.Run(d.name, func(b *testing.B) {
			db := openDB(b, d, &gorm.Config{Logger: logger.Discard})
			variants := []struct {
				name    string
				migrate bool // outboxplugin.AutoMigrate after GORM's own
				workers int
			}{
				{"migrated1", true, 1},
				{"gorm1", false, 1},
				{"migrated2", true, 2},
				{"gorm2", false, 2},
			}
			spent := make([]time.Duration, len(variants))
			errorsBefore := relayErrors.Load()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range variants {
					k := (i + j) % len(variants)
					v := variants[k]
					b.StopTimer()
					resetTables(b, db, &outboxplugin.OutboxEvent{}) // GORM's own AutoMigrate
					if v.migrate {
						if err := outboxplugin.AutoMigrate(db); err != nil {
							b.Fatal(err)
						}
					}
					fillOutbox(b, db, d, outboxplugin.DefaultTableName, events, false)
					if d.name == "postgres" {
						// Every variant starts from clean shared buffers (see BenchmarkRelayThroughput).
						if err := db.Exec("CHECKPOINT").Error; err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
					start := time.Now()
					drainWithWorkers(b, db, v.workers, events)
					spent[k] += time.Since(start)
				}
			}
			b.StopTimer()
			rate := func(k int) float64 { return float64(events*b.N) / spent[k].Seconds() }
			for k, v := range variants {
				b.ReportMetric(rate(k), v.name+"-ev/s")
			}
			b.ReportMetric(rate(1)/rate(0), "gorm1/migrated1")
			b.ReportMetric(rate(3)/rate(2), "gorm2/migrated2")
			b.ReportMetric(float64(relayErrors.Load()-errorsBefore), "worker-errors")
		})
	}
}

// BenchmarkAdminGormTable measures the Admin's reads of dead events (Stats, the first page of dead
// events, the dead groups), and CheckTable, on a table made by GORM's own AutoMigrate, which has no dead index, and on
// one made by outboxplugin.AutoMigrate, which has it (PostgreSQL and SQLite; MySQL and MariaDB get no
// dead index from either). Both keep OUTBOX_BENCH_KEPT processed rows (default 1 000 000) beside 1 000
// pending and 100 dead events; the operations alternate between the two tables. ms/op per operation
// and table, and the ratios without/with.
//
//	go test -run '^$' -bench BenchmarkAdminGormTable -benchtime 10x -timeout 60m
func BenchmarkAdminGormTable(b *testing.B) {
	kept := benchKept(b)
	for _, d := range relayDialects() {
		if d.server() == "mysql" {
			continue // the same table either way
		}
		b.Run(d.name, func(b *testing.B) {
			db := openDB(b, d, &gorm.Config{Logger: logger.Discard})
			const gormTable, migratedTable = "outbox_admin_gorm", "outbox_admin_migrated"
			admins := map[string]*outboxplugin.Admin{}
			for _, table := range []string{gormTable, migratedTable} {
				plain := db.Session(&gorm.Session{NewDB: true})
				if err := plain.Migrator().DropTable(table); err != nil {
					b.Fatal(err)
				}
				if err := plain.Table(table).AutoMigrate(&outboxplugin.OutboxEvent{}); err != nil {
					b.Fatal(err)
				}
				if table == migratedTable {
					if err := outboxplugin.AutoMigrate(plain.Table(table)); err != nil {
						b.Fatal(err)
					}
				}
				fillOutbox(b, db, d, table, kept, true)
				fillOutbox(b, db, d, table, 1100, false)
				if err := db.Exec(`UPDATE `+table+` SET dead_at = ?, attempts = 10, last_error = 'refused' WHERE id IN (SELECT id FROM (SELECT id FROM `+
					table+` WHERE processed = false ORDER BY id LIMIT 100) x)`, time.Now().UTC()).Error; err != nil {
					b.Fatal(err)
				}
				if d.name == "postgres" {
					if err := db.Exec("VACUUM ANALYZE " + table).Error; err != nil {
						b.Fatal(err)
					}
				}
				admin, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable(table))
				if err != nil {
					b.Fatal(err)
				}
				admins[table] = admin
				b.Cleanup(func() {
					if err := db.Session(&gorm.Session{NewDB: true}).Migrator().DropTable(table); err != nil {
						b.Error(err)
					}
				})
			}
			ctx := context.Background()
			ops := []struct {
				name string
				run  func(a *outboxplugin.Admin) error
			}{
				{"stats", func(a *outboxplugin.Admin) error {
					st, err := a.Stats(ctx)
					if err == nil && st.Dead != 100 {
						b.Fatalf("fixture: %d dead, want 100", st.Dead)
					}
					return err
				}},
				{"list-dead", func(a *outboxplugin.Admin) error {
					_, err := a.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StateDead})
					return err
				}},
				{"dead-groups", func(a *outboxplugin.Admin) error { _, _, err := a.DeadGroups(ctx, 0); return err }},
				// What the table warnings add to Stats: catalog reads, the same on either table.
				{"check-table", func(a *outboxplugin.Admin) error { _, err := a.CheckTable(ctx); return err }},
			}
			spent := map[string][]time.Duration{gormTable: make([]time.Duration, len(ops)), migratedTable: make([]time.Duration, len(ops))}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for k, op := range ops {
					order := []string{migratedTable, gormTable}
					if i%2 == 1 {
						order[0], order[1] = order[1], order[0]
					}
					for _, table := range order {
						start := time.Now()
						if err := op.run(admins[table]); err != nil {
							b.Fatalf("%s of %s: %v", op.name, table, err)
						}
						spent[table][k] += time.Since(start)
					}
				}
			}
			b.StopTimer()
			ms := func(table string, k int) float64 {
				return float64(spent[table][k].Microseconds()) / 1000 / float64(b.N)
			}
			for k, op := range ops {
				b.ReportMetric(ms(gormTable, k), op.name+"-ms-gorm")
				b.ReportMetric(ms(migratedTable, k), op.name+"-ms-migrated")
				b.ReportMetric(ms(gormTable, k)/ms(migratedTable, k), op.name+"-gorm/migrated")
			}
		})
	}
}

// BenchmarkWriteGormTable measures the write path (a transaction creating 100 rows, with their 100
// events written by the plugin) into three outbox tables: one made by outboxplugin.AutoMigrate, one
// made by GORM's own db.AutoMigrate (no storage settings on PostgreSQL), and one made by
// outboxplugin.AutoMigrate that also has the pending index (created_at, id) of earlier versions, as a
// table upgraded by GORM's own AutoMigrate keeps it. The variants run interleaved, in rotating order;
// the ratios against the migrated table are the figures to read.
//
//	go test -run '^$' -bench BenchmarkWriteGormTable -benchtime 300x -timeout 30m
func BenchmarkWriteGormTable(b *testing.B) {
	for _, d := range relayDialects() {
		b.Run(d.name, func(b *testing.B) {
			variants := []struct {
				name, table string
				db          *gorm.DB
			}{
				{name: "migrated", table: "outbox_write_migrated"},
				{name: "gorm", table: "outbox_write_gorm"},
				{name: "pending", table: "outbox_write_pending"},
			}
			for i := range variants {
				v := &variants[i]
				v.db = openDB(b, d, &gorm.Config{Logger: logger.Discard}) // on SQLite, a file of its own
				plain := v.db.Session(&gorm.Session{NewDB: true})
				if err := plain.Migrator().DropTable(v.table); err != nil {
					b.Fatal(err)
				}
				if err := plain.AutoMigrate(&BenchUser{}); err != nil {
					b.Fatal(err)
				}
				if err := plain.Table(v.table).AutoMigrate(&outboxplugin.OutboxEvent{}); err != nil {
					b.Fatal(err)
				}
				if v.name != "gorm" {
					if err := outboxplugin.AutoMigrate(plain.Table(v.table)); err != nil {
						b.Fatal(err)
					}
				}
				if v.name == "pending" {
					if err := plain.Exec(`CREATE INDEX idx_` + v.table + `_pending ON ` + v.table + ` (created_at, id)`).Error; err != nil {
						b.Fatal(err)
					}
				}
				if err := v.db.Use(outboxplugin.New(outboxplugin.WithTableName(v.table), outboxplugin.WithoutNotify())); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() {
					if err := plain.Migrator().DropTable(v.table); err != nil {
						b.Error(err)
					}
				})
			}
			users := make([]BenchUser, 100)
			write := func(db *gorm.DB) {
				for i := range users {
					users[i] = BenchUser{Name: "bench", Email: "bench@example.com", Age: i}
				}
				if err := db.Transaction(func(tx *gorm.DB) error { return tx.Create(&users).Error }); err != nil {
					b.Fatal(err)
				}
			}
			for _, v := range variants { // warm up connections and statement caches
				write(v.db)
			}
			spent := make([]time.Duration, len(variants))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range variants {
					k := (i + j) % len(variants)
					start := time.Now()
					write(variants[k].db)
					spent[k] += time.Since(start)
				}
			}
			b.StopTimer()
			perOp := func(k int) float64 { return float64(spent[k].Microseconds()) / float64(b.N) }
			for k, v := range variants {
				b.ReportMetric(perOp(k), v.name+"-µs/op")
			}
			b.ReportMetric(perOp(1)/perOp(0), "gorm/migrated")
			b.ReportMetric(perOp(2)/perOp(0), "pending/migrated")
		})
	}
}
