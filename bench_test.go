package outboxplugin_test

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
)

// BenchUser is a typical business row.
type BenchUser struct {
	ID        uint
	Name      string `gorm:"size:64"`
	Email     string `gorm:"size:128"`
	Age       int
	CreatedAt time.Time
	UpdatedAt time.Time
}

// writeVariant is one way of writing the same business change.
type writeVariant struct {
	name  string
	db    *gorm.DB
	write func(tx *gorm.DB, users []BenchUser) error
	// update changes the 100 seeded rows by a condition; nil: the variant has no update shape.
	update func(tx *gorm.DB) error
}

// BenchTally is the table of the update-by-condition shape: benchUpdateRows rows tagged "hot" among
// ten thousand, found through an index, as a service's update by condition finds its rows.
type BenchTally struct {
	ID    uint
	Tag   string `gorm:"size:16;index"`
	Count int
}

// benchUpdateRows is how many rows the update-by-condition shape changes.
const benchUpdateRows = 100

func seedTallies(b *testing.B, db *gorm.DB) {
	b.Helper()
	rows := make([]BenchTally, 10000)
	for i := range rows {
		rows[i] = BenchTally{Tag: fmt.Sprintf("cold%d", i%97)}
		if i%(len(rows)/benchUpdateRows) == 0 {
			rows[i].Tag = "hot"
		}
	}
	if err := db.CreateInBatches(&rows, 1000).Error; err != nil {
		b.Fatal(err)
	}
}

func updateByCondition(tx *gorm.DB) error {
	return tx.Model(&BenchTally{}).Where("tag = ?", "hot").Update("count", gorm.Expr("count + 1")).Error
}

// updateWithHandWrittenOutbox is the same update in an application without the plugin: lock and list
// the rows, update them, write their outbox rows.
func updateWithHandWrittenOutbox(tx *gorm.DB) error {
	var ids []uint
	if err := tx.Model(&BenchTally{}).Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).
		Where("tag = ?", "hot").Pluck("id", &ids).Error; err != nil {
		return err
	}
	if err := tx.Model(&BenchTally{}).Where("id IN ?", ids).Update("count", gorm.Expr("count + 1")).Error; err != nil {
		return err
	}
	rows := make([]outboxplugin.OutboxEvent, len(ids))
	for i, id := range ids {
		s := strconv.FormatUint(uint64(id), 10)
		rows[i] = outboxplugin.OutboxEvent{
			EventType: "BenchTally_update", AggregateType: "BenchTally", AggregateID: s,
			Payload: outboxplugin.JSON(`{"id":` + s + `}`),
		}
	}
	return tx.Create(&rows).Error
}

func createOnly(tx *gorm.DB, users []BenchUser) error {
	if len(users) == 1 {
		return tx.Create(&users[0]).Error
	}
	return tx.Create(&users).Error
}

// createWithHandWrittenOutbox is what an application does without the plugin: it adds the outbox
// rows itself with GORM's Create, in the same transaction.
func createWithHandWrittenOutbox(tx *gorm.DB, users []BenchUser) error {
	if err := createOnly(tx, users); err != nil {
		return err
	}
	rows := make([]outboxplugin.OutboxEvent, len(users))
	for i, u := range users {
		id := strconv.FormatUint(uint64(u.ID), 10)
		rows[i] = outboxplugin.OutboxEvent{
			EventType: "BenchUser_create", AggregateType: "BenchUser", AggregateID: id,
			Payload: outboxplugin.JSON(`{"id":` + id + `}`),
		}
	}
	if len(rows) == 1 {
		return tx.Create(&rows[0]).Error
	}
	return tx.Create(&rows).Error
}

// createWithRawOutboxInsert is the floor of any outbox written by a statement of its own: the create,
// then one hand-built multi-row INSERT of the outbox rows on the transaction's connection, with no
// GORM and no capture around it.
func createWithRawOutboxInsert(tx *gorm.DB, users []BenchUser) error {
	if err := createOnly(tx, users); err != nil {
		return err
	}
	pg := tx.Dialector.Name() == "postgres"
	var q strings.Builder
	q.WriteString("INSERT INTO outbox_events (message_id, event_type, aggregate_type, aggregate_id, payload, created_at) VALUES ")
	args := make([]any, 0, 6*len(users))
	for i, u := range users {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteByte('(')
		for c := range 6 {
			if c > 0 {
				q.WriteByte(',')
			}
			if pg {
				fmt.Fprintf(&q, "$%d", len(args)+c+1)
			} else {
				q.WriteByte('?')
			}
		}
		q.WriteByte(')')
		id := strconv.FormatUint(uint64(u.ID), 10)
		args = append(args, fmt.Sprintf("bench-%d-%s", time.Now().UnixNano(), id), "BenchUser_create", "BenchUser", id, `{"id":`+id+`}`, time.Now().UTC())
	}
	_, err := tx.Statement.ConnPool.ExecContext(tx.Statement.Context, q.String(), args...)
	return err
}

// BenchmarkWritePath measures the cost the plugin adds to a write, on each database: plain GORM, GORM
// with the plugin, and GORM with outbox rows written by hand, for one Create in a transaction, a
// 100-row Create, an update by condition of 100 rows (update100), and a service's transaction of ten
// statements (service: serviceTransaction); plugin_row is the plugin with PayloadRow. The variants run interleaved, in rotating order, in the same loop, so that drift
// on a shared machine hits them alike; the reported ratios (plugin/plain, handwritten/plain) are
// the figures to read.
//
//	go test -run '^$' -bench BenchmarkWritePath -benchtime 300x
func BenchmarkWritePath(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.name, func(b *testing.B) {
			plain, withPlugin := openBenchPair(b, d, "")
			resetTables(b, plain, &BenchUser{}, &BenchTally{}, &outboxplugin.OutboxEvent{})
			// The table as an application runs it: with the storage settings AutoMigrate (or the
			// first run of a worker) gives it.
			if err := outboxplugin.AutoMigrate(withPlugin); err != nil {
				b.Fatal(err)
			}
			variants := []writeVariant{
				{"plain", plain, createOnly, updateByCondition},
				{"plugin", withPlugin, createOnly, updateByCondition},
				{"handwritten", plain, createWithHandWrittenOutbox, updateWithHandWrittenOutbox},
				{"raw_floor", plain, createWithRawOutboxInsert, nil},
				// Payloads of the stored row, read back in the write (RETURNING) or after it by key.
				{"plugin_row", pluginDB(b, d, plain, nil, outboxplugin.WithPayloadMode(outboxplugin.PayloadRow)), createOnly, updateByCondition},
			}
			if d.name != "sqlite" {
				// An outbox whose reference index (processed, created_at) covers every row: on
				// PostgreSQL instead of the processed ones only, on MySQL and MariaDB as earlier
				// versions made it (there is none now).
				variants = append(variants, writeVariant{"plugin_fullindex", openFullIndexOutbox(b, d), createOnly, nil})
			}
			if d.name == "postgres" {
				// The default on PostgreSQL is unnest; compare with the plain multi-row VALUES.
				_, withValues := openBenchPair(b, d, "values")
				variants = append(variants, writeVariant{"plugin_values", withValues, createOnly, nil})
				// The cost of the wake-up notification the plugin sends by default on PostgreSQL.
				_, withoutNotify := openBenchPair(b, d, "", outboxplugin.WithoutNotify())
				variants = append(variants, writeVariant{"plugin_nonotify", withoutNotify, createOnly, nil})
				// The outbox INSERT in a round trip of its own before the COMMIT, on *sql.Tx, as
				// before the commit carried it.
				variants = append(variants, writeVariant{"plugin_sqltx", pluginDB(b, d, plain, outboxplugin.UseSeparateCommit), createOnly, updateByCondition})
			}
			for _, rows := range []int{1, 100} {
				name := "single"
				if rows > 1 {
					name = fmt.Sprintf("batch%d", rows)
				}
				b.Run(name, func(b *testing.B) { runInterleaved(b, variants, rows, false) })
			}
			seedTallies(b, plain)
			var updaters []writeVariant
			for _, v := range variants {
				if v.update != nil {
					updaters = append(updaters, v)
				}
			}
			b.Run(fmt.Sprintf("update%d", benchUpdateRows), func(b *testing.B) { runInterleaved(b, updaters, 0, true) })

			// A service's transaction of ten statements: the plugin as registered (its events held
			// and written in one INSERT at commit) against an INSERT after each statement.
			service := func(tx *gorm.DB, _ []BenchUser) error { return serviceTransaction(tx, "svc") }
			perStatement := pluginDB(b, d, plain, outboxplugin.UsePerStatementInserts)
			services := []writeVariant{
				{"plain", plain, service, nil},
				{"plugin", withPlugin, service, nil},
				{"plugin_per_statement", perStatement, service, nil},
			}
			if d.name == "postgres" {
				services = append(services,
					writeVariant{"plugin_nonotify", pluginDB(b, d, plain, nil, outboxplugin.WithoutNotify()), service, nil},
					writeVariant{"plugin_intx_notify", pluginDB(b, d, plain, outboxplugin.UseNotifyInTransaction), service, nil},
					writeVariant{"plugin_sqltx", pluginDB(b, d, plain, outboxplugin.UseSeparateCommit), service, nil})
			}
			b.Run("service", func(b *testing.B) { runInterleaved(b, services, 0, false) })
		})
	}
}

// pluginDB opens another *gorm.DB on plain's pool with the plugin registered, configured by configure
// (an export_test.go hook) when not nil.
func pluginDB(b *testing.B, d dialect, plain *gorm.DB, configure func(*outboxplugin.Plugin), opts ...outboxplugin.Option) *gorm.DB {
	b.Helper()
	sqlDB, err := plain.DB()
	if err != nil {
		b.Fatal(err)
	}
	cfg := &gorm.Config{Logger: logger.Discard}
	var db *gorm.DB
	if d.name == "sqlite" {
		db, err = gorm.Open(&sqlite.Dialector{Conn: sqlDB}, cfg)
	} else {
		db, err = d.open(sqlDB, cfg)
	}
	if err != nil {
		b.Fatal(err)
	}
	p := outboxplugin.New(opts...)
	if configure != nil {
		configure(p)
	}
	if err := db.Use(p); err != nil {
		b.Fatal(err)
	}
	return db
}

func runInterleaved(b *testing.B, variants []writeVariant, rows int, update bool) {
	spent := make([]time.Duration, len(variants))
	users := make([]BenchUser, rows)
	op := func(v writeVariant) {
		for i := range users {
			users[i] = BenchUser{Name: "bench", Email: "bench@example.com", Age: i}
		}
		err := v.db.Transaction(func(tx *gorm.DB) error {
			if update {
				return v.update(tx)
			}
			return v.write(tx, users)
		})
		if err != nil {
			b.Fatalf("%s: %v", v.name, err)
		}
	}
	for _, v := range variants { // warm up connections and statement caches
		op(v)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range variants {
			k := (i + j) % len(variants)
			start := time.Now()
			op(variants[k])
			spent[k] += time.Since(start)
		}
	}
	b.StopTimer()
	perOp := func(k int) float64 { return float64(spent[k].Nanoseconds()) / float64(b.N) }
	for k, v := range variants {
		b.ReportMetric(perOp(k)/1e3, v.name+"-µs/op")
	}
	for k, v := range variants[1:] {
		b.ReportMetric(perOp(k+1)/perOp(0), v.name+"/plain")
	}
}

// openFullIndexOutbox opens the database with a plugin writing to outbox_events_fullindex, whose
// (processed, created_at) index is not partial (PostgreSQL), or is there at all (MySQL, MariaDB).
func openFullIndexOutbox(b *testing.B, d dialect) *gorm.DB {
	b.Helper()
	db := openDB(b, d, &gorm.Config{Logger: logger.Discard})
	const table = "outbox_events_fullindex"
	if err := db.Use(outboxplugin.New(outboxplugin.WithTableName(table), outboxplugin.WithoutNotify())); err != nil {
		b.Fatal(err)
	}
	for _, stmt := range []string{
		"DROP TABLE IF EXISTS " + table,
	} {
		if err := db.Exec(stmt).Error; err != nil {
			b.Fatal(err)
		}
	}
	if err := outboxplugin.AutoMigrate(db); err != nil {
		b.Fatal(err)
	}
	stmts := []string{
		"DROP INDEX idx_outbox_events_fullindex_processed_created_at",
		"CREATE INDEX idx_outbox_events_fullindex_processed_created_at ON " + table + " (processed, created_at)",
	}
	if d.server() == "mysql" {
		stmts = stmts[1:]
	}
	for _, stmt := range stmts {
		if err := db.Exec(stmt).Error; err != nil {
			b.Fatal(err)
		}
	}
	return db
}

// openBenchPair opens two *gorm.DB on the same database, one without and one with the plugin
// (writing with the named insert strategy, or the dialect's default when empty).
func openBenchPair(b *testing.B, d dialect, strategy string, opts ...outboxplugin.Option) (plain, withPlugin *gorm.DB) {
	b.Helper()
	cfg := func() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }
	if d.name == "sqlite" {
		dsn := "file:" + filepath.Join(b.TempDir(), "bench.db") + "?_busy_timeout=5000&_journal_mode=WAL"
		var err error
		if plain, err = gorm.Open(sqlite.Open(dsn), cfg()); err != nil {
			b.Fatal(err)
		}
		if withPlugin, err = gorm.Open(sqlite.Open(dsn), cfg()); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			for _, db := range []*gorm.DB{plain, withPlugin} {
				if sqlDB, err := db.DB(); err == nil {
					sqlDB.Close()
				}
			}
		})
	} else {
		plain = openDB(b, d, cfg())
		withPlugin = openDB(b, d, cfg())
	}
	p := outboxplugin.New(opts...)
	if strategy != "" {
		outboxplugin.UseInsertStrategy(p, strategy)
	}
	if err := withPlugin.Use(p); err != nil {
		b.Fatal(err)
	}
	return plain, withPlugin
}
