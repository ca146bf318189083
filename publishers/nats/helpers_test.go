package outboxnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// natsURL is the NATS server with JetStream the tests use: OUTBOX_NATS_URL, or the local one.
func natsURL() string {
	if u := os.Getenv("OUTBOX_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// suffix returns a random token that makes a test's stream and subjects its own.
func suffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// connect opens a connection to url, closed when the test ends, and a JetStream context on it.
func connect(tb testing.TB, url string, jsOpts []jetstream.JetStreamOpt, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	outboxtest.RequireBroker(tb, "NATS", strings.TrimPrefix(natsURL(), "nats://"))
	nc, err := nats.Connect(url, opts...)
	require.NoError(tb, err)
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jsOpts...)
	require.NoError(tb, err)
	return nc, js
}

// newStream creates a stream of its own capturing subjects, deleted when the test ends (over a
// connection of its own, so that a test may close or cut its connection).
func newStream(tb testing.TB, js jetstream.JetStream, subjects ...string) jetstream.Stream {
	tb.Helper()
	name := testName("stream")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		nc, err := nats.Connect(natsURL())
		if err != nil {
			tb.Errorf("delete stream %s: %v", name, err)
			return
		}
		defer nc.Close()
		admin, err := jetstream.New(nc)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = admin.DeleteStream(ctx, name)
		}
		if err != nil {
			tb.Errorf("delete stream %s: %v", name, err)
		}
	})
	return s
}

// readStream returns every message of the stream, in stream order, failing unless it holds want.
func readStream(tb testing.TB, s jetstream.Stream, want int) []jetstream.Msg {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	require.NoError(tb, err)
	require.EqualValues(tb, want, info.State.Msgs, "messages in stream")
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(tb, err)
	out := make([]jetstream.Msg, 0, want)
	for len(out) < want {
		batch, err := cons.Fetch(min(want-len(out), 1000), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(tb, err)
		before := len(out)
		for m := range batch.Messages() {
			out = append(out, m)
		}
		require.NoError(tb, batch.Error())
		require.Greater(tb, len(out), before, "no progress reading the stream")
	}
	return out
}

// openDB opens a SQLite outbox database in the test's directory, with the plugin registered and
// the outbox table created.
func openDB(tb testing.TB, opts ...outboxplugin.Option) *gorm.DB {
	tb.Helper()
	dsn := filepath.Join(tb.TempDir(), "outbox.db") + "?_busy_timeout=5000&_journal_mode=WAL"
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	require.NoError(tb, db.Use(outboxplugin.New(opts...)))
	require.NoError(tb, outboxplugin.AutoMigrate(db))
	return db
}

// message returns a message as the worker would hand it over.
func message(eventType, aggregateType, aggregateID string, payload string) outboxplugin.Message {
	return outboxplugin.Message{
		ID:            "msg-" + suffix(),
		EventType:     eventType,
		Key:           aggregateType + ":" + aggregateID,
		AggregateType: aggregateType,
		AggregateID:   aggregateID,
		Payload:       []byte(payload),
		CreatedAt:     time.Now().UTC(),
		Attempt:       1,
	}
}

// mustWorker returns outboxplugin.NewWorker(db, pub, opts...), failing tb when that returns an error.
func mustWorker(tb testing.TB, db *gorm.DB, pub outboxplugin.Publisher, opts ...outboxplugin.WorkerOption) *outboxplugin.Worker {
	tb.Helper()
	w, err := outboxplugin.NewWorker(db, pub, opts...)
	require.NoError(tb, err)
	return w
}
