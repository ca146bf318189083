package tooltest_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/mattn/go-sqlite3"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The servers, at the addresses the other modules' tests use (OUTBOX_POSTGRES_DSN, OUTBOX_MYSQL_DSN).
// Every test makes databases of its own, with random names, and drops them when it ends; with
// OUTBOX_REQUIRE_DBS=1 (as in CI) an unreachable server fails the test instead of skipping it.

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

// server is one database server (or SQLite), as the plugin names its dialect.
type server struct {
	name string // postgres, mysql, sqlite
}

var servers = []server{{"postgres"}, {"mysql"}, {"sqlite"}}

// database is a fresh database of a test's own.
type database struct {
	server
	// open opens a new pool on the database (golang-migrate closes the pool it is given).
	open func(t *testing.T) *sql.DB
	db   *sql.DB  // a pool of the test's, closed when it ends
	gorm *gorm.DB // over db
}

// unreachable skips t, or fails it under OUTBOX_REQUIRE_DBS=1.
func unreachable(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
		t.Fatalf("%s unreachable and OUTBOX_REQUIRE_DBS=1: %v", what, err)
	}
	t.Skipf("%s unreachable: %v", what, err)
}

// freshDatabase creates an empty database on s for t, dropped when t ends.
func freshDatabase(t *testing.T, s server) *database {
	t.Helper()
	d := &database{server: s}
	var driver, dsn string
	switch s.name {
	case "sqlite":
		driver, dsn = "sqlite3", "file:"+filepath.Join(t.TempDir(), "outbox.db")+"?_busy_timeout=5000&_journal_mode=WAL"
	case "postgres":
		name := testName("db")
		adminExec(t, "pgx", postgresServerDSN(), "CREATE DATABASE "+name)
		t.Cleanup(func() { adminDrop(t, "pgx", postgresServerDSN(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
		driver, dsn = "pgx", replaceDSNField(postgresServerDSN(), "dbname", name)
	case "mysql":
		name := testName("db")
		adminExec(t, "mysql", mysqlServerDSN(), "CREATE DATABASE "+name)
		t.Cleanup(func() { adminDrop(t, "mysql", mysqlServerDSN(), "DROP DATABASE IF EXISTS "+name) })
		cfg, err := gomysql.ParseDSN(mysqlServerDSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.DBName, cfg.ParseTime = name, true
		driver, dsn = "mysql", cfg.FormatDSN()
	}
	d.open = func(t *testing.T) *sql.DB {
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	d.db = d.open(t)
	t.Cleanup(func() { d.db.Close() })
	d.gorm = d.newGorm(t)
	return d
}

// newGorm opens a *gorm.DB of its own over d.db (plugins are registered per *gorm.DB).
func (d *database) newGorm(t *testing.T) *gorm.DB {
	t.Helper()
	var dialector gorm.Dialector
	switch d.name {
	case "postgres":
		dialector = postgres.New(postgres.Config{Conn: d.db})
	case "mysql":
		dialector = mysql.New(mysql.Config{Conn: d.db})
	default:
		dialector = &sqlite.Dialector{Conn: d.db}
	}
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// adminExec runs stmt on the server at dsn, within a minute; an unreachable server skips t.
func adminExec(t *testing.T, driver, dsn, stmt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.PingContext(ctx); err != nil {
		unreachable(t, driver, err)
	}
	if _, err := admin.ExecContext(ctx, stmt); err != nil {
		t.Errorf("%s: %v", stmt, err)
	}
}

// adminDrop runs a DROP on the server at dsn within a minute, failing t if it cannot: unlike
// adminExec, an unreachable server is no reason to skip, since the database is there.
func adminDrop(t *testing.T, driver, dsn, stmt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := sql.Open(driver, dsn)
	if err == nil {
		_, err = admin.ExecContext(ctx, stmt)
		admin.Close()
	}
	if err != nil {
		t.Errorf("%s: %v", stmt, err)
	}
}

// replaceDSNField sets key=value in a key/value PostgreSQL DSN.
func replaceDSNField(dsn, key, value string) string {
	fields := strings.Fields(dsn)
	for i, f := range fields {
		if strings.HasPrefix(f, key+"=") {
			fields[i] = key + "=" + value
			return strings.Join(fields, " ")
		}
	}
	return dsn + " " + key + "=" + value
}
