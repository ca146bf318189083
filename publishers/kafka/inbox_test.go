package outboxkafka_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/inbox"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxkafka "github.com/gorm-outbox/outboxplugin/publishers/kafka"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The events the worker publishes are read by a member of a consumer group that handles each record
// through inbox.Handle, keyed by MessageID, and stops without committing — a consumer that crashed —
// so that the next member of the group reads the partitions again from the start; it handles every
// record again and commits. Each event takes effect once, and Handle runs the handler on no record
// read the second time.
func TestInboxHandlesRedeliveriesOnce(t *testing.T) {
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := "outbox.Order" // the default topic of the Order aggregate
	cluster := newCluster(t, []string{topic})
	pub, err := outboxkafka.New(newProducer(t, cluster))
	require.NoError(t, err)
	db := openDB(t)
	_, err = outboxtest.Fill(ctx, db, n, outboxtest.FillOptions{AggregateType: "Order", Keys: 5})
	require.NoError(t, err)
	published, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, n, published)

	c := newInboxConsumer(t)
	group := "test-consumer-" + suffix(t)
	for _, commit := range []bool{false, true} {
		records := readGroup(ctx, t, cluster, group, topic, n, commit)
		require.Len(t, records, n, "records read, commit=%v", commit)
		for _, r := range records {
			id, err := outboxkafka.MessageID(r)
			require.NoError(t, err)
			c.handle(ctx, t, id)
		}
	}
	c.check(t, outboxIDs(t, db))
}

// readGroup joins group as a new member consuming topic, from the start where the group has no
// committed offset, and returns the first n records it gets; with commit, it commits their offsets
// before leaving the group.
func readGroup(ctx context.Context, t *testing.T, c *kfake.Cluster, group, topic string, n int, commit bool) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	require.NoError(t, err)
	defer cl.Close()
	var out []*kgo.Record
	for len(out) < n {
		fetches := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "%d of %d records read", len(out), n)
		fetches.EachError(func(tp string, p int32, err error) { t.Fatalf("consume %s[%d]: %v", tp, p, err) })
		out = append(out, fetches.Records()...)
	}
	if commit {
		require.NoError(t, cl.CommitRecords(ctx, out...))
	}
	return out
}

func TestMessageID(t *testing.T) {
	for _, tc := range []struct {
		name   string
		record *kgo.Record
		want   string // "": ErrNoMessageID
	}{
		{"as the publisher sends it", &kgo.Record{Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-1-2-01")}, {Key: outboxplugin.HeaderID, Value: []byte("a")}}}, "a"},
		{"empty outbox-id", &kgo.Record{Headers: []kgo.RecordHeader{{Key: outboxplugin.HeaderID}}}, ""},
		{"other headers only", &kgo.Record{Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-1-2-01")}}}, ""},
		{"no headers", &kgo.Record{Value: []byte(`{}`)}, ""},
		{"nil record", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := outboxkafka.MessageID(tc.record)
			if tc.want == "" {
				assert.ErrorIs(t, err, outboxkafka.ErrNoMessageID)
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
