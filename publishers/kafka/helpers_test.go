package outboxkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"testing"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// suffix returns a random name suffix, so that every test has topics of its own.
func suffix(tb testing.TB) string {
	tb.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// newCluster starts an in-process Kafka cluster with the given topics (3 partitions each); closing it
// in Cleanup deletes them.
func newCluster(tb testing.TB, topics []string, opts ...kfake.Opt) *kfake.Cluster {
	tb.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, topics...)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// newProducer returns a client configured as the README recommends for an outbox, closed in Cleanup.
func newProducer(tb testing.TB, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	tb.Helper()
	base := []kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.AllowIdempotentProduceCancellation(),
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cl.Close)
	return cl
}

// consume reads n records of topic from its start, failing the test when ctx ends first.
func consume(ctx context.Context, tb testing.TB, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	tb.Helper()
	return consumeUntil(ctx, tb, c, topic, func(got []*kgo.Record) bool { return len(got) >= n })
}

// consumeIDs reads topic from its start until it has seen a record of every one of ids (by the
// outbox-id header), and returns every record read, duplicates included.
func consumeIDs(ctx context.Context, tb testing.TB, c *kfake.Cluster, topic string, ids []string) []*kgo.Record {
	tb.Helper()
	return consumeUntil(ctx, tb, c, topic, func(got []*kgo.Record) bool {
		seen := make(map[string]bool, len(got))
		for _, r := range got {
			seen[headerMap(tb, r)[outboxplugin.HeaderID]] = true
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	})
}

// consumeUntil reads topic from its start until enough says so, failing the test when ctx ends first.
func consumeUntil(ctx context.Context, tb testing.TB, c *kfake.Cluster, topic string, enough func([]*kgo.Record) bool) []*kgo.Record {
	tb.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for !enough(out) {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			tb.Fatalf("consume %s: %d records so far: %v", topic, len(out), err)
		}
		fetches.EachError(func(t string, p int32, err error) { tb.Fatalf("consume %s[%d]: %v", t, p, err) })
		out = append(out, fetches.Records()...)
	}
	return out
}

// openDB opens a SQLite outbox in a temporary directory with the plugin registered and the outbox
// table migrated.
func openDB(tb testing.TB) *gorm.DB {
	tb.Helper()
	db, err := gorm.Open(sqlite.Open(filepath.Join(tb.TempDir(), "outbox.db")+"?_busy_timeout=5000&_journal_mode=WAL"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	if err := db.Use(outboxplugin.New()); err != nil {
		tb.Fatal(err)
	}
	if err := outboxplugin.AutoMigrate(db); err != nil {
		tb.Fatal(err)
	}
	return db
}

// headerMap returns the headers of r by name, failing on a name sent twice.
func headerMap(tb testing.TB, r *kgo.Record) map[string]string {
	tb.Helper()
	m := make(map[string]string, len(r.Headers))
	for _, h := range r.Headers {
		if _, dup := m[h.Key]; dup {
			tb.Errorf("header %q sent twice", h.Key)
		}
		m[h.Key] = string(h.Value)
	}
	return m
}

// mustWorker returns outboxplugin.NewWorker(db, pub, opts...), failing tb when that returns an error.
func mustWorker(tb testing.TB, db *gorm.DB, pub outboxplugin.Publisher, opts ...outboxplugin.WorkerOption) *outboxplugin.Worker {
	tb.Helper()
	w, err := outboxplugin.NewWorker(db, pub, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return w
}
