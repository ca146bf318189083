package outboxplugin_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// ddlLog records every statement sent through a recordingPool.
type ddlLog struct {
	mu    sync.Mutex
	stmts []string
}

func (l *ddlLog) add(q string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stmts = append(l.stmts, q)
}

// reset forgets what was recorded.
func (l *ddlLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stmts = nil
}

// writes returns the recorded statements that are not reads: DDL, or anything else that changes
// the database. A read is a SELECT (GORM's and the plugin's catalog queries are all SELECTs).
func (l *ddlLog) writes() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, q := range l.stmts {
		if !strings.HasPrefix(strings.ToUpper(strings.TrimSpace(q)), "SELECT") {
			out = append(out, q)
		}
	}
	return out
}

// recordingPool is a gorm.ConnPool over a *sql.DB that records every statement sent through it,
// inside transactions too: what reaches the database whatever the path (the migrator, Raw, Exec).
type recordingPool struct {
	db  *sql.DB
	log *ddlLog
}

var (
	_ gorm.ConnPool         = recordingPool{}
	_ gorm.ConnPoolBeginner = recordingPool{}
	_ gorm.GetDBConnector   = recordingPool{}
)

func (p recordingPool) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	p.log.add(q)
	return p.db.PrepareContext(ctx, q)
}

func (p recordingPool) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	p.log.add(q)
	return p.db.ExecContext(ctx, q, args...)
}

func (p recordingPool) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	p.log.add(q)
	return p.db.QueryContext(ctx, q, args...)
}

func (p recordingPool) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	p.log.add(q)
	return p.db.QueryRowContext(ctx, q, args...)
}

func (p recordingPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := p.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &recordingTx{Tx: tx, log: p.log}, nil
}

func (p recordingPool) GetDBConn() (*sql.DB, error) { return p.db, nil }

// recordingTx is a transaction of a recordingPool.
type recordingTx struct {
	*sql.Tx
	log *ddlLog
}

func (t *recordingTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	t.log.add(q)
	return t.Tx.PrepareContext(ctx, q)
}

func (t *recordingTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	t.log.add(q)
	return t.Tx.ExecContext(ctx, q, args...)
}

func (t *recordingTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	t.log.add(q)
	return t.Tx.QueryContext(ctx, q, args...)
}

func (t *recordingTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	t.log.add(q)
	return t.Tx.QueryRowContext(ctx, q, args...)
}

// openRecording opens d's database through a recordingPool, driven as d drives it (the MySQL 8 path
// with DisableWithReturning), and returns it with its statement log, emptied of the statements the
// opening sent.
func openRecording(t *testing.T, d dialect) (*gorm.DB, *ddlLog) {
	db, _, log := openRecordingBeside(t, d)
	return db, log
}

// openRecordingBeside is openRecording, also returning the database opened as usual (the same
// SQLite file).
func openRecordingBeside(t *testing.T, d dialect) (*gorm.DB, *gorm.DB, *ddlLog) {
	t.Helper()
	base := openDB(t, d, nil)
	sqlDB, err := base.DB()
	require.NoError(t, err)
	log := &ddlLog{}
	pool := recordingPool{db: sqlDB, log: log}
	db := openOverPool(t, d, pool)
	log.reset()
	return db, base, log
}

// A second AutoMigrate on an up-to-date table runs no DDL at all, whatever made the table: an
// AutoMigrate with or without the per-key ordering index, GORM's own db.AutoMigrate, a table named by
// db.Table (on PostgreSQL in a schema of its own). GORM's migrator re-typed five timestamptz(6)
// columns on PostgreSQL and three json columns on MariaDB at every call, under an exclusive lock.
func TestAutoMigrateRunsNoDDLOnAnUpToDateTable(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db, log := openRecording(t, d)
		plain := db.Session(&gorm.Session{NewDB: true})
		require.NoError(t, plain.Migrator().DropTable(outboxplugin.DefaultTableName, "events_named"))
		t.Cleanup(func() {
			if err := plain.Migrator().DropTable(outboxplugin.DefaultTableName, "events_named"); err != nil {
				t.Errorf("drop table: %v", err)
			}
		})

		twice := func(t *testing.T, migrate func() error) {
			t.Helper()
			log.reset()
			require.NoError(t, migrate())
			require.NotEmpty(t, log.writes(), "the first migration creates what is missing")
			log.reset()
			require.NoError(t, migrate())
			assert.Empty(t, log.writes(), "the second migration of an up-to-date table runs no DDL")
		}

		t.Run("AutoMigrate", func(t *testing.T) {
			twice(t, func() error { return outboxplugin.AutoMigrate(db) })
		})
		t.Run("key ordering index", func(t *testing.T) {
			twice(t, func() error { return outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()) })
		})
		t.Run("made by GORM's db.AutoMigrate", func(t *testing.T) {
			require.NoError(t, plain.Migrator().DropTable(outboxplugin.DefaultTableName))
			require.NoError(t, plain.AutoMigrate(&outboxplugin.OutboxEvent{}))
			log.reset()
			require.NoError(t, outboxplugin.AutoMigrate(db))
			log.reset()
			require.NoError(t, outboxplugin.AutoMigrate(db))
			assert.Empty(t, log.writes(), "the second migration of an up-to-date table runs no DDL")
		})
		t.Run("db.Table", func(t *testing.T) {
			twice(t, func() error { return outboxplugin.AutoMigrate(db.Table("events_named")) })
		})
		if d.name == "postgres" {
			t.Run("schema-qualified", func(t *testing.T) {
				schemaName := "migrate_" + runToken()
				require.NoError(t, plain.Exec(`CREATE SCHEMA `+schemaName).Error)
				t.Cleanup(func() { require.NoError(t, plain.Exec(`DROP SCHEMA `+schemaName+` CASCADE`).Error) })
				twice(t, func() error { return outboxplugin.AutoMigrate(db.Table(schemaName + ".events")) })
			})
		}
	})
}

// An upgrade of a table of the first version (made by the repository's migration file of version 1,
// holding an event) adds what it lacks without holding up the table's writes — PostgreSQL: a column
// added in the catalog, indexes built and dropped CONCURRENTLY, storage settings (a lock writes do
// not wait for), no column re-typed (jsonb payloads stay jsonb); MySQL and MariaDB: every ALTER in
// place or instant — and leaves a table the second AutoMigrate finds up to date and a worker relays
// from.
func TestAutoMigrateUpgradesATableOfTheFirstVersionOnline(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		// A table of its own: its jsonb columns would break the statements other tests' connections
		// keep prepared on outbox_events.
		const table = "outbox_first_version"
		db, base, log := openRecordingBeside(t, d)
		plain := db.Session(&gorm.Session{NewDB: true})
		require.NoError(t, plain.Migrator().DropTable(table))
		t.Cleanup(func() { require.NoError(t, plain.Migrator().DropTable(table)) })
		v1, err := os.ReadFile(filepath.Join("migrations", d.server(), "golang-migrate", "000001_create_table.up.sql"))
		require.NoError(t, err)
		body := strings.ReplaceAll(string(v1), "outbox_events", table)
		if d.name == "postgres" {
			// As the first versions typed them.
			body = strings.NewReplacer("payload json ", "payload jsonb ", "headers json,", "headers jsonb,").Replace(body)
		}
		for _, stmt := range sqlStatements(body) {
			require.NoError(t, plain.Exec(stmt).Error, stmt)
		}
		require.NoError(t, plain.Exec(`INSERT INTO `+table+` (message_id, event_type, payload, created_at) VALUES (?, ?, ?, ?)`,
			"0190d5a8-0000-7000-8000-000000000001", "Old_create", `{"id": 1}`, time.Now().UTC()).Error)
		// A retried event the first version published: it kept its retry time.
		old := time.Now().UTC().Add(-time.Hour)
		require.NoError(t, plain.Exec(`INSERT INTO `+table+` (message_id, event_type, payload, created_at, processed, processed_at, attempts, next_attempt_at) VALUES (?, ?, ?, ?, true, ?, 2, ?)`,
			"0190d5a8-0000-7000-8000-000000000002", "Old_create", `{"id": 2}`, old, old.Add(time.Minute), old.Add(30*time.Second)).Error)

		log.reset()
		require.NoError(t, outboxplugin.AutoMigrate(db.Table(table)))
		upgrade := log.writes()
		require.NotEmpty(t, upgrade)
		for _, stmt := range upgrade {
			switch d.server() {
			case "postgres":
				assert.Regexp(t, `^(CREATE INDEX CONCURRENTLY|DROP INDEX CONCURRENTLY|ALTER TABLE "`+table+`" (ADD COLUMN IF NOT EXISTS attempt_history jsonb$|SET \())`, stmt)
			case "mysql":
				// The one statement that is not DDL: the processed rows' next attempt times cleared
				// before the reference index goes.
				assert.Regexp(t, `^(ALTER TABLE .*, ALGORITHM=(INSTANT|INPLACE, LOCK=NONE)|UPDATE `+"`"+table+"`"+` SET next_attempt_at = NULL WHERE processed = true AND dead_at IS NULL AND next_attempt_at IS NOT NULL)$`, stmt)
			default:
				assert.Regexp(t, `^(CREATE INDEX IF NOT EXISTS|DROP INDEX IF EXISTS|ALTER TABLE .* ADD COLUMN attempt_history)`, stmt)
			}
		}
		log.reset()
		require.NoError(t, outboxplugin.AutoMigrate(db.Table(table)))
		assert.Empty(t, log.writes(), "the second migration of an up-to-date table runs no DDL")

		// MySQL and MariaDB: the full reference index is gone, and the processed row is in the claim
		// index's run of processed rows, where the Admin and cleanup read them.
		reference := "idx_" + table + "_processed_created_at"
		assert.Equal(t, d.server() != "mysql", plain.Migrator().HasIndex(table, reference), reference)
		var cleared int64
		require.NoError(t, plain.Raw(`SELECT COUNT(*) FROM `+table+` WHERE processed = true AND next_attempt_at IS NULL`).Scan(&cleared).Error)
		if d.server() == "mysql" {
			assert.Equal(t, int64(1), cleared, "the processed row's retry time is cleared")
		}
		admin, err := outboxplugin.NewAdmin(base, outboxplugin.WithAdminTable(table))
		require.NoError(t, err)
		listed, err := admin.ListEvents(context.Background(), outboxplugin.EventFilter{State: outboxplugin.StateProcessed})
		require.NoError(t, err)
		require.Len(t, listed.Events, 1)
		assert.Equal(t, "0190d5a8-0000-7000-8000-000000000002", listed.Events[0].MessageID)

		if d.name == "postgres" {
			var types []string
			require.NoError(t, plain.Raw(`SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = '`+table+`'::regclass AND attname IN ('payload', 'headers') ORDER BY attname`).Scan(&types).Error)
			assert.Equal(t, []string{"jsonb", "jsonb"}, types, "jsonb columns are kept")
		}
		rec := newRecorder()
		n, err := newWorker(t, base, rec, outboxplugin.WithTable(table)).ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 1, n)
	})
}
