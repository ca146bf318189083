package outboxplugin_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/internal/testdb"
)

// PostgreSQL behind a transaction pooler: .ci/run runs this package's PostgreSQL tests a second time
// through its PgBouncer in transaction mode, with OUTBOX_POSTGRES_DSN the pooler's and
// OUTBOX_POSTGRES_POOLER=transaction (docs/operations.md, "Behind PgBouncer").

// postgresDirectDSN is the DSN of the PostgreSQL server itself, not through a pooler
// (OUTBOX_POSTGRES_DIRECT_DSN, or the address SPEC.md gives it).
func postgresDirectDSN() string {
	if dsn := os.Getenv("OUTBOX_POSTGRES_DIRECT_DSN"); dsn != "" {
		return dsn
	}
	return "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"
}

// skipPrepareStmtBehindPooler skips t behind a transaction pooler: GORM's PrepareStmt prepares named
// statements on a server connection, which PgBouncer 1.18 in transaction mode hands to other clients
// (it keeps no prepared statements before 1.21), so the application's own statements fail there, with
// the plugin or without.
func skipPrepareStmtBehindPooler(t testing.TB) {
	t.Helper()
	testdb.SkipBehindPooler(t, "GORM's PrepareStmt needs the server connection it prepared on")
}

// openCommitPGMode is openCommitPG with pgx's default_query_exec_mode set to mode in its DSN.
func openCommitPGMode(t *testing.T, mode string, plugin *outboxplugin.Plugin) *commitPG {
	t.Helper()
	if _, err := postgresPool(); err != nil {
		if requireDBs() {
			t.Fatalf("postgres unreachable and OUTBOX_REQUIRE_DBS=1: %v", err)
		}
		t.Skipf("postgres unreachable: %v", err)
	}
	dsn := replaceDSNField(postgresServerDSN(), "dbname", testDatabase)
	return openCommitPGAt(t, replaceDSNField(dsn, "default_query_exec_mode", mode), plugin)
}

// recordsContaining returns the records of h whose message contains s.
func (h *recordingHandler) recordsContaining(s string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.records {
		if strings.Contains(r.Message, s) {
			out = append(out, r)
		}
	}
	return out
}

// A worker tests its LISTEN connection when it starts. Straight to PostgreSQL, notifications arrive:
// with a poll of a minute, an event committed through another pool (so that no wake-up of this
// process's own reaches the worker) is published at once. Behind a transaction pooler they do not: the
// worker says so once, at WARN, and polls. WithListenDB, a pool on the server itself, keeps the
// wake-up there.
func TestWorkerListenSelfTest(t *testing.T) {
	d := dialectNamed(t, "postgres")
	writer := setup(t, d, nil)   // the plugin's commits send the NOTIFY
	relayDB := openDB(t, d, nil) // no plugin: the worker is woken by notifications only
	direct, err := sql.Open("pgx", replaceDSNField(postgresDirectDSN(), "dbname", testDatabase))
	require.NoError(t, err)
	defer direct.Close()

	const passed, failed = "LISTEN self-test passed", "notifications do not reach the LISTEN connection"
	for _, c := range []struct {
		name     string
		listenDB *sql.DB
		woken    bool
	}{
		{"the worker's pool", nil, testdb.Pooler == ""},
		{"WithListenDB on the server itself", direct, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := &recordingHandler{}
			poll := time.Minute // longer than the test waits: only a wake-up publishes in time
			if !c.woken {
				poll = 100 * time.Millisecond
			}
			opts := []outboxplugin.WorkerOption{outboxplugin.WithPollInterval(poll), outboxplugin.WithLogger(slog.New(logs))}
			if c.listenDB != nil {
				opts = append(opts, outboxplugin.WithListenDB(c.listenDB))
			}
			received, pub := timingPublisher()
			w := newWorker(t, relayDB, pub, opts...)
			if !c.woken {
				outboxplugin.UseListenProbe(w, 2*time.Second) // the notification never comes: do not wait long for it
			}
			stop := runWorkers(t, 1, func() *outboxplugin.Worker { return w })
			defer stop()
			outcome := passed
			if !c.woken {
				outcome = failed
			}
			require.Eventually(t, func() bool { return len(logs.recordsContaining(outcome)) > 0 }, time.Minute, 10*time.Millisecond,
				"the self-test's outcome")

			require.NoError(t, writer.Create(&User{Name: c.name}).Error)
			select {
			case <-received:
			case <-time.After(20 * time.Second):
				t.Fatal("the event was not published")
			}
			warned := logs.recordsContaining(failed)
			if c.woken {
				assert.Empty(t, warned)
				return
			}
			require.Len(t, warned, 1, "said once")
			assert.Equal(t, slog.LevelWarn, warned[0].Level)
			assert.Contains(t, warned[0].Message, "outboxplugin.WithListenDB")
			assert.Empty(t, logs.recordsContaining(passed))
		})
	}
}

// The exec modes of pgx a transaction pooler needs (PgBouncer before 1.21 keeps no prepared
// statements in transaction mode; pgx's default, cache_statement, prepares them), set in the DSN as a
// user would: in each, the capture writes one event per changed row and none for a rolled-back
// transaction, the held events still ride on the COMMIT, no connection goes back to the pool inside a
// transaction, and the relay publishes the events. .ci/run runs it through its PgBouncer.
func TestCaptureAndRelayInPoolerExecModes(t *testing.T) {
	admin := setupCommitTables(t)
	for _, mode := range []string{"cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			c := openCommitPGMode(t, mode, outboxplugin.New())
			before := len(loadEvents(t, admin))
			require.NoError(t, c.db.Transaction(func(tx *gorm.DB) error { return serviceTransaction(tx, mode) }))
			last := c.log.take()
			require.NotEmpty(t, last)
			assert.True(t, strings.HasPrefix(last[len(last)-1], `INSERT INTO "outbox_events"`) && strings.HasSuffix(last[len(last)-1], ";COMMIT"),
				"the held events ride on the COMMIT: %.120q", last[len(last)-1])

			u := User{Name: mode}
			require.NoError(t, c.db.Create(&u).Error)
			require.NoError(t, c.db.Model(&User{}).Where("name = ?", mode).Update("age", 7).Error)
			require.NoError(t, c.db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Delete(&u).Error; err != nil {
					return err
				}
				return outboxplugin.Emit(tx, "Deleted", map[string]string{"mode": mode})
			}))
			_ = c.db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Create(&User{Name: "rolled back"}).Error)
				return errors.New("roll back")
			})
			events := loadEvents(t, admin)[before:]
			// serviceTransaction's writes, then a create, an update and a delete of one user, and the Emit.
			require.Len(t, events, len(serviceEvents)+4)
			c.requireClean(t, admin)

			rec := newRecorder()
			w := newWorker(t, c.db, rec, outboxplugin.WithoutListen())
			for {
				n, err := w.ProcessOnce(context.Background())
				require.NoError(t, err)
				if n == 0 {
					break
				}
			}
			for _, e := range events {
				assert.Equal(t, 1, rec.count[e.MessageID], "published once: %s", e.EventType)
			}
		})
	}
}
