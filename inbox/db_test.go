package inbox_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The tests run on SQLite, and on PostgreSQL and MariaDB/MySQL in a database of each test's own when
// the servers are reachable (OUTBOX_POSTGRES_DSN, OUTBOX_MYSQL_DSN override the defaults; with
// OUTBOX_REQUIRE_DBS=1 an unreachable server fails the test instead of skipping it).

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// server is a database server the tests make databases of their own on.
type server struct {
	name, driver, dsn string
	// dbDSN is the DSN of database name on the server.
	dbDSN func(name string) string
}

var (
	postgresServer = &server{
		name: "postgres", driver: "pgx", dsn: envOr("OUTBOX_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"),
		dbDSN: func(name string) string {
			return envOr("OUTBOX_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable") + " dbname=" + name
		},
	}
	mysqlServer = &server{
		name: "mysql", driver: "mysql", dsn: envOr("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/"),
		dbDSN: func(name string) string {
			return envOr("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/") + name + "?parseTime=true"
		},
	}
)

// target is a way the tests drive a database: SQLite, PostgreSQL, MariaDB, and MariaDB driven the
// way GORM drives MySQL 8 (no RETURNING; no MySQL 8 server can be had here).
type target struct {
	name   string
	server *server // nil: SQLite
	open   func(dsn string) gorm.Dialector
}

var targets = []target{
	{name: "sqlite", open: func(dsn string) gorm.Dialector { return sqlite.Open(dsn) }},
	{name: "postgres", server: postgresServer, open: func(dsn string) gorm.Dialector { return postgres.Open(dsn) }},
	{name: "mysql", server: mysqlServer, open: func(dsn string) gorm.Dialector { return mysql.Open(dsn) }},
	{name: "mysql_noreturning", server: mysqlServer, open: func(dsn string) gorm.Dialector {
		return mysql.New(mysql.Config{DSN: dsn, DisableWithReturning: true})
	}},
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// forEachDB runs test on each target, each with an empty database of its own.
func forEachDB(t *testing.T, test func(t *testing.T, db *gorm.DB)) {
	forEachTarget(t, func(t *testing.T, tg target) { test(t, tg.openDB(t, tg.newDatabase(t))) })
}

// forEachTarget runs test as a subtest of t for each target.
func forEachTarget(t *testing.T, test func(t *testing.T, tg target)) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) { test(t, tg) })
	}
}

// forEachServer runs test on each server target with a database of its own, and a function that
// opens another pool of it (as another process would).
func forEachServer(t *testing.T, test func(t *testing.T, db *gorm.DB, reopen func() *gorm.DB)) {
	forEachTarget(t, func(t *testing.T, tg target) {
		if tg.server == nil {
			t.Skip("SQLite has no lock across processes")
		}
		dsn := tg.newDatabase(t)
		test(t, tg.openDB(t, dsn), func() *gorm.DB { return tg.openDB(t, dsn) })
	})
}

// newDatabase makes an empty database of t's own (a file on SQLite), dropped when t ends, and
// returns its DSN.
func (tg target) newDatabase(t testing.TB) string {
	t.Helper()
	if tg.server == nil {
		return "file:" + filepath.Join(t.TempDir(), "inbox-"+randomHex()+".db") + "?_busy_timeout=5000&_journal_mode=WAL"
	}
	return serverDB(t, *tg.server)
}

// openDB opens a pool of dsn, closed when t ends.
func (tg target) openDB(t testing.TB, dsn string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(tg.open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	return db
}

// serverDB creates a database of t's own on s, dropped when t ends, and returns its DSN.
func serverDB(t testing.TB, s server) string {
	t.Helper()
	admin, err := sql.Open(s.driver, s.dsn)
	if err == nil {
		err = admin.Ping()
	}
	if err != nil {
		if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("%s unreachable and OUTBOX_REQUIRE_DBS=1: %v", s.name, err)
		}
		t.Skipf("%s unreachable: %v", s.name, err)
	}
	defer admin.Close()
	name := testName("db")
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin, err := sql.Open(s.driver, s.dsn)
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close()
		drop := "DROP DATABASE IF EXISTS " + name
		if s.name == "postgres" {
			drop += " WITH (FORCE)"
		}
		if _, err := admin.Exec(drop); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return s.dbDSN(name)
}

func closeDB(db *gorm.DB) {
	if s, err := db.DB(); err == nil {
		s.Close()
	}
}
