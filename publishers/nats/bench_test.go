package outboxnats_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// Shape of BenchmarkEndToEnd; OUTBOX_BENCH_EVENTS and OUTBOX_BENCH_BATCH change the first two.
const (
	benchEvents = 20000 // events per round
	benchBatch  = 1000  // the worker's batch size
	benchWindow = 4000  // the client's window of unacknowledged messages (its default)
)

// BenchmarkEndToEnd compares, round by round, the worker relaying N events from a fresh SQLite
// outbox through the Publisher with the client's own fastest loop publishing the same messages
// (PublishMsgAsync within a window of unacknowledged messages, then PublishAsyncComplete), both into
// the same stream. The two take turns at going first. One round is one iteration: -benchtime 3x
// runs three.
//
//	go test -run '^$' -bench EndToEnd -benchtime 3x
func BenchmarkEndToEnd(b *testing.B) {
	events := benchEnv(b, "OUTBOX_BENCH_EVENTS", benchEvents)
	batch := benchEnv(b, "OUTBOX_BENCH_BATCH", benchBatch)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	var nativeErrs atomic.Int64
	_, js := connect(b, natsURL(), []jetstream.JetStreamOpt{
		jetstream.WithPublishAsyncMaxPending(benchWindow),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { nativeErrs.Add(1) }),
	})
	prefix := testName("bench")
	newStream(b, js, prefix+".>")
	subject := prefixed(prefix)
	pub, err := outboxnats.New(js, outboxnats.WithSubject(subject))
	require.NoError(b, err)

	var workerTime, nativeTime time.Duration
	relay := func(round int, db *gorm.DB) {
		took, err := outboxtest.Drain(ctx, db, pub, events, outboxplugin.WithBatchSize(batch))
		require.NoError(b, err, "round %d", round)
		workerTime += took
	}
	native := func(round int, msgs []outboxplugin.Message) {
		start := time.Now()
		for i := range msgs {
			m := &msgs[i]
			list := m.HeaderList()
			h := make(nats.Header, len(list)+1)
			for _, kv := range list {
				h.Set(kv.Key, kv.Value)
			}
			h.Set(jetstream.MsgIDHeader, m.ID)
			msg := &nats.Msg{Subject: subject(*m), Header: h, Data: m.Payload}
			for {
				// A window full for longer than the client's stall wait is back-pressure, not failure.
				_, err := js.PublishMsgAsync(msg)
				if err == nil {
					break
				}
				if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
					b.Fatalf("round %d: native publish: %v", round, err)
				}
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatalf("round %d: native publish: %v", round, ctx.Err())
		}
		nativeTime += time.Since(start)
		if n := nativeErrs.Load(); n > 0 {
			b.Fatalf("round %d: native publish: %d messages failed", round, n)
		}
	}

	round := 0
	for b.Loop() {
		b.StopTimer()
		db := openDB(b)
		filled, err := outboxtest.Fill(ctx, db, events, outboxtest.FillOptions{Headers: benchHeaders})
		require.NoError(b, err)
		msgs := nativeMessages(b, filled)
		b.StartTimer()
		if round%2 == 0 {
			relay(round, db)
			native(round, msgs)
		} else {
			native(round, msgs)
			relay(round, db)
		}
		round++
	}
	total := float64(events * round)
	workerRate := total / workerTime.Seconds()
	nativeRate := total / nativeTime.Seconds()
	b.ReportMetric(workerRate, "worker-ev/s")
	b.ReportMetric(nativeRate, "native-ev/s")
	b.ReportMetric(workerRate/nativeRate, "worker/native")
}

// benchHeaders are the headers of every benchmark event: a trace context, as a traced service has.
var benchHeaders = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

// nativeMessages returns the messages of the filled events as the worker hands them over, under ids
// of their own: the stream would drop the worker's ids as duplicates, which is less work than
// storing them.
func nativeMessages(b *testing.B, filled []outboxplugin.OutboxEvent) []outboxplugin.Message {
	msgs, err := outboxtest.Messages(filled)
	require.NoError(b, err)
	run := suffix()
	for i := range msgs {
		msgs[i].ID = run + "-" + msgs[i].ID
	}
	return msgs
}

// benchEnv reads a positive count from the environment, or returns def.
func benchEnv(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive count", name, v)
	}
	return n
}
