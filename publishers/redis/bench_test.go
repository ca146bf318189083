package outboxredis_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

const (
	// benchEvents is the number of events of one round of BenchmarkEndToEnd.
	benchEvents = 20000
	// nativeBatch is the pipeline size of the native loop: the fastest of BenchmarkNativePipeline
	// on the development machine (1000 to 5000 are within a few per cent of each other).
	nativeBatch = 500
)

// BenchmarkEndToEnd compares, in each round (-benchtime 3x runs three), the worker draining a fresh
// SQLite outbox of benchEvents events through the publisher with go-redis publishing the same
// messages to the same stream by itself, in pipelines of nativeBatch XADDs. The two alternate which
// goes first. It reports worker-ev/s, native-ev/s, their ratio worker/native, and publish-share,
// the part of the worker's time spent in Publish, and in-publish-ev/s, the rate of Publish alone
// inside the worker (to hold against native-ev/s).
func BenchmarkEndToEnd(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prefix := streamPrefix(b)
	client := newClient(b, redisAddr)
	pub := newPublisher(b, client, prefixed(prefix))
	stream := prefix + "outbox:Bench"

	// inPublish is the part of workerTime spent in the publisher; the rest is the worker's
	// database work (claiming and marking) and its scheduling.
	var workerTime, nativeTime, inPublish time.Duration
	timed := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
		start := time.Now()
		err := pub.Publish(ctx, msgs)
		inPublish += time.Since(start) // one worker: calls do not overlap
		return err
	})
	for round := 0; round < b.N; round++ {
		b.StopTimer()
		db := openDB(b)
		events, err := outboxtest.Fill(ctx, db, benchEvents, outboxtest.FillOptions{})
		require.NoError(b, err)
		msgs, err := outboxtest.Messages(events)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		runWorker := func() {
			took, err := outboxtest.Drain(ctx, db, timed, benchEvents, outboxplugin.WithBatchSize(outboxtest.BenchBatchSize(b, 100) /* the size the README's figures were measured with */))
			require.NoError(b, err)
			workerTime += took
			requireStreamLen(b, client, stream, benchEvents)
		}
		runNative := func() {
			start := time.Now()
			require.NoError(b, publishNative(ctx, client, stream, msgs, nativeBatch))
			nativeTime += time.Since(start)
			requireStreamLen(b, client, stream, benchEvents)
		}
		if round%2 == 0 {
			runWorker()
			runNative()
		} else {
			runNative()
			runWorker()
		}
		sqlDB, err := db.DB()
		require.NoError(b, err)
		require.NoError(b, sqlDB.Close())
	}
	workerRate := float64(benchEvents*b.N) / workerTime.Seconds()
	nativeRate := float64(benchEvents*b.N) / nativeTime.Seconds()
	b.ReportMetric(workerRate, "worker-ev/s")
	b.ReportMetric(nativeRate, "native-ev/s")
	b.ReportMetric(workerRate/nativeRate, "worker/native")
	b.ReportMetric(inPublish.Seconds()/workerTime.Seconds(), "publish-share")
	b.ReportMetric(float64(benchEvents*b.N)/inPublish.Seconds(), "in-publish-ev/s")
}

// BenchmarkNativePipeline measures go-redis's pipelined XADD by pipeline size, to choose nativeBatch.
func BenchmarkNativePipeline(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prefix := streamPrefix(b)
	client := newClient(b, redisAddr)
	stream := prefix + "outbox:Bench"
	msgs := testMessages(prefix, benchEvents, "Bench")
	for _, size := range []int{100, 500, 1000, 5000, 20000} {
		b.Run("batch="+strconv.Itoa(size), func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				start := time.Now()
				require.NoError(b, publishNative(ctx, client, stream, msgs, size))
				total += time.Since(start)
				requireStreamLen(b, client, stream, benchEvents)
			}
			b.ReportMetric(float64(benchEvents*b.N)/total.Seconds(), "ev/s")
		})
	}
}

// BenchmarkPublish measures the publisher alone (no database), one batch of the worker's default
// size per call.
func BenchmarkPublish(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prefix := streamPrefix(b)
	client := newClient(b, redisAddr)
	pub := newPublisher(b, client, prefixed(prefix), outboxredis.WithMaxLen(100000))
	msgs := testMessages(prefix, outboxplugin.DefaultBatchSize, "Bench")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := pub.Publish(ctx, msgs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(msgs)*b.N)/b.Elapsed().Seconds(), "ev/s")
}

// publishNative is what an application would write with go-redis alone: the same entries as the
// publisher's (payload, then HeaderList), XADDed in pipelines of batch.
func publishNative(ctx context.Context, client redis.UniversalClient, stream string, msgs []outboxplugin.Message, batch int) error {
	for start := 0; start < len(msgs); start += batch {
		chunk := msgs[start:min(start+batch, len(msgs))]
		_, err := client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i := range chunk {
				headers := chunk[i].HeaderList()
				values := make([]any, 0, 2+2*len(headers))
				values = append(values, "payload", chunk[i].Payload)
				for _, h := range headers {
					values = append(values, h.Key, h.Value)
				}
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values})
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// requireStreamLen checks that the stream holds n entries and then deletes it, so that every phase
// starts from an empty stream.
func requireStreamLen(b *testing.B, client redis.UniversalClient, stream string, n int) {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := client.XLen(ctx, stream).Result()
	require.NoError(b, err)
	require.EqualValues(b, n, got, "entries in %s", stream)
	require.NoError(b, client.Del(ctx, stream).Err())
}
