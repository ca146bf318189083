package outboxkafka_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxkafka "github.com/gorm-outbox/outboxplugin/publishers/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"
)

// benchEvents is how many events one round of BenchmarkEndToEnd publishes each way.
const benchEvents = 20000

// BenchmarkEndToEnd compares, round by round (-benchtime 3x runs three), a Worker draining a fresh
// SQLite outbox of benchEvents events through the Publisher (worker-ev/s) with franz-go's own fastest
// loop publishing the same records, built beforehand, with no database (native-ev/s): Produce every
// record, then Flush.
// The two run against one in-process kfake cluster, in alternating order. To show where the worker's
// time goes it also measures, on the same events: the Publisher alone, called once with all of them
// (publisher-ev/s, its own cost against the native loop's) and with consecutive batches of the
// worker's size, each awaited before the next as the worker does (batches-ev/s; the batch size is OUTBOX_BENCH_BATCH, default 100); and the worker
// with a publisher that does nothing, which is the database side alone (db-only-ev/s).
func BenchmarkEndToEnd(b *testing.B) {
	batch := outboxtest.BenchBatchSize(b, 100) // the size the README's figures were measured with
	topic := "outbox.Bench_" + suffix(b)
	cluster := newCluster(b, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	producer := newProducer(b, cluster)
	pub, err := outboxkafka.New(producer, outboxkafka.WithTopic(func(outboxplugin.Message) string { return topic }))
	if err != nil {
		b.Fatal(err)
	}
	native := newProducer(b, cluster)                    // the same options: acks all, idempotent, linger 10 ms
	for _, cl := range []*kgo.Client{producer, native} { // load the metadata before timing
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(`{}`)}).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	nop := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error { return nil })
	fill := func() (*gorm.DB, []outboxplugin.OutboxEvent) {
		db := openDB(b)
		events, err := outboxtest.Fill(ctx, db, benchEvents, outboxtest.FillOptions{})
		if err != nil {
			b.Fatal(err)
		}
		return db, events
	}

	var workerTime, nativeTime, publisherTime, batchedTime, dbTime time.Duration
	timed := func(total *time.Duration, run func() (time.Duration, error)) {
		runtime.GC() // so that no part pays for the garbage of the one before
		took, err := run()
		if err != nil {
			b.Fatal(err)
		}
		*total += took
	}
	rounds := 0
	for b.Loop() {
		db, events := fill()
		nopDB, _ := fill()
		msgs, err := outboxtest.Messages(events)
		if err != nil {
			b.Fatal(err)
		}
		records := nativeRecords(msgs, topic)
		runWorker := func() {
			timed(&workerTime, func() (time.Duration, error) {
				return outboxtest.Drain(ctx, db, pub, benchEvents, outboxplugin.WithBatchSize(batch))
			})
		}
		runNative := func() {
			timed(&nativeTime, func() (time.Duration, error) { return produceAll(ctx, native, records) })
		}
		if rounds%2 == 0 {
			runWorker()
			runNative()
		} else {
			runNative()
			runWorker()
		}
		timed(&publisherTime, func() (time.Duration, error) { return publishInBatches(ctx, pub, msgs, len(msgs)) })
		timed(&batchedTime, func() (time.Duration, error) {
			return publishInBatches(ctx, pub, msgs, batch)
		})
		timed(&dbTime, func() (time.Duration, error) {
			return outboxtest.Drain(ctx, nopDB, nop, benchEvents, outboxplugin.WithBatchSize(batch))
		})
		rounds++
	}
	rate := func(d time.Duration) float64 { return float64(benchEvents*rounds) / d.Seconds() }
	b.ReportMetric(rate(workerTime), "worker-ev/s")
	b.ReportMetric(rate(nativeTime), "native-ev/s")
	b.ReportMetric(rate(workerTime)/rate(nativeTime), "worker/native")
	b.ReportMetric(rate(publisherTime), "publisher-ev/s")
	b.ReportMetric(rate(batchedTime), "batches-ev/s")
	b.ReportMetric(rate(dbTime), "db-only-ev/s")
}

// nativeRecords builds, outside the timed part, the records the Publisher sends for msgs: same topic,
// key, value, headers and timestamp.
func nativeRecords(msgs []outboxplugin.Message, topic string) []*kgo.Record {
	records := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r := &kgo.Record{Topic: topic, Key: []byte(m.Key), Value: m.Payload, Timestamp: m.CreatedAt}
		for _, h := range m.HeaderList() {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
		}
		records[i] = r
	}
	return records
}

// produceAll is franz-go's fastest publish loop: every record produced asynchronously, then one
// Flush, which ends the linger and waits for every acknowledgement.
func produceAll(ctx context.Context, cl *kgo.Client, records []*kgo.Record) (time.Duration, error) {
	var (
		mu       sync.Mutex
		firstErr error
	)
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			defer mu.Unlock()
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	start := time.Now()
	for _, r := range records {
		cl.Produce(ctx, r, promise)
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, err
	}
	took := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	return took, firstErr
}

// publishInBatches publishes msgs with pub in consecutive batches of size, as a worker with an
// infinitely fast database would.
func publishInBatches(ctx context.Context, pub outboxplugin.Publisher, msgs []outboxplugin.Message, size int) (time.Duration, error) {
	start := time.Now()
	for i := 0; i < len(msgs); i += size {
		if err := pub.Publish(ctx, msgs[i:min(i+size, len(msgs))]); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}
