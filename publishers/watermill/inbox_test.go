package outboxwatermill_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/inbox"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxwatermill "github.com/gorm-outbox/outboxplugin/publishers/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The events the worker publishes reach a Watermill subscriber whose consumer handles each delivery
// through inbox.Handle, keyed by MessageID, and nacks the first delivery of every message after
// handling it — a consumer whose acknowledgement was lost — so that the backend delivers it again
// (gochannel resends it, watermill-amqp requeues it in RabbitMQ); the redelivery is acknowledged.
// Each event takes effect once, and Handle runs the handler on no redelivery.
func TestInboxHandlesRedeliveriesOnce(t *testing.T) {
	for _, backend := range []struct {
		name string
		// start subscribes to the Order events and returns the Publisher that publishes them.
		start func(t *testing.T, ctx context.Context) (*outboxwatermill.Publisher, <-chan *message.Message)
	}{
		{"gochannel", func(t *testing.T, ctx context.Context) (*outboxwatermill.Publisher, <-chan *message.Message) {
			gc := newGoChannel(t, gochannel.Config{})
			received := subscribe(t, ctx, gc, "outbox.Order")
			return newPublisher(t, gc), received
		}},
		{"amqp", func(t *testing.T, ctx context.Context) (*outboxwatermill.Publisher, <-chan *message.Message) {
			uri, suffix := amqpURL(t), randomSuffix()
			received := amqpSubscribe(t, ctx, uri, amqpTopic(suffix, "Order"), suffix)
			return newPublisher(t, newAMQPPublisher(t, uri, suffix), amqpTopics(suffix)), received
		}},
	} {
		t.Run(backend.name, func(t *testing.T) {
			const n = 20
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pub, received := backend.start(t, ctx)
			db := openDB(t)
			_, err := outboxtest.Fill(ctx, db, n, outboxtest.FillOptions{AggregateType: "Order"})
			require.NoError(t, err)
			published, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, n, published)

			c := newInboxConsumer(t)
			for acked := 0; acked < n; {
				var m *message.Message
				select {
				case got, ok := <-received:
					require.True(t, ok, "subscription closed after %d of %d messages acknowledged", acked, n)
					m = got
				case <-ctx.Done():
					t.Fatalf("%d of %d messages acknowledged: %v", acked, n, ctx.Err())
				}
				id, err := outboxwatermill.MessageID(m)
				require.NoError(t, err)
				c.handle(ctx, t, id)
				if c.deliveries[id] == 1 {
					m.Nack()
					continue
				}
				m.Ack()
				acked++
			}
			c.check(t, outboxIDs(t, db))
		})
	}
}

// A message that outboxrabbitmq publishes — message-id property and outbox-id header, no Watermill
// UUID header — read through watermill-amqp: its UUID is empty, and MessageID is its outbox-id.
func TestMessageIDOfAnAMQPMessage(t *testing.T) {
	uri := amqpURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	suffix := randomSuffix()
	topic := amqpTopic(suffix, "Order")
	received := amqpSubscribe(t, ctx, uri, topic, suffix)
	conn, err := amqp.Dial(uri)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	id := "msg-" + randomSuffix()
	require.NoError(t, ch.PublishWithContext(ctx, topic, "", false, false, amqp.Publishing{
		MessageId: id,
		Headers:   amqp.Table{outboxplugin.HeaderID: id, outboxplugin.HeaderEventType: "Order_create"},
		Body:      []byte(`{}`),
	}))
	got := receive(t, ctx, received, 1)[0]
	assert.Empty(t, got.UUID, "watermill-amqp's UUID without its header")
	gotID, err := outboxwatermill.MessageID(got)
	require.NoError(t, err)
	assert.Equal(t, id, gotID)
}

func TestMessageID(t *testing.T) {
	withMetadata := func(uuid string, md message.Metadata) *message.Message {
		m := message.NewMessage(uuid, []byte(`{}`))
		m.Metadata = md
		return m
	}
	for _, tc := range []struct {
		name string
		msg  *message.Message
		want string // "": ErrNoMessageID
	}{
		{"as the publisher sends it", withMetadata("a", message.Metadata{outboxplugin.HeaderID: "a"}), "a"},
		{"UUID alone", withMetadata("a", nil), "a"},
		{"empty UUID, outbox-id metadata", withMetadata("", message.Metadata{outboxplugin.HeaderID: "b"}), "b"},
		{"empty UUID, other metadata", withMetadata("", message.Metadata{"traceparent": "00-1-2-01"}), ""},
		{"empty UUID, no metadata", withMetadata("", nil), ""},
		{"nil message", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := outboxwatermill.MessageID(tc.msg)
			if tc.want == "" {
				assert.ErrorIs(t, err, outboxwatermill.ErrNoMessageID)
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
