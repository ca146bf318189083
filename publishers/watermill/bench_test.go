package outboxwatermill_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxwatermill "github.com/gorm-outbox/outboxplugin/publishers/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Sizes of the benchmark, which OUTBOX_BENCH_EVENTS and OUTBOX_BENCH_BATCH override.
var (
	benchEvents = envInt("OUTBOX_BENCH_EVENTS", 20000) // events per round
	benchBatch  = envInt("OUTBOX_BENCH_BATCH", 1000)   // the worker's batch size, and the native loop's
)

// envInt returns the positive integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// benchBackend is a Watermill publisher under benchmark: publish is what both sides call, and
// settle waits, after a side has published n messages, until they have arrived where the backend
// counts them as delivered.
type benchBackend struct {
	publish message.Publisher
	topic   func(outboxplugin.Message) string
	settle  func(ctx context.Context, n int) error
}

// BenchmarkEndToEnd compares, round by round (-benchtime Nx for N rounds), the Worker draining a
// fresh SQLite outbox of 20 000 events (OUTBOX_BENCH_EVENTS) through the Publisher with the same Watermill publisher's
// Publish called directly with the same messages, grouped per topic in batches of the same size —
// the fastest a producer without an outbox can go with Watermill. The two sides take turns going
// first.
func BenchmarkEndToEnd(b *testing.B) {
	b.Run("gochannel", func(b *testing.B) { benchEndToEnd(b, goChannelBackend(b)) })
	b.Run("amqp", func(b *testing.B) { benchEndToEnd(b, amqpBackend(b)) })
}

// goChannelBackend is the in-process pub/sub with one subscriber that acknowledges every message; a
// side is done when the subscriber has received all its messages.
func goChannelBackend(b *testing.B) benchBackend {
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(benchBatch)}, nil)
	b.Cleanup(func() { gc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	ch, err := gc.Subscribe(ctx, "outbox.Bench")
	require.NoError(b, err)
	var received atomic.Int64
	go func() {
		for m := range ch {
			m.Ack()
			received.Add(1)
		}
	}()
	var settled int64
	return benchBackend{
		publish: gc,
		topic:   outboxwatermill.DefaultTopic,
		settle: func(ctx context.Context, n int) error {
			settled += int64(n)
			for received.Load() < settled {
				if err := ctx.Err(); err != nil {
					return err
				}
				time.Sleep(50 * time.Microsecond)
			}
			return nil
		},
	}
}

// amqpBackend is watermill-amqp against RabbitMQ: a durable fanout exchange with one durable queue
// bound, persistent messages, transactional publishing (a Publish call returns once the broker has
// taken its messages). The queue is purged between sides.
func amqpBackend(b *testing.B) benchBackend {
	uri := amqpURL(b)
	suffix := randomSuffix()
	topic := amqpTopic(suffix, "Bench")
	queue := topic + "_" + suffix
	deleteAtCleanup(b, uri, []string{topic}, []string{queue})
	sub, err := wamqp.NewSubscriber(amqpConfig(uri, suffix), watermill.NopLogger{})
	require.NoError(b, err)
	b.Cleanup(func() { sub.Close() })
	require.NoError(b, sub.SubscribeInitialize(topic))
	pub := newAMQPPublisher(b, uri, suffix)

	conn, err := amqp.Dial(uri)
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	require.NoError(b, err)
	return benchBackend{
		publish: pub,
		topic:   func(outboxplugin.Message) string { return topic },
		settle: func(context.Context, int) error {
			_, err := ch.QueuePurge(queue, false)
			return err
		},
	}
}

func benchEndToEnd(b *testing.B, be benchBackend) {
	pub, err := outboxwatermill.New(be.publish, outboxwatermill.WithTopic(be.topic))
	require.NoError(b, err)
	closeAtCleanup(b, pub)
	var worker, native time.Duration
	for i := 0; b.Loop(); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		db := openBenchDB(b)
		events, err := outboxtest.Fill(ctx, db, benchEvents, outboxtest.FillOptions{Headers: map[string]string{traceHeader: "bench"}})
		require.NoError(b, err)
		msgs, err := outboxtest.Messages(events)
		require.NoError(b, err)

		runWorker := func() {
			start := time.Now()
			_, err := outboxtest.Drain(ctx, db, pub, benchEvents, outboxplugin.WithBatchSize(benchBatch))
			require.NoError(b, err)
			require.NoError(b, be.settle(ctx, benchEvents))
			worker += time.Since(start)
		}
		runNative := func() {
			start := time.Now()
			require.NoError(b, publishNative(be.publish, be.topic, msgs))
			require.NoError(b, be.settle(ctx, benchEvents))
			native += time.Since(start)
		}
		if i%2 == 0 {
			runWorker()
			runNative()
		} else {
			runNative()
			runWorker()
		}
		cancel()
	}
	total := float64(b.N * benchEvents)
	b.ReportMetric(total/worker.Seconds(), "worker-ev/s")
	b.ReportMetric(total/native.Seconds(), "native-ev/s")
	b.ReportMetric(native.Seconds()/worker.Seconds(), "worker/native")
}

// publishNative is a producer without an outbox: it builds the Watermill messages (UUID, metadata
// and payload as the Publisher does) and publishes them per topic in batches of benchBatch, one
// Publish call per topic of a batch.
func publishNative(pub message.Publisher, topicOf func(outboxplugin.Message) string, msgs []outboxplugin.Message) error {
	for start := 0; start < len(msgs); start += benchBatch {
		batch := msgs[start:min(start+benchBatch, len(msgs))]
		var topics []string
		groups := map[string][]*message.Message{}
		for _, m := range batch {
			topic := topicOf(m)
			if _, ok := groups[topic]; !ok {
				topics = append(topics, topic)
			}
			headers := m.HeaderList()
			wm := message.NewMessage(m.ID, m.Payload)
			wm.Metadata = make(message.Metadata, len(headers))
			for _, h := range headers {
				wm.Metadata[h.Key] = h.Value
			}
			groups[topic] = append(groups[topic], wm)
		}
		for _, topic := range topics {
			if err := pub.Publish(topic, groups[topic]...); err != nil {
				return err
			}
		}
	}
	return nil
}

// openBenchDB opens a fresh SQLite outbox for one round.
func openBenchDB(b *testing.B) *gorm.DB {
	dsn := filepath.Join(b.TempDir(), "outbox.db") + "?_busy_timeout=5000&_journal_mode=WAL"
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(b, err)
	b.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	require.NoError(b, outboxplugin.AutoMigrate(db))
	return db
}
