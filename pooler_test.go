package outboxplugin_test

import (
	"database/sql"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
