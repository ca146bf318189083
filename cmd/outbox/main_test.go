package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
)

// The tests run the binary as a user would, against a database of their own on each server:
// PostgreSQL and MariaDB/MySQL when reachable (OUTBOX_POSTGRES_DSN, OUTBOX_MYSQL_DSN override the
// defaults), and SQLite always. With OUTBOX_REQUIRE_DBS=1 an unreachable server fails the tests
// instead of skipping them.

var binary string // the outbox binary TestMain built

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outbox-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outbox")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build outbox:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if !checkLeaks(os.Stderr, leakChecks()) && code == 0 {
		code = 1
	}
	os.Exit(code)
}

// result is what one run of the binary printed, and its exit code.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs the binary with args, the environment of the test less every OUTBOX_ variable plus env,
// and stdin from /dev/null unless in is given.
func cli(t *testing.T, env []string, in io.Reader, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = in
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	code := 0
	if errors.As(err, &exitErr) {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("run outbox %v: %v", args, err)
	}
	return result{stdout.String(), stderr.String(), code}
}

// ok runs the binary and fails the test unless it exits 0.
func ok(t *testing.T, args ...string) result {
	t.Helper()
	r := cli(t, nil, nil, args...)
	if r.code != 0 {
		t.Fatalf("outbox %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r
}

// wantCode runs the binary and fails the test unless it exits with code.
func wantCode(t *testing.T, code int, args ...string) result {
	t.Helper()
	r := cli(t, nil, nil, args...)
	if r.code != code {
		t.Fatalf("outbox %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, r.code, code, r.stdout, r.stderr)
	}
	return r
}

// decode parses a run's stdout as JSON into v.
func decode(t *testing.T, r result, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func requireDBs() bool { return os.Getenv("OUTBOX_REQUIRE_DBS") == "1" }

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

// server is a database server the tests create their databases on.
type server struct {
	name   string
	driver string
	dsn    func() string
	// dbDSN is the DSN of the database name on the server.
	dbDSN func(name string) string

	once sync.Once
	err  error // why the server is unreachable
}

var dbnameRE = regexp.MustCompile(`dbname=\S+`)

var servers = []*server{
	{
		name: "postgres", driver: "pgx", dsn: postgresServerDSN,
		dbDSN: func(name string) string {
			if dsn := postgresServerDSN(); dbnameRE.MatchString(dsn) {
				return dbnameRE.ReplaceAllString(dsn, "dbname="+name)
			}
			return postgresServerDSN() + " dbname=" + name
		},
	},
	{
		name: "mysql", driver: "mysql", dsn: mysqlServerDSN,
		dbDSN: func(name string) string {
			cfg, err := mysql.ParseDSN(mysqlServerDSN())
			if err != nil {
				panic(err)
			}
			cfg.DBName = name
			return cfg.FormatDSN()
		},
	},
}

// reachable pings the server once, and skips (or with OUTBOX_REQUIRE_DBS=1 fails) the test when it
// does not answer.
func (s *server) reachable(t *testing.T) {
	t.Helper()
	if s.ping() == nil {
		return
	}
	if requireDBs() {
		t.Fatalf("%s unreachable (OUTBOX_REQUIRE_DBS=1): %v", s.name, s.err)
	}
	t.Skipf("%s unreachable: %v", s.name, s.err)
}

// ping returns why the server does not answer, or nil; it asks once.
func (s *server) ping() error {
	s.once.Do(func() {
		db, err := sql.Open(s.driver, s.dsn())
		if err != nil {
			s.err = err
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.err = db.PingContext(ctx)
	})
	return s.err
}

// testDB is a database of one test on one server, empty at first.
type testDB struct {
	name string // postgres, mysql or sqlite
	dsn  string // as the CLI takes it
	db   *gorm.DB
}

// newServerDB creates a database of its own for t on s, and drops it when t ends.
func newServerDB(t *testing.T, s *server) *testDB {
	t.Helper()
	s.reachable(t)
	name := testName("db")
	admin, err := sql.Open(s.driver, s.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	d := &testDB{name: s.name, dsn: s.dbDSN(name)}
	t.Cleanup(func() {
		if d.db != nil {
			closeDB(d.db)
		}
		admin, err := sql.Open(s.driver, s.dsn())
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
	d.db = openTestDB(t, d.dsn)
	return d
}

func openTestDB(t *testing.T, dsn string) *gorm.DB {
	t.Helper()
	kind, driverDSN, err := parseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db, err := gorm.Open(dialector(kind, driverDSN), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Use(outboxplugin.New()); err != nil {
		t.Fatal(err)
	}
	return db
}

// newSQLiteDB returns a SQLite database in a file of t's own.
func newSQLiteDB(t *testing.T) *testDB {
	t.Helper()
	d := &testDB{name: "sqlite", dsn: filepath.Join(t.TempDir(), "outbox.db")}
	d.db = openTestDB(t, d.dsn)
	t.Cleanup(func() { closeDB(d.db) })
	return d
}

// forEachDB runs test in parallel subtests, one per database, each with an empty database of its own.
func forEachDB(t *testing.T, test func(t *testing.T, d *testDB)) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			test(t, newServerDB(t, s))
		})
	}
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		test(t, newSQLiteDB(t))
	})
}

// fixture is the set of events the tests work on, by their role.
type fixture struct {
	due, dead1, dead2, waiting, oldProcessed, newProcessed string // message ids
}

// addFixture migrates d's outbox table and writes the fixture's events with the core package, then
// updates them into their states:
//
//	due           OrderPlaced  order/1
//	dead1         OrderPlaced  order/2, 5 attempts, "broker down"
//	dead2         OrderShipped order/1
//	waiting       OrderShipped order/3, retry in an hour
//	oldProcessed  OrderPlaced  order/4, created ten days ago
//	newProcessed  OrderPlaced  order/5
func addFixture(t *testing.T, d *testDB) fixture {
	t.Helper()
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}
	emit := func(eventType, aggregateID string, n int) string {
		t.Helper()
		err := d.db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, eventType, map[string]any{"order_id": n, "note": "fixture"},
				outboxplugin.WithAggregate("order", aggregateID), outboxplugin.WithHeaders(map[string]string{"trace": "abc"}))
		})
		if err != nil {
			t.Fatal(err)
		}
		var id string
		if err := d.db.Raw(`SELECT message_id FROM outbox_events ORDER BY id DESC LIMIT 1`).Scan(&id).Error; err != nil {
			t.Fatal(err)
		}
		return id
	}
	f := fixture{
		due:          emit("OrderPlaced", "1", 1),
		dead1:        emit("OrderPlaced", "2", 2),
		dead2:        emit("OrderShipped", "1", 3),
		waiting:      emit("OrderShipped", "3", 4),
		oldProcessed: emit("OrderPlaced", "4", 5),
		newProcessed: emit("OrderPlaced", "5", 6),
	}
	now := time.Now().UTC()
	update := func(id string, set map[string]any) {
		t.Helper()
		if err := d.db.Table(outboxplugin.DefaultTableName).Where("message_id = ?", id).Updates(set).Error; err != nil {
			t.Fatal(err)
		}
	}
	update(f.dead1, map[string]any{"dead_at": now, "attempts": 5, "last_error": "broker down"})
	update(f.dead2, map[string]any{"dead_at": now, "attempts": 5, "last_error": "broker down"})
	update(f.waiting, map[string]any{"next_attempt_at": now.Add(time.Hour), "attempts": 1, "last_error": "timeout"})
	update(f.oldProcessed, map[string]any{"processed": true, "processed_at": now, "created_at": now.Add(-10 * 24 * time.Hour)})
	update(f.newProcessed, map[string]any{"processed": true, "processed_at": now})
	return f
}
