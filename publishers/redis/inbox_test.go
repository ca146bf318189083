package outboxredis_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/inbox"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The events the worker publishes are read by a consumer of a consumer group (XREADGROUP) that
// handles each entry through inbox.Handle, keyed by MessageID, and stops without acknowledging —
// a consumer that crashed — so that its entries stay pending; another consumer of the group claims
// them (XAUTOCLAIM), handles them again and acknowledges them. Each event takes effect once, and
// Handle runs the handler on no claimed entry.
func TestInboxHandlesRedeliveriesOnce(t *testing.T) {
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := streamPrefix(t)
	client := newClient(t, redisAddr)
	pub := newPublisher(t, client, prefixed(prefix))
	db := openDB(t)
	_, err := outboxtest.Fill(ctx, db, n, outboxtest.FillOptions{AggregateType: "Order"})
	require.NoError(t, err)
	published, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, n, published)

	stream, group := prefix+"outbox:Order", "test-consumer"
	require.NoError(t, client.XGroupCreate(ctx, stream, group, "0").Err())
	c := newInboxConsumer(t)

	// The first consumer reads every entry and handles it, but acknowledges none.
	for read := 0; read < n; {
		res, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: group, Consumer: "crashed", Streams: []string{stream, ">"}, Count: n, Block: time.Second,
		}).Result()
		require.NoError(t, err, "%d of %d entries read", read, n)
		for _, m := range res[0].Messages {
			id, err := outboxredis.MessageID(m)
			require.NoError(t, err)
			c.handle(ctx, t, id)
			read++
		}
	}

	// The second claims the entries left pending, whatever their idle time, and acknowledges them.
	for claimed, start := 0, "0-0"; claimed < n; {
		msgs, next, err := client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: stream, Group: group, Consumer: "survivor", MinIdle: 0, Start: start, Count: n,
		}).Result()
		require.NoError(t, err, "%d of %d entries claimed", claimed, n)
		for _, m := range msgs {
			id, err := outboxredis.MessageID(m)
			require.NoError(t, err)
			c.handle(ctx, t, id)
			require.NoError(t, client.XAck(ctx, stream, group, m.ID).Err())
			claimed++
		}
		start = next
	}
	c.check(t, outboxIDs(t, db))
	pending, err := client.XPending(ctx, stream, group).Result()
	require.NoError(t, err)
	assert.Zero(t, pending.Count, "entries left pending")
}

func TestMessageID(t *testing.T) {
	for _, tc := range []struct {
		name  string
		entry redis.XMessage
		want  string // "": ErrNoMessageID
	}{
		{"as the publisher sends it", redis.XMessage{ID: "1-0", Values: map[string]any{outboxredis.FieldPayload: "{}", outboxplugin.HeaderID: "a"}}, "a"},
		{"empty outbox-id", redis.XMessage{ID: "1-0", Values: map[string]any{outboxplugin.HeaderID: ""}}, ""},
		{"outbox-id not a string", redis.XMessage{ID: "1-0", Values: map[string]any{outboxplugin.HeaderID: int64(7)}}, ""},
		{"other fields only", redis.XMessage{ID: "1-0", Values: map[string]any{outboxredis.FieldPayload: "{}"}}, ""},
		{"no fields", redis.XMessage{ID: "1-0"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := outboxredis.MessageID(tc.entry)
			if tc.want == "" {
				assert.ErrorIs(t, err, outboxredis.ErrNoMessageID)
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
