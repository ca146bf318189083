package outboxwatermill_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Order is the business model of the tests: its writes are captured as Order_create/update events.
type Order struct {
	ID   uint
	Item string
	Qty  int
}

// traceHeader is the event header the tests' plugin derives from the context of each GORM call.
const traceHeader = "trace-id"

type traceKey struct{}

// openDB opens a SQLite database in t.TempDir() with the plugin registered (carrying the trace-id
// of the call's context as a header) and the Order and outbox tables migrated.
func openDB(t testing.TB) *gorm.DB {
	t.Helper()
	dsn := filepath.Join(t.TempDir(), "outbox.db") + "?_busy_timeout=5000&_journal_mode=WAL"
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	require.NoError(t, db.Use(outboxplugin.New(outboxplugin.WithContextHeaders(func(ctx context.Context) map[string]string {
		if id, ok := ctx.Value(traceKey{}).(string); ok {
			return map[string]string{traceHeader: id}
		}
		return nil
	}))))
	require.NoError(t, db.AutoMigrate(&Order{}))
	require.NoError(t, outboxplugin.AutoMigrate(db))
	return db
}

// createOrders writes n orders in one GORM call under the given trace id: n Order_create events.
func createOrders(t testing.TB, ctx context.Context, db *gorm.DB, n int, trace string) {
	t.Helper()
	orders := make([]Order, n)
	for i := range orders {
		orders[i] = Order{Item: "item-" + randomSuffix(), Qty: i + 1}
	}
	require.NoError(t, db.WithContext(context.WithValue(ctx, traceKey{}, trace)).Create(&orders).Error)
}

// outboxRows returns every row of the outbox, in id order.
func outboxRows(t testing.TB, db *gorm.DB) []outboxplugin.OutboxEvent {
	t.Helper()
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&rows).Error)
	return rows
}

// randomSuffix returns 8 random hex digits, to give each test broker names of its own.
func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// receive reads n messages from ch, acknowledging each, or fails the test when ctx ends first.
func receive(t testing.TB, ctx context.Context, ch <-chan *message.Message, n int) []*message.Message {
	t.Helper()
	got := make([]*message.Message, 0, n)
	for len(got) < n {
		select {
		case m, ok := <-ch:
			require.True(t, ok, "subscription closed after %d of %d messages", len(got), n)
			m.Ack()
			got = append(got, m)
		case <-ctx.Done():
			t.Fatalf("received %d of %d messages: %v", len(got), n, ctx.Err())
		}
	}
	return got
}

// collect receives n messages from ch in a goroutine, acknowledging each, and hands them over on the
// returned channel (nil when ctx ended first), for publishers that block until their messages are
// acknowledged.
func collect(ctx context.Context, ch <-chan *message.Message, n int) <-chan []*message.Message {
	out := make(chan []*message.Message, 1)
	go func() {
		got := make([]*message.Message, 0, n)
		for len(got) < n {
			select {
			case m, ok := <-ch:
				if !ok {
					out <- nil
					return
				}
				m.Ack()
				got = append(got, m)
			case <-ctx.Done():
				out <- nil
				return
			}
		}
		out <- got
	}()
	return out
}

// checkMessage asserts that got carries the outbox row want as the publisher maps it: UUID = message
// id, the outbox headers and the event's own headers as metadata, the payload as is. attempt is the
// expected outbox-attempt header, or "" to accept any.
func checkMessage(t testing.TB, want outboxplugin.OutboxEvent, got *message.Message, trace, attempt string) {
	t.Helper()
	assert.Equal(t, want.MessageID, got.UUID, "UUID")
	assert.JSONEq(t, string(want.Payload), string(got.Payload), "payload")
	md := got.Metadata
	assert.Equal(t, want.MessageID, md.Get(outboxplugin.HeaderID))
	assert.Equal(t, want.EventType, md.Get(outboxplugin.HeaderEventType))
	key := ""
	if want.AggregateType != "" || want.AggregateID != "" {
		key = want.AggregateType + ":" + want.AggregateID
	}
	assert.Equal(t, key, md.Get(outboxplugin.HeaderKey))
	assert.Equal(t, want.AggregateType, md.Get(outboxplugin.HeaderAggregateType))
	assert.Equal(t, want.AggregateID, md.Get(outboxplugin.HeaderAggregateID))
	createdAt, err := time.Parse(time.RFC3339Nano, md.Get(outboxplugin.HeaderCreatedAt))
	if assert.NoError(t, err, "created-at") {
		assert.True(t, want.CreatedAt.Equal(createdAt), "created-at %v, want %v", createdAt, want.CreatedAt)
	}
	assert.Equal(t, trace, md.Get(traceHeader), "event header")
	if attempt != "" {
		assert.Equal(t, attempt, md.Get(outboxplugin.HeaderAttempt), "attempt")
	}
}

// testMessages returns n messages of the given aggregate type, as the worker would hand them over.
func testMessages(aggregate string, n int) []outboxplugin.Message {
	msgs := make([]outboxplugin.Message, n)
	for i := range msgs {
		id := aggregate + "-" + randomSuffix()
		msgs[i] = outboxplugin.Message{
			ID:            id,
			EventType:     aggregate + "_create",
			Key:           aggregate + ":" + id,
			AggregateType: aggregate,
			AggregateID:   id,
			Payload:       []byte(`{"id":"` + id + `"}`),
			CreatedAt:     time.Now().UTC(),
			Attempt:       1,
		}
	}
	return msgs
}

// quiet keeps the worker's warnings about failed batches, which these tests cause on purpose, out
// of the test output.
var quiet = outboxplugin.WithLogger(slog.New(slog.DiscardHandler))

// fastRetry makes failed events due again after a few milliseconds.
var fastRetry = outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond})

// closeAtCleanup closes p in t.Cleanup, failing the test when a Watermill call is still running
// after a few seconds (a goroutine the test would leave behind).
func closeAtCleanup(t testing.TB, p interface{ Close(context.Context) error }) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, p.Close(ctx))
	})
}

// mustWorker returns outboxplugin.NewWorker(db, pub, opts...), failing tb when that returns an error.
func mustWorker(tb testing.TB, db *gorm.DB, pub outboxplugin.Publisher, opts ...outboxplugin.WorkerOption) *outboxplugin.Worker {
	tb.Helper()
	w, err := outboxplugin.NewWorker(db, pub, opts...)
	require.NoError(tb, err)
	return w
}
