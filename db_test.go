package outboxplugin_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The database matrix. SQLite always runs; PostgreSQL and MariaDB/MySQL run when reachable at the
// DSNs below, and with OUTBOX_REQUIRE_DBS=1 an unreachable one fails the test instead of skipping it.
// This package works in a database of its own on each server (testDatabase), so other packages can
// run their tests at the same time.

// testDatabase is the database of this run on each server. Its name, of this run (testPrefix), keeps
// two runs on one server (two CI jobs, a developer beside CI) out of each other's tables, and lets
// TestMain drop it without pulling it from under another run.
var testDatabase = testName("db")

// runToken returns a random token, lower-case hexadecimal so that it can end an unquoted name.
func runToken() string { return leakToken(6) }

func postgresServerDSN() string {
	if dsn := os.Getenv("OUTBOX_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"
}

func mysqlServerDSN() string {
	if dsn := os.Getenv("OUTBOX_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/"
}

func requireDBs() bool { return os.Getenv("OUTBOX_REQUIRE_DBS") == "1" }

type dialect struct {
	name string
	// captureOnly: a way of driving a server that another entry already covers, which changes how
	// GORM writes (and so what the capture sees) but not what the relay does.
	captureOnly bool
	// pool returns the shared connection pool of this package's database, or an error.
	pool func() (*sql.DB, error)
	open func(*sql.DB, *gorm.Config) (*gorm.DB, error)
}

var (
	pgOnce, myOnce       sync.Once
	pgPool, myPool       *sql.DB
	pgErr, myErr         error
	pgCreated, myCreated bool // testDatabase was created on the server, for dropTestDatabases
)

func postgresPool() (*sql.DB, error) {
	pgOnce.Do(func() {
		admin, err := sql.Open("pgx", postgresServerDSN())
		if err != nil {
			pgErr = err
			return
		}
		defer admin.Close()
		if err = pingTimeout(admin); err != nil {
			pgErr = err
			return
		}
		if _, err = admin.Exec(`CREATE DATABASE ` + testDatabase); err != nil {
			pgErr = fmt.Errorf("create database %s: %w", testDatabase, err)
			return
		}
		pgCreated = true
		dsn := postgresServerDSN()
		dsn = replaceDSNField(dsn, "dbname", testDatabase)
		pgPool, pgErr = sql.Open("pgx", dsn)
		if pgErr == nil {
			pgPool.SetMaxOpenConns(16)
			pgErr = pingTimeout(pgPool)
		}
	})
	return pgPool, pgErr
}

// myDSN is the DSN of mysqlPool, for tests that open the test database another way.
var myDSN string

func mysqlPool() (*sql.DB, error) {
	myOnce.Do(func() {
		admin, err := sql.Open("mysql", mysqlServerDSN())
		if err != nil {
			myErr = err
			return
		}
		defer admin.Close()
		if err = pingTimeout(admin); err != nil {
			myErr = err
			return
		}
		if _, err = admin.Exec("CREATE DATABASE " + testDatabase); err != nil {
			myErr = fmt.Errorf("create database %s: %w", testDatabase, err)
			return
		}
		myCreated = true
		dsn := mysqlServerDSN()
		if i := strings.Index(dsn, "/"); i >= 0 {
			rest := dsn[i+1:]
			params := ""
			if j := strings.Index(rest, "?"); j >= 0 {
				params = rest[j:]
			}
			dsn = dsn[:i+1] + testDatabase + params
		}
		if strings.Contains(dsn, "?") {
			dsn += "&parseTime=true"
		} else {
			dsn += "?parseTime=true"
		}
		myDSN = dsn
		myPool, myErr = sql.Open("mysql", dsn)
		if myErr == nil {
			myPool.SetMaxOpenConns(16)
			myErr = pingTimeout(myPool)
		}
	})
	return myPool, myErr
}

// dropTestDatabases drops testDatabase on each server where this process created it, after closing
// the package's pool there. TestMain calls it once every test has ended; a database of another run,
// with another name, is never touched.
func dropTestDatabases() error {
	var errs []error
	if pgCreated {
		if pgPool != nil {
			pgPool.Close()
		}
		// WITH (FORCE) ends the sessions a test left behind (a leaked pool, a goroutine still
		// running), which would otherwise make the drop fail.
		errs = append(errs, dropDatabase("pgx", postgresServerDSN(), `DROP DATABASE IF EXISTS `+testDatabase+` WITH (FORCE)`))
	}
	if myCreated {
		if myPool != nil {
			myPool.Close()
		}
		errs = append(errs, dropDatabase("mysql", mysqlServerDSN(), "DROP DATABASE IF EXISTS "+testDatabase))
	}
	return errors.Join(errs...)
}

// dropDatabase runs the drop statement on the server at dsn, within a minute.
func dropDatabase(driver, dsn, drop string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	conn, err := admin.Conn(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", drop, err)
	}
	defer conn.Close()
	if driver == "mysql" {
		// A transaction a test left open holds a metadata lock that DROP DATABASE waits for, by
		// default for a day or more; the server gives up on its own before the context ends.
		if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = 45"); err != nil {
			return fmt.Errorf("%s: %w", drop, err)
		}
	}
	if _, err := conn.ExecContext(ctx, drop); err != nil {
		return fmt.Errorf("%s: %w", drop, err)
	}
	return nil
}

func pingTimeout(db *sql.DB) error {
	done := make(chan error, 1)
	go func() { done <- db.Ping() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		return fmt.Errorf("ping: timed out")
	}
}

// replaceDSNField sets key=value in a key/value PostgreSQL DSN.
func replaceDSNField(dsn, key, value string) string {
	fields := strings.Fields(dsn)
	found := false
	for i, f := range fields {
		if strings.HasPrefix(f, key+"=") {
			fields[i] = key + "=" + value
			found = true
		}
	}
	if !found {
		fields = append(fields, key+"="+value)
	}
	return strings.Join(fields, " ")
}

var dialects = []dialect{
	{name: "sqlite"},
	{
		name: "postgres",
		pool: postgresPool,
		open: func(pool *sql.DB, cfg *gorm.Config) (*gorm.DB, error) {
			return gorm.Open(postgres.New(postgres.Config{Conn: pool}), cfg)
		},
	},
	{
		name: "mysql",
		pool: mysqlPool,
		open: func(pool *sql.DB, cfg *gorm.Config) (*gorm.DB, error) {
			return gorm.Open(mysql.New(mysql.Config{Conn: pool, SkipInitializeWithVersion: false}), cfg)
		},
	},
	{
		// MySQL 8 has no RETURNING, and GORM then reads generated keys from LAST_INSERT_ID(): the
		// same server driven the way GORM drives MySQL 8. No MySQL 8 server can be had here.
		name:        "mysql_noreturning",
		captureOnly: true,
		pool:        mysqlPool,
		open: func(pool *sql.DB, cfg *gorm.Config) (*gorm.DB, error) {
			return gorm.Open(mysql.New(mysql.Config{Conn: pool, DisableWithReturning: true}), cfg)
		},
	},
}

// openDB opens a fresh *gorm.DB of the dialect (plugins are per *gorm.DB) over the package's shared
// pool, or over a new SQLite file. It skips, or fails under OUTBOX_REQUIRE_DBS=1, when the server is
// unreachable.
func openDB(t testing.TB, d dialect, cfg *gorm.Config) *gorm.DB {
	t.Helper()
	if cfg == nil {
		cfg = &gorm.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = logger.Discard
	}
	if d.name == "sqlite" {
		path := filepath.Join(t.TempDir(), "test.db")
		db, err := gorm.Open(sqlite.Open("file:"+path+"?_busy_timeout=5000&_journal_mode=WAL&_foreign_keys=1"), cfg)
		if err != nil {
			t.Fatalf("open sqlite: %v", err)
		}
		t.Cleanup(func() {
			if sqlDB, err := db.DB(); err == nil {
				sqlDB.Close()
			}
		})
		return db
	}
	if cfg.PrepareStmt && d.server() == "postgres" {
		skipPrepareStmtBehindPooler(t)
	}
	pool, err := d.pool()
	if err != nil {
		if requireDBs() {
			t.Fatalf("%s unreachable and OUTBOX_REQUIRE_DBS=1: %v", d.name, err)
		}
		t.Skipf("%s unreachable: %v", d.name, err)
	}
	db, err := d.open(pool, cfg)
	if err != nil {
		t.Fatalf("open %s: %v", d.name, err)
	}
	return db
}

// server is the database the dialect talks to: "sqlite", "postgres" or "mysql".
func (d dialect) server() string {
	if strings.HasPrefix(d.name, "mysql") {
		return "mysql"
	}
	return d.name
}

// forEachDB runs fn as a subtest on every entry of the matrix.
func forEachDB(t *testing.T, fn func(t *testing.T, d dialect)) {
	t.Helper()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) { fn(t, d) })
	}
}

// relayDialects are the entries that differ for the relay: one per server.
func relayDialects() []dialect {
	var out []dialect
	for _, d := range dialects {
		if !d.captureOnly {
			out = append(out, d)
		}
	}
	return out
}

// mariaDB returns the MariaDB relay dialect, or skips b when there is none.
func mariaDB(b *testing.B) dialect {
	for _, c := range relayDialects() {
		if c.name == "mysql" {
			return c
		}
	}
	b.Skip("no MariaDB")
	return dialect{}
}

// forEachRelayDB runs fn as a subtest on each server once.
func forEachRelayDB(t *testing.T, fn func(t *testing.T, d dialect)) {
	t.Helper()
	for _, d := range relayDialects() {
		t.Run(d.name, func(t *testing.T) { fn(t, d) })
	}
}

// resetTables drops and re-creates the given models' tables, the outbox among them.
func resetTables(t testing.TB, db *gorm.DB, models ...any) {
	t.Helper()
	plain := db.Session(&gorm.Session{NewDB: true})
	if err := plain.Migrator().DropTable(models...); err != nil {
		t.Fatalf("drop tables: %v", err)
	}
	var structs []any
	for _, m := range models {
		if _, isTable := m.(string); !isTable {
			structs = append(structs, m)
		}
	}
	if err := plain.AutoMigrate(structs...); err != nil {
		t.Fatalf("migrate: %v", err)
	}
}
