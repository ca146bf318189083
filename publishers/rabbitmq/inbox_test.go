package outboxrabbitmq_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/inbox"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The events the worker publishes reach a queue whose consumer handles each delivery through
// inbox.Handle, keyed by MessageID, and nacks the first delivery of every message with requeue
// after handling it — a consumer whose acknowledgement was lost — so that RabbitMQ delivers it again,
// flagged redelivered; the redelivery is acknowledged. Each event takes effect once, and Handle
// runs the handler on no redelivery.
func TestInboxHandlesRedeliveriesOnce(t *testing.T) {
	const n = 20
	ctx := withTimeout(t, 30*time.Second)
	b := newBroker(t)
	exchange := b.exchange()
	queue := b.queue(exchange, nil, "#")
	pub := dial(t, brokerURL(), outboxrabbitmq.WithExchange(exchange))
	db := openDB(t)
	_, err := outboxtest.Fill(ctx, db, n, outboxtest.FillOptions{AggregateType: "Order"})
	require.NoError(t, err)
	w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithoutListen())
	require.NoError(t, err)
	published, err := w.ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, n, published)

	ch := b.channel()
	defer ch.Close()
	require.NoError(t, ch.Qos(n, 0, false))
	deliveries, err := ch.Consume(queue, "test-consumer", false, false, false, false, nil)
	require.NoError(t, err)
	c := newInboxConsumer(t)
	for acked := 0; acked < n; {
		var d amqp.Delivery
		select {
		case got, ok := <-deliveries:
			require.True(t, ok, "consumer closed after %d of %d messages acknowledged", acked, n)
			d = got
		case <-ctx.Done():
			t.Fatalf("%d of %d messages acknowledged: %v", acked, n, ctx.Err())
		}
		id, err := outboxrabbitmq.MessageID(d)
		require.NoError(t, err)
		c.handle(ctx, t, id)
		if !d.Redelivered {
			require.NoError(t, d.Nack(false, true))
			continue
		}
		require.NoError(t, d.Ack(false))
		acked++
	}
	c.check(t, outboxIDs(t, db))
	require.NoError(t, ch.Cancel("test-consumer", false))
	assert.Zero(t, b.count(queue), "messages left in the queue")
}

func TestMessageID(t *testing.T) {
	for _, tc := range []struct {
		name     string
		delivery amqp.Delivery
		want     string // "": ErrNoMessageID
	}{
		{"as the publisher sends it", amqp.Delivery{MessageId: "a", Headers: amqp.Table{outboxplugin.HeaderID: "a"}}, "a"},
		{"message-id alone", amqp.Delivery{MessageId: "a"}, "a"},
		{"outbox-id alone", amqp.Delivery{Headers: amqp.Table{outboxplugin.HeaderID: "b"}}, "b"},
		{"outbox-id not a string", amqp.Delivery{Headers: amqp.Table{outboxplugin.HeaderID: int64(7)}}, ""},
		{"empty outbox-id", amqp.Delivery{Headers: amqp.Table{outboxplugin.HeaderID: ""}}, ""},
		{"other headers only", amqp.Delivery{Headers: amqp.Table{"traceparent": "00-1-2-01"}}, ""},
		{"nothing", amqp.Delivery{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := outboxrabbitmq.MessageID(tc.delivery)
			if tc.want == "" {
				assert.ErrorIs(t, err, outboxrabbitmq.ErrNoMessageID)
				assert.Empty(t, id)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.want, id)
		})
	}
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
