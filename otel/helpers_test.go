package outboxotel_test

import (
	"context"
	"database/sql"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
)

// database is one database the tests run against.
type database struct {
	name string
	open func(t *testing.T) gorm.Dialector
}

// databases are SQLite, always, and PostgreSQL, skipped when unreachable unless OUTBOX_REQUIRE_DBS=1.
var databases = []database{
	{"sqlite", func(t *testing.T) gorm.Dialector {
		return sqlite.Open(filepath.Join(t.TempDir(), "outbox.db") + "?_busy_timeout=5000&_journal_mode=WAL")
	}},
	{"postgres", openPostgres},
}

func postgresDSN() string {
	if dsn := os.Getenv("OUTBOX_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"
}

// openPostgres creates a database of the test's own on the PostgreSQL server, dropped when the test
// ends, and returns its dialector.
func openPostgres(t *testing.T) gorm.Dialector {
	t.Helper()
	admin, err := sql.Open("pgx", postgresDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("PostgreSQL unreachable and OUTBOX_REQUIRE_DBS=1: %v", err)
		}
		t.Skipf("PostgreSQL unreachable: %v", err)
	}
	name := testName("db")
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return postgres.Open(withDBName(postgresDSN(), name))
}

// withDBName returns the key=value DSN with its dbname replaced.
func withDBName(dsn, name string) string {
	fields := strings.Fields(dsn)
	for i, f := range fields {
		if strings.HasPrefix(f, "dbname=") {
			fields[i] = "dbname=" + name
			return strings.Join(fields, " ")
		}
	}
	return dsn + " dbname=" + name
}

// openDB opens d with the plugin registered with opts and the outbox and Order tables created.
func openDB(t *testing.T, d database, opts ...outboxplugin.Option) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(d.open(t), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	require.NoError(t, db.Use(outboxplugin.New(opts...)))
	require.NoError(t, outboxplugin.AutoMigrate(db))
	require.NoError(t, db.AutoMigrate(&Order{}))
	return db
}

// Order is the model the tests write.
type Order struct {
	ID    uint
	Total int
}

// natsURL is the NATS server with JetStream the tests use: OUTBOX_NATS_URL, or the local one.
func natsURL() string {
	if u := os.Getenv("OUTBOX_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// jetStream connects to NATS (skipping, or failing under OUTBOX_REQUIRE_BROKERS=1, when it is
// unreachable) and creates a stream of the test's own over subjects under a random prefix, deleted
// when the test ends. It returns the stream and the function that gives each message its subject
// under the prefix (<prefix>.<aggregate>.<event>).
func jetStream(t *testing.T) (jetstream.JetStream, jetstream.Stream, func(outboxplugin.Message) string) {
	t.Helper()
	outboxtest.RequireBroker(t, "NATS", strings.TrimPrefix(natsURL(), "nats://"))
	nc, err := nats.Connect(natsURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	prefix := testName("subject")
	name := testName("stream")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	subject := func(m outboxplugin.Message) string {
		aggregate, event := outboxplugin.RouteTokens(m)
		return prefix + "." + aggregate + "." + event
	}
	return js, stream, subject
}

// runWorker runs a worker over db until the test ends (or stop is called), failing the test if Run
// returns an error.
func runWorker(t *testing.T, db *gorm.DB, pub outboxplugin.Publisher, opts ...outboxplugin.WorkerOption) (stop func()) {
	t.Helper()
	base := []outboxplugin.WorkerOption{outboxplugin.WithPollInterval(10 * time.Millisecond), outboxplugin.WithoutListen(),
		outboxplugin.WithLogger(slog.New(slog.DiscardHandler))}
	w, err := outboxplugin.NewWorker(db, pub, append(base, opts...)...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("worker did not stop")
		}
	}
	t.Cleanup(stop)
	return stop
}

// natsHeaders carries a context in a NATS message's headers, whose names, unlike HTTP's, are case
// sensitive (propagation.HeaderCarrier would look for "Traceparent").
type natsHeaders nats.Header

func (h natsHeaders) Get(key string) string { return nats.Header(h).Get(key) }
func (h natsHeaders) Set(key, value string) { nats.Header(h).Set(key, value) }
func (h natsHeaders) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}
