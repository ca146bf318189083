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
// needs: the worker runs no DDL. With WithKeyOrderingIndex it also creates the per-key ordering index
// — on PostgreSQL CONCURRENTLY, so that a live table's writes are not held up, replacing an INVALID
// index a failed build left behind.
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
	if db.Statement != nil && db.Statement.Table != "" {
		table = db.Statement.Table // AutoMigrate(db.Table("events"))
	}
	db = db.Session(&gorm.Session{NewDB: true})
	fail := func(err error) error { return fmt.Errorf("outboxplugin: migrate %s: %w", table, err) }
	if err := db.Table(table).AutoMigrate(&OutboxEvent{}); err != nil {
		return fail(err)
	}
	if err := setStorageOptions(db, table); err != nil {
		return fail(err)
	}
	if cfg.keyOrdering {
		if err := createKeyIndex(db, table); err != nil {
			return fail(err)
		}
	}
	return nil
}

// keyIndexName is the name of the per-key ordering index of table.
func keyIndexName(table string) string {
	return "idx_" + strings.ReplaceAll(table, ".", "_") + "_key_pending"
}

// keyIndexState reports whether table's per-key ordering index exists, and whether it is valid (only
// PostgreSQL has invalid indexes: what a failed CREATE INDEX CONCURRENTLY leaves behind).
func keyIndexState(db *gorm.DB, table string) (exists, valid bool, err error) {
	name := keyIndexName(table)
	switch db.Dialector.Name() {
	case "postgres":
		qualified := quotePGIdent(name)
		if i := strings.LastIndex(table, "."); i >= 0 {
			qualified = pgQuotedName(table[:i]) + "." + qualified
		}
		var found []bool
		err = db.Raw(`SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(?)`, qualified).Scan(&found).Error
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

// createKeyIndex creates the per-key ordering index where it is missing, or invalid.
func createKeyIndex(db *gorm.DB, table string) error {
	exists, valid, err := keyIndexState(db, table)
	if err != nil {
		return fmt.Errorf("look up the per-key ordering index: %w", err)
	}
	if exists && valid {
		return nil
	}
	name := keyIndexName(table)
	quotedTable := (&gorm.Statement{DB: db}).Quote(table)
	switch db.Dialector.Name() {
	case "postgres":
		// CONCURRENTLY: a plain CREATE INDEX takes a SHARE lock, which waits for every open write
		// transaction on the table and holds up every write that comes after it.
		if exists {
			if err := db.Exec(`DROP INDEX CONCURRENTLY IF EXISTS ` + quotePGIdent(name)).Error; err != nil {
				return fmt.Errorf("drop the invalid per-key ordering index %s: %w", name, err)
			}
		}
		err = db.Exec(`CREATE INDEX CONCURRENTLY IF NOT EXISTS ` + quotePGIdent(name) + ` ON ` + quotedTable +
			` (aggregate_type, aggregate_id, id) WHERE processed = false`).Error
	case "mysql":
		err = db.Exec(`CREATE INDEX ` + name + ` ON ` + quotedTable + ` (aggregate_type, aggregate_id, id)`).Error
	default:
		err = db.Exec(`CREATE INDEX IF NOT EXISTS ` + name + ` ON ` + quotedTable +
			` (aggregate_type, aggregate_id, id) WHERE processed = false`).Error
	}
	if err != nil {
		return fmt.Errorf("create the per-key ordering index %s: %w", name, err)
	}
	return nil
}

// errNoKeyIndex: a worker with key ordering found its index missing or invalid.
var errNoKeyIndex = errors.New("per-key ordering needs its index")
