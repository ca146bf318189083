package outboxnats_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/inbox"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The events the worker publishes reach a durable consumer that handles each delivery through
// inbox.Handle, keyed by MessageID, and naks the first delivery of every message after handling it —
// a consumer whose acknowledgement was lost — so that JetStream redelivers it; the redelivery is
// acknowledged. Each event takes effect once, and Handle runs the handler on no redelivery.
func TestInboxHandlesRedeliveriesOnce(t *testing.T) {
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js := connect(t, natsURL(), nil)
	prefix := testName("inbox")
	stream := newStream(t, js, prefix+".>")
	pub, err := outboxnats.New(js, outboxnats.WithSubject(prefixed(prefix)))
	require.NoError(t, err)
	db := openDB(t)
	_, err = outboxtest.Fill(ctx, db, n, outboxtest.FillOptions{AggregateType: "Order"})
	require.NoError(t, err)
	published, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, n, published)

	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "test-consumer", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	c := newInboxConsumer(t)
	for acked := 0; acked < n; {
		require.NoError(t, ctx.Err(), "%d of %d messages acknowledged", acked, n)
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		for msg := range batch.Messages() {
			id, err := outboxnats.MessageID(msg)
			require.NoError(t, err)
			c.handle(ctx, t, id)
			meta, err := msg.Metadata()
			require.NoError(t, err)
			if meta.NumDelivered == 1 {
				require.NoError(t, msg.Nak())
				continue
			}
			require.NoError(t, msg.DoubleAck(ctx))
			acked++
		}
		require.NoError(t, batch.Error())
	}
	c.check(t, outboxIDs(t, db))
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	assert.Zero(t, info.NumAckPending, "messages left unacknowledged")
	assert.Zero(t, info.NumPending, "messages left undelivered")
}

func TestMessageID(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header nats.Header
		want   string // "": ErrNoMessageID
	}{
		{"as the publisher sends it", nats.Header{jetstream.MsgIDHeader: {"a"}, outboxplugin.HeaderID: {"a"}}, "a"},
		{"Nats-Msg-Id alone", nats.Header{jetstream.MsgIDHeader: {"a"}}, "a"},
		{"outbox-id alone", nats.Header{outboxplugin.HeaderID: {"b"}}, "b"},
		{"empty Nats-Msg-Id", nats.Header{jetstream.MsgIDHeader: {""}, outboxplugin.HeaderID: {"b"}}, "b"},
		{"other headers only", nats.Header{"traceparent": {"00-1-2-01"}}, ""},
		{"empty values", nats.Header{jetstream.MsgIDHeader: {""}, outboxplugin.HeaderID: {""}}, ""},
		{"no headers", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := outboxnats.HeaderMessageID(tc.header)
			if tc.want == "" {
				assert.ErrorIs(t, err, outboxnats.ErrNoMessageID)
				assert.Empty(t, id)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.want, id)
		})
	}
	_, err := outboxnats.MessageID(nil)
	assert.ErrorIs(t, err, outboxnats.ErrNoMessageID)
}

// outboxIDs returns the message ids of the outbox's events, every one of them published.
func outboxIDs(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&rows).Error)
	ids := make([]string, len(rows))
	for i, r := range rows {
		require.True(t, r.Processed, "event %d published", r.ID)
		ids[i] = r.MessageID
	}
	return ids
}

// Effect is what the consumer's handler writes: one row per message it handles.
type Effect struct {
	ID        uint
	MessageID string
}

// inboxConsumer is the consuming side of the inbox test: a SQLite database of its own, with the
// inbox table and the handler's effects, and what inbox.Handle returned for each delivery.
type inboxConsumer struct {
	db         *gorm.DB
	deliveries map[string]int // Handle calls per message id
	ran        int            // calls that ran the handler
}

func newInboxConsumer(t *testing.T) *inboxConsumer {
	t.Helper()
	dsn := filepath.Join(t.TempDir(), "consumer.db") + "?_busy_timeout=5000&_journal_mode=WAL"
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			_ = s.Close()
		}
	})
	in, err := inbox.New(db)
	require.NoError(t, err)
	require.NoError(t, in.AutoMigrate(context.Background()))
	require.NoError(t, db.AutoMigrate(&Effect{}))
	return &inboxConsumer{db: db, deliveries: map[string]int{}}
}

// handle is the consumer's handling of one delivery of the message id: the handler, through
// inbox.Handle, must run on the message's first delivery and on no later one.
func (c *inboxConsumer) handle(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	ran, err := inbox.Handle(ctx, c.db, "test-consumer", id, func(tx *gorm.DB) error {
		return tx.Create(&Effect{MessageID: id}).Error
	})
	require.NoError(t, err)
	assert.Equal(t, c.deliveries[id] == 0, ran, "Handle of delivery %d of %s ran the handler", c.deliveries[id]+1, id)
	c.deliveries[id]++
	if ran {
		c.ran++
	}
}

// check asserts that the handler took effect exactly once for each of ids and for nothing else, and
// that messages were delivered more often than there are messages, with the handler run once each.
func (c *inboxConsumer) check(t *testing.T, ids []string) {
	t.Helper()
	var effects []Effect
	require.NoError(t, c.db.Find(&effects).Error)
	got := make(map[string]int, len(effects))
	for _, e := range effects {
		got[e.MessageID]++
	}
	want := make(map[string]int, len(ids))
	for _, id := range ids {
		want[id] = 1
	}
	assert.Equal(t, want, got, "effects per message id")
	total := 0
	for _, d := range c.deliveries {
		total += d
	}
	assert.Greater(t, total, len(ids), "deliveries: the broker must have redelivered messages")
	assert.Equal(t, len(ids), c.ran, "handler runs")
	t.Logf("%d deliveries of %d messages, the handler ran %d times", total, len(ids), c.ran)
}
