package outboxredis_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// Order is the business model of the end-to-end test.
type Order struct {
	ID     uint
	Amount int
}

// TestEndToEnd writes orders through GORM with the plugin, relays their events with a Worker and the
// publisher, and reads them back from the stream as a consumer would.
func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := streamPrefix(t)
	db := openDB(t, outboxplugin.WithContextHeaders(func(context.Context) map[string]string {
		// "payload" must not shadow the payload field.
		return map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "payload": "not the payload"}
	}))
	require.NoError(t, db.AutoMigrate(&Order{}))
	orders := []Order{{Amount: 10}, {Amount: 20}, {Amount: 30}}
	require.NoError(t, db.WithContext(ctx).Create(&orders).Error)

	client := newClient(t, redisAddr)
	pub := newPublisher(t, client, prefixed(prefix))
	n, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	var events []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&events).Error)
	require.Len(t, events, 3)
	for _, ev := range events {
		assert.True(t, ev.Processed, "event %d marked processed", ev.ID)
	}

	// A consumer: XREAD from the start of the stream, as a map of fields.
	stream := prefix + "outbox:Order"
	read, err := client.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, "0"}, Count: 10, Block: time.Second}).Result()
	require.NoError(t, err)
	require.Len(t, read, 1)
	require.Len(t, read[0].Messages, 3)
	for i, msg := range read[0].Messages {
		ev := events[i] // entries are appended in the order of the batch: creation order
		assert.Equal(t, string(ev.Payload), msg.Values["payload"])
		assert.Equal(t, ev.MessageID, msg.Values[outboxplugin.HeaderID])
		assert.Equal(t, "Order_create", msg.Values[outboxplugin.HeaderEventType])
		assert.Equal(t, "Order:"+strconv.Itoa(i+1), msg.Values[outboxplugin.HeaderKey])
		assert.Equal(t, "Order", msg.Values[outboxplugin.HeaderAggregateType])
		assert.Equal(t, strconv.Itoa(i+1), msg.Values[outboxplugin.HeaderAggregateID])
		assert.Equal(t, "1", msg.Values[outboxplugin.HeaderAttempt])
		created, err := time.Parse(time.RFC3339Nano, msg.Values[outboxplugin.HeaderCreatedAt].(string))
		require.NoError(t, err)
		assert.True(t, created.Equal(ev.CreatedAt), "created-at %v, want %v", created, ev.CreatedAt)
	}
	assert.JSONEq(t, `{"id":1}`, read[0].Messages[0].Values["payload"].(string))

	// The fields in order: payload, the event's own headers sorted, then the outbox's.
	entries := readStream(t, client, stream)
	require.Len(t, entries, 3)
	var names []string
	for _, f := range entries[0].fields {
		names = append(names, f[0])
	}
	assert.Equal(t, []string{
		"payload", "traceparent",
		outboxplugin.HeaderID, outboxplugin.HeaderEventType, outboxplugin.HeaderKey,
		outboxplugin.HeaderAggregateType, outboxplugin.HeaderAggregateID,
		outboxplugin.HeaderCreatedAt, outboxplugin.HeaderAttempt,
	}, names)
	trace, _ := entries[0].field("traceparent")
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", trace)
}

// TestWorkerPartlyFailedBatch routes one event of a batch to a key that holds a string: Redis refuses
// that XADD alone (WRONGTYPE, a configuration error), the others are published and marked done, and
// the refused one is pending again, no attempt spent.
func TestWorkerPartlyFailedBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := streamPrefix(t)
	db := openDB(t)
	client := newClient(t, redisAddr)
	require.NoError(t, client.Set(ctx, prefix+"outbox:Broken", "not a stream", 0).Err())
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		for _, agg := range []string{"Good", "Broken", "Good"} {
			if err := outboxplugin.Emit(tx, "Thing_happened", map[string]string{"agg": agg}, outboxplugin.WithAggregate(agg, "1")); err != nil {
				return err
			}
		}
		return nil
	}))

	pub := newPublisher(t, client, prefixed(prefix))
	quiet := slog.New(slog.DiscardHandler)
	n, err := mustWorker(t, db, pub, outboxplugin.WithoutListen(), outboxplugin.WithLogger(quiet)).ProcessOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	var events []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&events).Error)
	require.Len(t, events, 3)
	assert.True(t, events[0].Processed)
	assert.True(t, events[2].Processed)
	broken := events[1]
	assert.False(t, broken.Processed)
	assert.Zero(t, broken.Attempts, "a configuration error spends no attempt")
	require.NotNil(t, broken.LastError)
	assert.Contains(t, *broken.LastError, "WRONGTYPE")
	assert.Contains(t, *broken.LastError, prefix+"outbox:Broken", "names the key")
	assert.Contains(t, *broken.LastError, redisAddr, "names the server")

	entries := readStream(t, client, prefix+"outbox:Good")
	require.Len(t, entries, 2)
	for i, ev := range []outboxplugin.OutboxEvent{events[0], events[2]} {
		id, _ := entries[i].field(outboxplugin.HeaderID)
		assert.Equal(t, ev.MessageID, id)
	}
}

// testMessages returns n messages of the given aggregate types, cycled, with ids unique to the test.
func testMessages(prefix string, n int, aggregates ...string) []outboxplugin.Message {
	msgs := make([]outboxplugin.Message, n)
	now := time.Now().UTC()
	for i := range msgs {
		agg := aggregates[i%len(aggregates)]
		msgs[i] = outboxplugin.Message{
			ID:            fmt.Sprintf("%smsg-%d", prefix, i),
			EventType:     agg + "_create",
			Key:           agg + ":" + strconv.Itoa(i),
			AggregateType: agg,
			AggregateID:   strconv.Itoa(i),
			Payload:       []byte(`{"n":` + strconv.Itoa(i) + `}`),
			CreatedAt:     now,
			Attempt:       1,
		}
	}
	return msgs
}

// TestPublishFailsSingleMessages checks that a message Redis (or the routing) refuses fails alone,
// under its id, with an error naming the cause, while the rest of the batch is appended.
func TestPublishFailsSingleMessages(t *testing.T) {
	cases := []struct {
		name    string
		opts    func(prefix string) []outboxredis.Option
		prepare func(ctx context.Context, c *redis.Client, prefix string) error
		check   func(t *testing.T, err error)
	}{
		{
			name: "key of another type",
			prepare: func(ctx context.Context, c *redis.Client, prefix string) error {
				return c.Set(ctx, prefix+"outbox:Bad", "x", 0).Err()
			},
			check: func(t *testing.T, err error) { assert.ErrorContains(t, err, "WRONGTYPE") },
		},
		{
			name: "empty stream name",
			opts: func(prefix string) []outboxredis.Option {
				return []outboxredis.Option{outboxredis.WithStream(func(m outboxplugin.Message) string {
					if m.AggregateType == "Bad" {
						return ""
					}
					return prefix + outboxredis.DefaultStream(m)
				})}
			},
			check: func(t *testing.T, err error) { assert.ErrorIs(t, err, outboxredis.ErrNoStreamName) },
		},
		{
			name: "missing stream with NOMKSTREAM",
			opts: func(prefix string) []outboxredis.Option {
				return []outboxredis.Option{prefixed(prefix), outboxredis.WithNoMkStream()}
			},
			prepare: func(ctx context.Context, c *redis.Client, prefix string) error {
				// The good stream is provisioned with its consumer group; the bad one is not.
				return c.XGroupCreateMkStream(ctx, prefix+"outbox:Good", "consumers", "$").Err()
			},
			check: func(t *testing.T, err error) { assert.ErrorIs(t, err, outboxredis.ErrNoStream) },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			prefix := streamPrefix(t)
			client := newClient(t, redisAddr)
			if tc.prepare != nil {
				require.NoError(t, tc.prepare(ctx, client, prefix))
			}
			opts := []outboxredis.Option{prefixed(prefix)}
			if tc.opts != nil {
				opts = tc.opts(prefix)
			}
			pub := newPublisher(t, client, opts...)
			msgs := testMessages(prefix, 3, "Good", "Bad", "Good")

			err := pub.Publish(ctx, msgs)
			var perr *outboxplugin.PublishError
			require.ErrorAs(t, err, &perr)
			require.Len(t, perr.Failed, 1)
			require.Contains(t, perr.Failed, msgs[1].ID)
			tc.check(t, perr.Failed[msgs[1].ID])
			assert.NotErrorIs(t, perr.Failed[msgs[1].ID], outboxplugin.ErrBrokerUnavailable, "a refusal")

			entries := readStream(t, client, prefix+"outbox:Good")
			require.Len(t, entries, 2)
			for i, m := range []outboxplugin.Message{msgs[0], msgs[2]} {
				id, _ := entries[i].field(outboxplugin.HeaderID)
				assert.Equal(t, m.ID, id)
			}
		})
	}
}

// TestPublishKeepsOrderPerStream publishes a large batch over two streams and checks that each
// stream holds its messages in the order of the batch.
func TestPublishKeepsOrderPerStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := streamPrefix(t)
	client := newClient(t, redisAddr)
	pub := newPublisher(t, client, prefixed(prefix))
	msgs := testMessages(prefix, 2000, "A", "B")
	require.NoError(t, pub.Publish(ctx, msgs))

	for _, agg := range []string{"A", "B"} {
		var want []string
		for _, m := range msgs {
			if m.AggregateType == agg {
				want = append(want, m.ID)
			}
		}
		var got []string
		for _, e := range readStream(t, client, prefix+"outbox:"+agg) {
			id, _ := e.field(outboxplugin.HeaderID)
			got = append(got, id)
		}
		assert.Equal(t, want, got, "stream %s", agg)
	}
}

// TestWithMaxLen checks that streams are trimmed to about the maximum length.
func TestWithMaxLen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := streamPrefix(t)
	client := newClient(t, redisAddr)
	pub := newPublisher(t, client, prefixed(prefix), outboxredis.WithMaxLen(50))
	msgs := testMessages(prefix, 2000, "Capped")
	require.NoError(t, pub.Publish(ctx, msgs))

	n, err := client.XLen(ctx, prefix+"outbox:Capped").Result()
	require.NoError(t, err)
	// Approximate trimming removes whole nodes (100 entries by default): at least 50 stay, and far
	// fewer than the 2000 written.
	assert.GreaterOrEqual(t, n, int64(50))
	assert.LessOrEqual(t, n, int64(300))
	last := readStream(t, client, prefix+"outbox:Capped")
	id, _ := last[len(last)-1].field(outboxplugin.HeaderID)
	assert.Equal(t, msgs[len(msgs)-1].ID, id, "trimming drops the oldest entries")
}

// TestConnectionCut publishes through a proxy that is cut: the batch fails as a whole, as not
// delivered (wrapping outboxplugin.ErrBrokerUnavailable), and goes through once the proxy is
// restored.
func TestConnectionCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prefix := streamPrefix(t)
	proxy, err := outboxtest.NewProxy(redisAddr)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { client.Close() })
	pub := newPublisher(t, client, prefixed(prefix))
	msgs := testMessages(prefix, 5, "Cut")
	require.NoError(t, pub.Publish(ctx, msgs[:1]), "the connection is up before the cut")

	proxy.Cut() // drops the pooled connection; new ones are closed at once
	err = pub.Publish(ctx, msgs[1:])
	require.ErrorIs(t, err, outboxplugin.ErrBrokerUnavailable)
	var perr *outboxplugin.PublishError
	assert.False(t, errors.As(err, &perr), "no reply was read: the batch failed as a whole")

	proxy.Restore()
	require.NoError(t, pub.Publish(ctx, msgs[1:]))
	assert.Len(t, readStream(t, newClient(t, redisAddr), prefix+"outbox:Cut"), 5)
}

// TestBrokerOutage puts a proxy between the client and Redis and cuts it while the worker runs: the
// worker's publishes fail as not delivered and are retried without spending an attempt, the client
// reconnects once the proxy is restored, and every event reaches the stream, on its first attempt.
func TestBrokerOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := streamPrefix(t)
	proxy, err := outboxtest.NewProxy(redisAddr)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	client := redis.NewClient(&redis.Options{
		Addr: proxy.Addr(), ContextTimeoutEnabled: true, MaxRetries: 1, DialTimeout: time.Second,
	})
	t.Cleanup(func() { client.Close() })
	pub := newPublisher(t, client, prefixed(prefix))
	db := openDB(t)
	rec := newRecorder()
	w, err := outboxplugin.NewWorker(db, pub,
		outboxplugin.WithoutListen(),
		outboxplugin.WithPollInterval(10*time.Millisecond),
		outboxplugin.WithBatchSize(10),
		outboxplugin.WithPublishTimeout(2*time.Second),
		outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond}),
		outboxplugin.WithMaxAttempts(1000),
		outboxplugin.WithObserver(rec),
		outboxplugin.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	published := func(n int) func() bool {
		return func() bool { p, _, _ := rec.counts(); return p >= n }
	}
	_, err = outboxtest.Fill(ctx, db, 30, outboxtest.FillOptions{AggregateType: "Outage"})
	require.NoError(t, err)
	require.Eventually(t, published(30), 20*time.Second, 5*time.Millisecond, "published before the outage")

	proxy.Cut() // drops the client's pooled connection too
	_, err = outboxtest.Fill(ctx, db, 30, outboxtest.FillOptions{AggregateType: "Outage"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, _, f := rec.counts(); return f >= 30 }, 20*time.Second, 5*time.Millisecond,
		"publishes fail during the outage")
	p, refused, _ := rec.counts()
	require.Equal(t, 30, p, "nothing published while cut")
	require.Zero(t, refused, "a cut connection refuses nothing")

	proxy.Restore()
	require.Eventually(t, published(60), 20*time.Second, 5*time.Millisecond, "published after the outage")

	var events []outboxplugin.OutboxEvent
	require.NoError(t, db.Find(&events).Error)
	require.Len(t, events, 60)
	got := map[string]bool{}
	for _, e := range readStream(t, newClient(t, redisAddr), prefix+"outbox:Outage") {
		id, _ := e.field(outboxplugin.HeaderID)
		got[id] = true
	}
	for _, ev := range events {
		assert.True(t, ev.Processed, "event %d processed", ev.ID)
		assert.True(t, got[ev.MessageID], "event %d in the stream", ev.ID)
		// The failed deliveries of the outage gave their attempt back.
		assert.Equal(t, 1, ev.Attempts, "attempts of event %d", ev.ID)
	}
	_, refused, _ = rec.counts()
	assert.Zero(t, refused, "refused deliveries")
	rec.mu.Lock()
	assert.Zero(t, rec.dead, "dead events")
	rec.mu.Unlock()
}

// blackHole listens on loopback and accepts connections that never answer: a hung server.
func blackHole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestPublishHonoursDeadline publishes to a server that never answers: Publish returns at the
// context's deadline with the batch failed, whether or not the client bounds its I/O by the context.
func TestPublishHonoursDeadline(t *testing.T) {
	for _, bounded := range []bool{true, false} {
		t.Run("ContextTimeoutEnabled="+strconv.FormatBool(bounded), func(t *testing.T) {
			addr := blackHole(t)
			client := redis.NewClient(&redis.Options{
				Addr: addr, ContextTimeoutEnabled: bounded,
				ReadTimeout: time.Second, WriteTimeout: time.Second, DialTimeout: time.Second, MaxRetries: -1,
			})
			t.Cleanup(func() { client.Close() })
			pub, err := outboxredis.New(client)
			require.NoError(t, err)

			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = pub.Publish(ctx, testMessages("deadline:", 10, "Hung"))
			took := time.Since(start)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.ErrorIs(t, err, outboxplugin.ErrBrokerUnavailable, "no reply is no refusal")
			var perr *outboxplugin.PublishError
			assert.False(t, errors.As(err, &perr), "no reply was read: the batch failed as a whole")
			assert.Less(t, took, 700*time.Millisecond, "Publish returned at the deadline")

			// Close waits for an abandoned pipeline, which ends within the client's timeouts.
			require.NoError(t, pub.Close())
			assert.ErrorIs(t, pub.Publish(context.Background(), testMessages("deadline:", 1, "Hung")), outboxredis.ErrClosed)
		})
	}
}

// TestPublishEndedContext checks that a context that has already ended sends nothing.
func TestPublishEndedContext(t *testing.T) {
	prefix := streamPrefix(t)
	client := newClient(t, redisAddr)
	pub := newPublisher(t, client, prefixed(prefix))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, pub.Publish(ctx, testMessages(prefix, 3, "Ended")), context.Canceled)
	n, err := client.Exists(context.Background(), prefix+"outbox:Ended").Result()
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.NoError(t, pub.Publish(ctx, nil), "an empty batch needs no round trip")
}

// TestNewRejectsInvalidOptions checks that New refuses what cannot work, with ErrInvalidOption.
func TestNewRejectsInvalidOptions(t *testing.T) {
	client := newClient(t, redisAddr)
	cases := []struct {
		name   string
		client redis.UniversalClient
		opts   []outboxredis.Option
	}{
		{"nil client", nil, nil},
		{"nil stream function", client, []outboxredis.Option{outboxredis.WithStream(nil)}},
		{"zero max length", client, []outboxredis.Option{outboxredis.WithMaxLen(0)}},
		{"negative max length", client, []outboxredis.Option{outboxredis.WithMaxLen(-10)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := outboxredis.New(tc.client, tc.opts...)
			require.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
			assert.Nil(t, pub)
			assert.ErrorContains(t, err, "outboxredis:")
		})
	}
	pub, err := outboxredis.New(client, nil, outboxredis.WithMaxLen(1))
	require.NoError(t, err, "nil options are skipped")
	require.NotNil(t, pub)
}

// TestDefaultStream checks the default destination, outbox:<aggregate>.
func TestDefaultStream(t *testing.T) {
	cases := map[string]outboxplugin.Message{
		"outbox:User":        {AggregateType: "User", EventType: "User_create"},
		"outbox:_":           {EventType: "OrderPlaced"},
		"outbox:billing_Inv": {AggregateType: "billing.Inv", EventType: "x"},
	}
	for want, m := range cases {
		assert.Equal(t, want, outboxredis.DefaultStream(m))
	}
}

// TestPublishDeadlineMidPipeline has Redis answer only the first replies of a pipeline before the
// deadline: the messages whose replies arrived count as published and only the others fail, so the
// worker re-sends only those, whether go-redis may retry the pipeline or not.
func TestPublishDeadlineMidPipeline(t *testing.T) {
	for _, retries := range []int{-1, 3} {
		t.Run("MaxRetries="+strconv.Itoa(retries), func(t *testing.T) {
			prefix := streamPrefix(t)
			gate := newReplyGate(t, redisAddr)
			client := redis.NewClient(&redis.Options{
				Addr: gate.Addr(), ContextTimeoutEnabled: true, MaxRetries: retries, PoolSize: 1,
			})
			t.Cleanup(func() { client.Close() })
			pub := newPublisher(t, client, prefixed(prefix))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.NoError(t, client.Ping(ctx).Err()) // the connection is up before the gate is armed

			gate.Pass(4)
			msgs := testMessages(prefix, 10, "Gated")
			pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer pcancel()
			err := pub.Publish(pctx, msgs)
			var perr *outboxplugin.PublishError
			require.ErrorAs(t, err, &perr)
			require.Len(t, perr.Failed, 6)
			for _, m := range msgs[4:] {
				require.Contains(t, perr.Failed, m.ID)
				assert.ErrorContains(t, perr.Failed[m.ID], "timeout")
				assert.ErrorIs(t, perr.Failed[m.ID], outboxplugin.ErrBrokerUnavailable)
			}

			// Redis executed every XADD; only its replies were held back.
			assert.Len(t, readStream(t, newClient(t, redisAddr), prefix+"outbox:Gated"), 10)
		})
	}
}
