package outboxplugin

import (
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"
)

// MigrateOption configures AutoMigrate.
type MigrateOption func(*migrateConfig)

type migrateConfig struct {
	keyOrdering bool
}

// WithKeyOrderingIndex makes AutoMigrate also create the index that a worker with WithKeyOrdering
// probes: (aggregate_type, aggregate_id, id) over unprocessed rows (over every row on MySQL and
// MariaDB, which have no partial indexes). Without key ordering the index costs every insert and buys
// nothing, so it is not created by default; a worker with WithKeyOrdering refuses to run without it.
func WithKeyOrderingIndex() MigrateOption {
	return func(c *migrateConfig) { c.keyOrdering = true }
}

// AutoMigrate creates or updates the outbox table that db's plugin writes to (DefaultTableName when
// the plugin is not registered or was not given WithTableName; the table of db.Table(name) when it is
// given), with its indexes, and on PostgreSQL
// gives it the storage settings the relay wants (see pgStorageOptions). It is everything the relay
// needs: the worker runs no DDL, and refuses to run on a table without the claim index (see
// OutboxEvent). On a table of an earlier version it adds the claim index and drops the pending index
// (created_at, id) that it replaces. On PostgreSQL and SQLite it creates the dead index (dead_at, id)
// WHERE dead_at IS NOT NULL that the Admin reads (a plain db.AutoMigrate does not: the Admin then
// reads dead events without an index). With WithKeyOrderingIndex it also creates the per-key ordering
// index. On PostgreSQL the indexes it adds to an existing table are built CONCURRENTLY, so that a live
// table's writes are not held up, and an INVALID index a failed build left behind is replaced. A table
// name that WithTableName would refuse is refused with ErrInvalidTableName, before anything is run.
func AutoMigrate(db *gorm.DB, opts ...MigrateOption) error {
	var cfg migrateConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	table := DefaultTableName
	if p := pluginOf(db); p != nil {
		table = p.cfg.table
	}
	if db.Statement != nil && db.Statement.TableExpr != nil {
		named, err := tableOfStatement(db)
		if err != nil {
			return err
		}
		table = named // AutoMigrate(db.Table("events")), AutoMigrate(db.Table("audit.events"))
	}
	fail := func(err error) error { return fmt.Errorf("outboxplugin: migrate %s: %w", table, err) }
	db = db.Session(&gorm.Session{NewDB: true})
	if db.Dialector.Name() == "postgres" && db.Migrator().HasTable(table) {
		// An existing table of an earlier version: build the claim index without holding up the
		// application's writes, before GORM's AutoMigrate would build it with a plain CREATE INDEX.
		if err := createIndex(db, table, claimIndexName(db, table), claimIndexColumns, claimIndexWhere); err != nil {
			return fail(err)
		}
	}
	if err := db.Table(table).AutoMigrate(&OutboxEvent{}); err != nil {
		return fail(err)
	}
	// The pending index of earlier versions: the claim index does its work, and every insert paid for it.
	if err := dropIndex(db, table, legacyPendingIndexName(db, table)); err != nil {
		return fail(err)
	}
	if err := setStorageOptions(db, table); err != nil {
		return fail(err)
	}
	// The dead index, for the Admin's counts and lists of dead events. Partial, so that it costs a
	// write nothing until an event dies; MySQL and MariaDB, without partial indexes, find dead rows
	// through the claim index's leading columns instead, and get no index every insert would pay for.
	if name := db.Dialector.Name(); name == "postgres" || name == "sqlite" {
		if err := createIndex(db, table, deadIndexName(db, table), deadIndexColumns, deadIndexWhere); err != nil {
			return fail(err)
		}
	}
	if cfg.keyOrdering {
		if err := createIndex(db, table, keyIndexName(table), keyIndexColumns, keyIndexWhere); err != nil {
			return fail(fmt.Errorf("per-key ordering: %w", err))
		}
	}
	return nil
}

// tableOfStatement is the table db.Table(name) named, schema included: GORM keeps only the part after
// the dot in Statement.Table, and the whole name, quoted, in Statement.TableExpr. A name that
// WithTableName would refuse (an expression, an alias, a quote inside) is refused with
// ErrInvalidTableName: it would be written into the index statements as it is.
func tableOfStatement(db *gorm.DB) (string, error) {
	expr := db.Statement.TableExpr
	name := strings.NewReplacer(`"`, "", "`", "").Replace(expr.SQL)
	if len(expr.Vars) > 0 || !identifierRE.MatchString(name) || (&gorm.Statement{DB: db}).Quote(name) != expr.SQL {
		return "", fmt.Errorf("outboxplugin: migrate %q: %w", expr.SQL, ErrInvalidTableName)
	}
	return name, nil
}

// keyIndexName is the name of the per-key ordering index of table.
func keyIndexName(table string) string {
	return "idx_" + strings.ReplaceAll(table, ".", "_") + "_key_pending"
}

// gormIndexName is the name GORM gives OutboxEvent's index named in its tags on table. GORM names an
// index after the table without its schema: db.Table("audit.events") keeps "events" in
// Statement.Table, and the claim index of audit.events is idx_events_claim (in schema audit).
func gormIndexName(db *gorm.DB, table, index string) string {
	if i := strings.LastIndex(table, "."); i >= 0 {
		table = table[i+1:]
	}
	return db.NamingStrategy.IndexName(table, index)
}

// claimIndexName is the name GORM gives table's claim index (OutboxEvent's "claim" composite), and
// legacyPendingIndexName the name of the pending index (created_at, id) that earlier versions declared.
func claimIndexName(db *gorm.DB, table string) string {
	return gormIndexName(db, table, "claim")
}

// deadIndexName is the name of the dead index AutoMigrate creates on PostgreSQL and SQLite.
func deadIndexName(db *gorm.DB, table string) string {
	return db.NamingStrategy.IndexName(table, "dead")
}

func legacyPendingIndexName(db *gorm.DB, table string) string {
	return gormIndexName(db, table, "pending")
}

// claimIndexColumns and claimIndexWhere are the claim index as OutboxEvent's tags declare it; on
// PostgreSQL AutoMigrate builds it CONCURRENTLY before GORM's AutoMigrate would build it plainly.
const (
	claimIndexColumns = "processed, dead_at, next_attempt_at, created_at, id"
	claimIndexWhere   = "processed = false AND dead_at IS NULL"
	keyIndexColumns   = "aggregate_type, aggregate_id, id"
	deadIndexColumns  = "dead_at, id"
	deadIndexWhere    = "dead_at IS NOT NULL"
	keyIndexWhere     = "processed = false"
)

// indexState reports whether table has the index name, and whether it is valid (only PostgreSQL
// has invalid indexes: what a failed CREATE INDEX CONCURRENTLY leaves behind).
func indexState(db *gorm.DB, table, name string) (exists, valid bool, err error) {
	switch db.Dialector.Name() {
	case "postgres":
		var found []bool
		err = db.Raw(`SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(?)`, pgIndexRef(table, name)).Scan(&found).Error
		if err != nil || len(found) == 0 {
			return false, false, err
		}
		return true, found[0], nil
	case "mysql":
		var n int64
		err = db.Raw(`SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE()`+
			` AND table_name = ? AND index_name = ?`, table, name).Scan(&n).Error
		return n > 0, n > 0, err
	default:
		var n int64
		err = db.Raw(`SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = ?`, name).Scan(&n).Error
		return n > 0, n > 0, err
	}
}

// pgIndexRef is index name of table, quoted and qualified with the table's schema when it has one.
func pgIndexRef(table, name string) string {
	qualified := quotePGIdent(name)
	if i := strings.LastIndex(table, "."); i >= 0 {
		qualified = pgQuotedName(table[:i]) + "." + qualified
	}
	return qualified
}

// createIndex creates the index name on table (columns, over the rows matching where on the databases
// with partial indexes) where it is missing, or invalid.
func createIndex(db *gorm.DB, table, name, columns, where string) error {
	exists, valid, err := indexState(db, table, name)
	if err != nil {
		return fmt.Errorf("look up index %s: %w", name, err)
	}
	if exists && valid {
		return nil
	}
	quotedTable := (&gorm.Statement{DB: db}).Quote(table)
	switch db.Dialector.Name() {
	case "postgres":
		// CONCURRENTLY: a plain CREATE INDEX takes a SHARE lock, which waits for every open write
		// transaction on the table and holds up every write that comes after it.
		if exists {
			if err := db.Exec(`DROP INDEX CONCURRENTLY IF EXISTS ` + pgIndexRef(table, name)).Error; err != nil {
				return fmt.Errorf("drop the invalid index %s: %w", name, err)
			}
		}
		err = db.Exec(`CREATE INDEX CONCURRENTLY IF NOT EXISTS ` + quotePGIdent(name) + ` ON ` + quotedTable +
			` (` + columns + `) WHERE ` + where).Error
	case "mysql":
		err = db.Exec(`CREATE INDEX ` + name + ` ON ` + quotedTable + ` (` + columns + `)`).Error
	default:
		err = db.Exec(`CREATE INDEX IF NOT EXISTS ` + name + ` ON ` + quotedTable + ` (` + columns + `) WHERE ` + where).Error
	}
	if err != nil {
		return fmt.Errorf("create index %s: %w", name, err)
	}
	return nil
}

// dropIndex drops the index name of table when it exists (on PostgreSQL CONCURRENTLY).
func dropIndex(db *gorm.DB, table, name string) error {
	exists, _, err := indexState(db, table, name)
	if err != nil || !exists {
		return err
	}
	switch db.Dialector.Name() {
	case "postgres":
		err = db.Exec(`DROP INDEX CONCURRENTLY IF EXISTS ` + pgIndexRef(table, name)).Error
	case "mysql":
		err = db.Exec(`DROP INDEX ` + name + ` ON ` + (&gorm.Statement{DB: db}).Quote(table)).Error
	default:
		err = db.Exec(`DROP INDEX IF EXISTS ` + name).Error
	}
	if err != nil {
		return fmt.Errorf("drop index %s: %w", name, err)
	}
	return nil
}

// errMissingIndex: the worker found an index it needs missing or invalid.
var errMissingIndex = errors.New("the outbox table lacks an index the relay needs")
