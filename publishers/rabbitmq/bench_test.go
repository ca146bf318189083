package outboxrabbitmq_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
	amqp "github.com/rabbitmq/amqp091-go"
)

// benchEnv reads a positive integer from the environment, or returns def.
func benchEnv(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// BenchmarkEndToEnd compares, round by round, the worker draining an outbox of N events through the
// Publisher with amqp091-go publishing the same N messages on its own: deferred confirms, awaited a
// window at a time. Both publish to the same exchange and durable queue, with the same properties,
// headers and routing keys, persistent and mandatory. The order of the two alternates between rounds;
// each round fills a fresh SQLite outbox (not timed in the metrics). -benchtime 3x runs three rounds.
//
// publish/worker is the share of the worker's time spent inside Publish: the rest is its database
// side (claiming and marking) that pipelining did not hide.
//
// OUTBOX_BENCH_EVENTS sets N (default 20000), OUTBOX_BENCH_WINDOW the native loop's window (default
// 1000), OUTBOX_BENCH_BATCH the worker's batch size (default 100).
func BenchmarkEndToEnd(b *testing.B) {
	n := benchEnv(b, "OUTBOX_BENCH_EVENTS", 20000)
	window := benchEnv(b, "OUTBOX_BENCH_WINDOW", 1000)
	var workerOpts []outboxplugin.WorkerOption
	// Batches of 100 unless OUTBOX_BENCH_BATCH says otherwise: the size the README's figures were
	// measured with (the worker's default was 100 then).
	workerOpts = append(workerOpts, outboxplugin.WithBatchSize(100))
	if os.Getenv("OUTBOX_BENCH_BATCH") != "" {
		workerOpts = append(workerOpts, outboxplugin.WithBatchSize(benchEnv(b, "OUTBOX_BENCH_BATCH", 0)))
	}

	br := newBroker(b)
	exchange := br.exchange()
	queue := br.queue(exchange, nil, "#")
	pub, err := outboxrabbitmq.Dial(brokerURL(), outboxrabbitmq.WithExchange(exchange))
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	native, err := br.conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer native.Close()
	if err := native.Confirm(false); err != nil {
		b.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Time spent inside Publish, to tell the worker's database side from the publisher's.
	var workerTook, nativeTook, publishTook time.Duration
	timed := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
		start := time.Now()
		err := pub.Publish(ctx, msgs)
		publishTook += time.Since(start) // one worker: calls never overlap
		return err
	})
	b.ResetTimer()
	for round := 0; round < b.N; round++ {
		b.StopTimer()
		db := openDB(b)
		events, err := outboxtest.Fill(ctx, db, n, outboxtest.FillOptions{})
		if err != nil {
			b.Fatal(err)
		}
		msgs, err := outboxtest.Messages(events)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := br.ch.QueuePurge(queue, false); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		runWorker := func() {
			took, err := outboxtest.Drain(ctx, db, timed, n, workerOpts...)
			if err != nil {
				b.Fatal(err)
			}
			workerTook += took
		}
		runNative := func() {
			start := time.Now()
			if err := publishNative(ctx, native, exchange, msgs, window); err != nil {
				b.Fatal(err)
			}
			nativeTook += time.Since(start)
		}
		if round%2 == 0 {
			runWorker()
			runNative()
		} else {
			runNative()
			runWorker()
		}

		b.StopTimer()
		if got := br.count(queue); got != 2*n {
			b.Fatalf("round %d: queue holds %d messages, want %d", round, got, 2*n)
		}
		b.StartTimer()
	}
	b.StopTimer()
	if _, err := br.ch.QueuePurge(queue, false); err != nil {
		b.Fatal(err)
	}
	events := float64(n * b.N)
	b.ReportMetric(events/workerTook.Seconds(), "worker-ev/s")
	b.ReportMetric(events/nativeTook.Seconds(), "native-ev/s")
	b.ReportMetric(nativeTook.Seconds()/workerTook.Seconds(), "worker/native")
	b.ReportMetric(publishTook.Seconds()/workerTook.Seconds(), "publish/worker")
}

// publishNative is amqp091-go's fastest confirmed publishing: a window of messages published
// without waiting, with deferred confirms, then the window's confirms awaited together.
func publishNative(ctx context.Context, ch *amqp.Channel, exchange string, msgs []outboxplugin.Message, window int) error {
	confirms := make([]*amqp.DeferredConfirmation, 0, window)
	for start := 0; start < len(msgs); start += window {
		confirms = confirms[:0]
		for _, m := range msgs[start:min(start+window, len(msgs))] {
			aggregate, event := outboxplugin.RouteTokens(m)
			list := m.HeaderList()
			headers := make(amqp.Table, len(list))
			for _, h := range list {
				headers[h.Key] = h.Value
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, aggregate+"."+event, true, false, amqp.Publishing{
				Headers:      headers,
				ContentType:  "application/json",
				DeliveryMode: amqp.Persistent,
				MessageId:    m.ID,
				Timestamp:    m.CreatedAt,
				Type:         m.EventType,
				Body:         m.Payload,
			})
			if err != nil {
				return err
			}
			confirms = append(confirms, dc)
		}
		for _, dc := range confirms {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("message %d nacked", dc.DeliveryTag)
			}
		}
	}
	return nil
}
