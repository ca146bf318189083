// Package testdb gives the tests of the core module's packages a database of their own on each server
// of this machine: SQLite in a temporary file, and on PostgreSQL and MariaDB/MySQL a database made for
// the test and dropped when it ends, when the servers are reachable (OUTBOX_POSTGRES_DSN and
// OUTBOX_MYSQL_DSN override the defaults; with OUTBOX_REQUIRE_DBS=1 an unreachable server fails the
// test instead of skipping it). Only tests import it: it is never linked into a program of the
// module's users.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql" // the server database's drivers, for CREATE and DROP DATABASE
	_ "github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Server is a database server the tests make databases of their own on.
type Server struct {
	Name, Driver, DSN string
	// DatabaseDSN is the DSN of database name on the server.
	DatabaseDSN func(name string) string
}

// The servers, at the addresses SPEC.md gives them or the environment's.
var (
	Postgres = &Server{
		Name: "postgres", Driver: "pgx", DSN: envOr("OUTBOX_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"),
		DatabaseDSN: func(name string) string {
			return envOr("OUTBOX_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable") + " dbname=" + name
		},
	}
	MySQL = &Server{
		Name: "mysql", Driver: "mysql", DSN: envOr("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/"),
		DatabaseDSN: func(name string) string {
			return envOr("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/") + name + "?parseTime=true"
		},
	}
)

// Pooler is what stands between the tests and PostgreSQL: "transaction" when OUTBOX_POSTGRES_DSN is a
// transaction pooler's (OUTBOX_POSTGRES_POOLER=transaction: .ci/run's PgBouncer), "" when it is the
// server's. A session's state (LISTEN, session locks, settings) does not last beyond a transaction
// there; tests that need one skip themselves, saying why (SkipBehindPooler).
var Pooler = os.Getenv("OUTBOX_POSTGRES_POOLER")

// SkipBehindPooler skips t behind a transaction pooler (Pooler), for the reason why.
func SkipBehindPooler(t testing.TB, why string) {
	t.Helper()
	if Pooler != "" {
		t.Skipf("PostgreSQL behind a %s pooler (OUTBOX_POSTGRES_POOLER): %s", Pooler, why)
	}
}

// Target is a way the tests drive a database: SQLite, PostgreSQL, MariaDB, and MariaDB driven the way
// GORM drives MySQL 8 (no RETURNING; no MySQL 8 server can be had here).
type Target struct {
	Name   string
	Server *Server // nil: SQLite
	Open   func(dsn string) gorm.Dialector
}

// Targets are every Target.
var Targets = []Target{
	{Name: "sqlite", Open: func(dsn string) gorm.Dialector { return sqlite.Open(dsn) }},
	{Name: "postgres", Server: Postgres, Open: func(dsn string) gorm.Dialector { return postgres.Open(dsn) }},
	{Name: "mysql", Server: MySQL, Open: func(dsn string) gorm.Dialector { return mysql.Open(dsn) }},
	{Name: "mysql_noreturning", Server: MySQL, Open: func(dsn string) gorm.Dialector {
		return mysql.New(mysql.Config{DSN: dsn, DisableWithReturning: true})
	}},
}

// Databases are the Targets of distinct databases: one each of SQLite, PostgreSQL and MariaDB, for
// tests of what GORM's way of writing does not change.
func Databases() []Target {
	var out []Target
	for _, tg := range Targets {
		if !strings.HasSuffix(tg.Name, "_noreturning") {
			out = append(out, tg)
		}
	}
	return out
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// RandomHex is 12 random hex digits, for names of a test's own.
func RandomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewDatabase makes an empty database of t's own (a file on SQLite), dropped when t ends, and
// returns its DSN. prefix begins its name.
func (tg Target) NewDatabase(t testing.TB, prefix string) string {
	t.Helper()
	if tg.Server == nil {
		return "file:" + filepath.Join(t.TempDir(), prefix+"-"+RandomHex()+".db") + "?_busy_timeout=5000&_journal_mode=WAL"
	}
	return tg.Server.NewDatabase(t, prefix)
}

// OpenDB opens a pool of dsn, closed when t ends.
func (tg Target) OpenDB(t testing.TB, dsn string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(tg.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Close(db) })
	return db
}

// NewDatabase creates a database of t's own on s, named prefix_<random hex> (prefix: Prefix's, for
// Main's leak check), dropped when t ends, and returns its DSN; it skips t when s is unreachable, or
// fails it with OUTBOX_REQUIRE_DBS=1.
func (s Server) NewDatabase(t testing.TB, prefix string) string {
	t.Helper()
	ctx := context.Background()
	admin, err := s.open(ctx)
	if err != nil {
		if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("%s unreachable and OUTBOX_REQUIRE_DBS=1: %v", s.Name, err)
		}
		t.Skipf("%s unreachable: %v", s.Name, err)
	}
	defer admin.Close()
	name := prefix + "_" + RandomHex()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.drop(ctx, []string{name}); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return s.DatabaseDSN(name)
}

// Close closes db's pool.
func Close(db *gorm.DB) {
	if s, err := db.DB(); err == nil {
		s.Close()
	}
}
