package outboxui_test

import (
	"bytes"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
	outboxui "github.com/gorm-outbox/outboxplugin/ui"
)

// The tests serve the console over a real database: SQLite always, and PostgreSQL in a database of
// each test's own when it is reachable (OUTBOX_POSTGRES_DSN overrides the default; with
// OUTBOX_REQUIRE_DBS=1 an unreachable server fails the tests instead of skipping them).

func postgresServerDSN() string {
	if dsn := os.Getenv("OUTBOX_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Order is the fixture's business model: every write of one is an outbox event.
type Order struct {
	ID     int64
	Status string
	Total  int
}

// testDB is a database of a test's own with the plugin registered and the outbox migrated.
type testDB struct {
	name string
	db   *gorm.DB
}

func newSQLite(t testing.TB) *testDB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outbox.db")
	db, err := gorm.Open(sqlite.Open("file:"+path+"?_busy_timeout=5000&_journal_mode=WAL"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	return prepare(t, "sqlite", db)
}

func newPostgres(t testing.TB) *testDB {
	t.Helper()
	admin, err := sql.Open("pgx", postgresServerDSN())
	if err == nil {
		err = admin.Ping()
	}
	if err != nil {
		if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("PostgreSQL unreachable and OUTBOX_REQUIRE_DBS=1: %v", err)
		}
		t.Skipf("PostgreSQL unreachable: %v", err)
	}
	defer admin.Close()
	name := testName("db")
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	var db *gorm.DB
	t.Cleanup(func() {
		if db != nil {
			if s, err := db.DB(); err == nil {
				s.Close()
			}
		}
		admin, err := sql.Open("pgx", postgresServerDSN())
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close()
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	db, err = gorm.Open(postgres.Open(postgresServerDSN()+" dbname="+name), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	return prepare(t, "postgres", db)
}

func prepare(t testing.TB, name string, db *gorm.DB) *testDB {
	t.Helper()
	if err := db.Use(outboxplugin.New()); err != nil {
		t.Fatal(err)
	}
	if err := outboxplugin.AutoMigrate(db); err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		t.Fatal(err)
	}
	return &testDB{name: name, db: db}
}

// forEachDB runs test on SQLite and on PostgreSQL, each with a database of its own.
func forEachDB(t *testing.T, test func(t *testing.T, d *testDB)) {
	t.Run("sqlite", func(t *testing.T) { test(t, newSQLite(t)) })
	t.Run("postgres", func(t *testing.T) { test(t, newPostgres(t)) })
}

// fixture is the events the tests look at, by role (message ids):
//
//	processed     Order 1 created (every Order create is of type orderType), published 2 s after its write
//	due           Order 2 created
//	waiting       Order 3 created, failed once, retried in an hour
//	deadA1, deadA2  Order 4 and 5 created, dead with "broker said no: 503"
//	deadB         an emitted PaymentFailed with the header tenant=acme, dead with "payload too large"
type fixture struct {
	processed, due, waiting, deadA1, deadA2, deadB string
	orderType                                      string // the event type of an Order create
}

func addFixture(t testing.TB, d *testDB) fixture {
	t.Helper()
	for i := 1; i <= 5; i++ {
		if err := d.db.Create(&Order{Status: "placed", Total: 100 * i}).Error; err != nil {
			t.Fatal(err)
		}
	}
	if err := d.db.Transaction(func(tx *gorm.DB) error {
		return outboxplugin.Emit(tx, "PaymentFailed", map[string]any{"order": 5, "reason": "card declined"}, outboxplugin.WithAggregate("Payment", "5"),
			outboxplugin.WithHeaders(map[string]string{"tenant": "acme"}))
	}); err != nil {
		t.Fatal(err)
	}
	var evs []outboxplugin.OutboxEvent
	if err := d.db.Session(&gorm.Session{NewDB: true}).Order("id").Find(&evs).Error; err != nil {
		t.Fatal(err)
	}
	if len(evs) != 6 {
		t.Fatalf("fixture: %d events, want 6", len(evs))
	}
	set := func(i int, v map[string]any) {
		t.Helper()
		if err := d.db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", evs[i].ID).Updates(v).Error; err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	set(0, map[string]any{"processed": true, "processed_at": evs[0].CreatedAt.Add(2 * time.Second), "attempts": 1})
	set(2, map[string]any{"next_attempt_at": now.Add(time.Hour), "attempts": 1, "last_error": "connection reset"})
	for _, i := range []int{3, 4} {
		set(i, map[string]any{"dead_at": now, "attempts": 10, "last_error": "broker said no: 503"})
	}
	set(5, map[string]any{"dead_at": now, "attempts": 1, "last_error": "payload too large"})
	return fixture{processed: evs[0].MessageID, due: evs[1].MessageID, waiting: evs[2].MessageID,
		deadA1: evs[3].MessageID, deadA2: evs[4].MessageID, deadB: evs[5].MessageID, orderType: evs[3].EventType}
}

// logBuffer is a slog handler's writer that tests read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// serve starts the console of d's outbox with opts (and a logger into the returned buffer), mounted
// at /outbox/ of a ServeMux, as an application would mount it.
func serve(t testing.TB, d *testDB, opts ...outboxui.Option) (*httptest.Server, *logBuffer) {
	t.Helper()
	admin, err := outboxplugin.NewAdmin(d.db)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	opts = append([]outboxui.Option{outboxui.WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, opts...)
	console, err := outboxui.New(admin, opts...)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/outbox/", console)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, logs
}

// noStackTrace fails t when a response body shows the server's insides.
func noStackTrace(t testing.TB, body string) {
	t.Helper()
	for _, s := range []string{"goroutine ", "panic", ".go:", "runtime error", "SQLSTATE", "sql: "} {
		if strings.Contains(body, s) {
			t.Errorf("the response shows %q:\n%s", s, body)
		}
	}
}

func newTestServer(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
