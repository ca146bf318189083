package wakeup

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outboxplugin/internal/testdb"
)

var prefix = testdb.Prefix("wakeup")

func TestMain(m *testing.M) { testdb.Main(m, prefix) }

// logBuffer is a log destination that the listener's goroutine writes and the test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Each LISTEN connection tests itself. Straight to PostgreSQL the notification sent from another
// connection arrives: the test passes and the table's notifications wake the relay. Behind a
// transaction pooler (OUTBOX_POSTGRES_POOLER) it does not: Run says so once, at WARN with its advice,
// and returns, and the relay polls.
func TestListenerSelfTest(t *testing.T) {
	db, err := sql.Open("pgx", testdb.Postgres.NewDatabase(t, prefix))
	require.NoError(t, err)
	defer db.Close()
	logs := &logBuffer{}
	woken := make(chan struct{}, 1)
	l := Listener{
		DB: db, Table: "outbox_events", Advice: "the advice",
		Wake: func() {
			select {
			case woken <- struct{}{}:
			default:
			}
		},
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if testdb.Pooler != "" {
		l.Probe = 2 * time.Second // the notification never comes there: do not wait DefaultProbe for it
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()

	const passed, failed = "LISTEN self-test passed", "notifications do not reach the LISTEN connection"
	if testdb.Pooler != "" {
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("Run goes on listening behind the pooler")
		}
		out := logs.String()
		assert.Equal(t, 1, strings.Count(out, failed), "said once: %s", out)
		assert.Contains(t, out, "level=WARN")
		assert.Contains(t, out, "the advice")
		assert.NotContains(t, out, passed)
		return
	}
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), passed) }, time.Minute, 10*time.Millisecond)
	select {
	case <-woken: // LISTEN's own wake-up, for the events committed before it
	default:
	}
	_, err = db.Exec(`SELECT pg_notify('outbox_events', '')`)
	require.NoError(t, err)
	select {
	case <-woken:
	case <-time.After(30 * time.Second):
		t.Fatal("a notification on the table's channel did not wake the relay")
	}
	assert.NotContains(t, logs.String(), failed)
}
