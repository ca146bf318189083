package outboxrabbitmq_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

type Order struct {
	ID   uint
	Item string
}

// dial opens a publisher, closed when the test ends.
func dial(t *testing.T, url string, opts ...outboxrabbitmq.Option) *outboxrabbitmq.Publisher {
	t.Helper()
	pub, err := outboxrabbitmq.Dial(url, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pub.Close()) })
	return pub
}

// publishError returns the failures of a partly failed batch.
func publishError(t *testing.T, err error) map[string]error {
	t.Helper()
	var perr *outboxplugin.PublishError
	require.ErrorAs(t, err, &perr)
	return perr.Failed
}

func TestEndToEnd(t *testing.T) {
	ctx := withTimeout(t, 30*time.Second)
	b := newBroker(t)
	exchange := b.exchange()
	queue := b.queue(exchange, nil, "#")

	db := openDB(t)
	require.NoError(t, db.Use(outboxplugin.New()))
	require.NoError(t, db.AutoMigrate(&Order{}))
	require.NoError(t, db.WithContext(ctx).Create(&Order{Item: "book"}).Error)
	require.NoError(t, db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return outboxplugin.Emit(tx, "Order shipped", map[string]any{"order": 1, "carrier": "post"},
			outboxplugin.WithAggregate("Order", "1"),
			outboxplugin.WithHeaders(map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}))
	}))
	var events []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&events).Error)
	require.Len(t, events, 2)

	pub := dial(t, brokerURL(), outboxrabbitmq.WithExchange(exchange))
	w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithoutListen())
	require.NoError(t, err)
	n, err := w.ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	got := b.receive(queue, 2, 10*time.Second)
	byID := map[string]amqp.Delivery{}
	for _, d := range got {
		byID[d.MessageId] = d
	}
	wantKeys := map[string]string{events[0].MessageID: "Order.Order_create", events[1].MessageID: "Order.Order_shipped"}
	msgs, err := outboxtest.Messages(events)
	require.NoError(t, err)
	for _, m := range msgs {
		d, ok := byID[m.ID]
		require.True(t, ok, "event %s not delivered", m.ID)
		assert.Equal(t, exchange, d.Exchange)
		assert.Equal(t, wantKeys[m.ID], d.RoutingKey, "default routing key <aggregate>.<event>")
		assert.Equal(t, m.EventType, d.Type)
		assert.Equal(t, "application/json", d.ContentType)
		assert.Equal(t, amqp.Persistent, d.DeliveryMode)
		assert.Equal(t, m.CreatedAt.Unix(), d.Timestamp.Unix())
		assert.JSONEq(t, string(m.Payload), string(d.Body))

		want := amqp.Table{}
		for _, h := range m.HeaderList() {
			want[h.Key] = h.Value
		}
		assert.Equal(t, want, d.Headers)
		assert.Equal(t, m.ID, d.Headers[outboxplugin.HeaderID])
		assert.Equal(t, "Order:1", d.Headers[outboxplugin.HeaderKey])
		assert.Equal(t, m.CreatedAt.Format(time.RFC3339Nano), d.Headers[outboxplugin.HeaderCreatedAt])
		assert.Equal(t, "1", d.Headers[outboxplugin.HeaderAttempt])
	}
	assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", byID[events[1].MessageID].Headers["traceparent"])

	var pending int64
	require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", false).Count(&pending).Error)
	assert.Zero(t, pending, "published events are marked processed")
}

func TestDefaultTopology(t *testing.T) {
	b := newBroker(t)
	exchange := b.exchange()
	dial(t, brokerURL(), outboxrabbitmq.WithExchange(exchange))
	// The exchange exists, durable and of kind topic: redeclaring it so succeeds, as another kind fails.
	require.NoError(t, b.ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil))
	ch := b.channel()
	err := ch.ExchangeDeclare(exchange, amqp.ExchangeDirect, true, false, false, false, nil)
	var aerr *amqp.Error
	require.ErrorAs(t, err, &aerr)
	assert.Equal(t, amqp.PreconditionFailed, aerr.Code)

	t.Run("conflicting exchange", func(t *testing.T) {
		direct := b.exchange()
		require.NoError(t, b.ch.ExchangeDeclare(direct, amqp.ExchangeDirect, true, false, false, false, nil))
		_, err := outboxrabbitmq.Dial(brokerURL(), outboxrabbitmq.WithExchange(direct))
		require.ErrorAs(t, err, &aerr)
		assert.Equal(t, amqp.PreconditionFailed, aerr.Code)
		assert.ErrorContains(t, err, "outboxrabbitmq: declare topology")
	})

	t.Run("custom topology and route", func(t *testing.T) {
		custom, declared := b.exchange(), make(chan struct{}, 1)
		pub := dial(t, brokerURL(),
			outboxrabbitmq.WithTopology(func(ch *amqp.Channel) error {
				declared <- struct{}{}
				return ch.ExchangeDeclare(custom, amqp.ExchangeTopic, true, false, false, false, nil)
			}),
			outboxrabbitmq.WithRoute(func(m outboxplugin.Message) (string, string) { return custom, m.Key }),
			outboxrabbitmq.WithMandatory(false))
		select {
		case <-declared:
		default:
			t.Fatal("Dial did not run the topology function")
		}
		queue := b.queue(custom, nil, "Custom:1")
		msgs := testMessages(3, "Custom")
		require.NoError(t, pub.Publish(withTimeout(t, 10*time.Second), msgs))
		got := b.receive(queue, 1, 5*time.Second)
		assert.Equal(t, msgs[1].ID, got[0].MessageId, "only the message whose key is bound is routed")
		assert.Equal(t, "Custom:1", got[0].RoutingKey)
		assert.Equal(t, 0, b.count(queue))
	})
}

func TestNackedMessagesFail(t *testing.T) {
	ctx := withTimeout(t, 30*time.Second)
	b := newBroker(t)
	exchange := b.exchange()
	// A queue that takes three messages and makes the broker nack the rest.
	queue := b.queue(exchange, amqp.Table{"x-max-length": 3, "x-overflow": "reject-publish"}, "#")
	pub := dial(t, brokerURL(), outboxrabbitmq.WithExchange(exchange))

	msgs := testMessages(10, "Nack")
	failed := publishError(t, pub.Publish(ctx, msgs))
	require.Len(t, failed, 7)
	for _, m := range msgs[3:] {
		assert.ErrorIs(t, failed[m.ID], outboxrabbitmq.ErrNacked, m.ID)
		assert.NotErrorIs(t, failed[m.ID], outboxplugin.ErrBrokerUnavailable, "a nack is a refusal")
	}
	assert.Equal(t, ids(b.receive(queue, 3, 5*time.Second)), []string{msgs[0].ID, msgs[1].ID, msgs[2].ID},
		"the messages not reported failed are the ones the queue holds")

	// The queue has room again: the failed ones go through on retry, on the same publisher.
	retry := msgs[3:6]
	require.NoError(t, pub.Publish(ctx, retry))
	assert.Equal(t, ids(b.receive(queue, 3, 5*time.Second)), []string{retry[0].ID, retry[1].ID, retry[2].ID})
}

func TestUnroutableMessages(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []outboxrabbitmq.Option
		reported bool
	}{
		{name: "mandatory by default", reported: true},
		{name: "WithMandatory(false)", opts: []outboxrabbitmq.Option{outboxrabbitmq.WithMandatory(false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := withTimeout(t, 30*time.Second)
			b := newBroker(t)
			exchange := b.exchange()
			queue := b.queue(exchange, nil, "Bound.*")
			pub := dial(t, brokerURL(), append(tc.opts, outboxrabbitmq.WithExchange(exchange))...)

			var msgs, bound []outboxplugin.Message
			for i, m := range testMessages(20, "Bound") {
				if i%2 == 1 {
					m.AggregateType, m.EventType = "Unbound", "Unbound_create"
				} else {
					bound = append(bound, m)
				}
				msgs = append(msgs, m)
			}
			err := pub.Publish(ctx, msgs)
			if tc.reported {
				failed := publishError(t, err)
				assert.Len(t, failed, 10)
				for i, m := range msgs {
					if i%2 == 1 {
						assert.ErrorIs(t, failed[m.ID], outboxrabbitmq.ErrUnroutable)
						assert.ErrorContains(t, failed[m.ID], "NO_ROUTE")
						assert.NotErrorIs(t, failed[m.ID], outboxplugin.ErrBrokerUnavailable, "a return is not an outage")
						assert.ErrorIs(t, failed[m.ID], outboxplugin.ErrMisconfigured, "a return is a configuration error: a binding is missing")
						assert.ErrorContains(t, failed[m.ID], exchange)
					}
				}
			} else {
				assert.NoError(t, err, "unroutable messages are dropped by the broker")
			}
			var want []string
			for _, m := range bound {
				want = append(want, m.ID)
			}
			assert.Equal(t, want, ids(b.receive(queue, len(bound), 5*time.Second)))
		})
	}
}

// TestChannelClosedByBroker routes a message to an exchange that does not exist, which makes the
// broker close the channel: a configuration error of the messages routed to that exchange (the
// broker names it), the other unconfirmed messages not delivered; the next batch goes out on a new
// channel, and a worker publishes the others and keeps the one at fault pending, no attempt spent,
// its Health naming the cause.
func TestChannelClosedByBroker(t *testing.T) {
	ctx := withTimeout(t, 60*time.Second)
	b := newBroker(t)
	exchange := b.exchange()
	queue := b.queue(exchange, nil, "#")
	missing := rabbitName("missing")
	pub := dial(t, brokerURL(), outboxrabbitmq.WithExchange(exchange),
		outboxrabbitmq.WithRoute(func(m outboxplugin.Message) (string, string) {
			if m.AggregateType == "Missing" {
				return missing, "x"
			}
			return exchange, "ok"
		}))

	msgs := testMessages(3, "Present")
	msgs[1].AggregateType = "Missing"
	err := pub.Publish(ctx, msgs)
	require.ErrorIs(t, err, outboxrabbitmq.ErrChannelClosed)
	var aerr *amqp.Error
	require.ErrorAs(t, err, &aerr, "the broker's reason is kept")
	assert.Equal(t, amqp.NotFound, aerr.Code)
	assert.NotErrorIs(t, err, outboxplugin.ErrBrokerUnavailable, "the broker refused something")
	assert.NotErrorIs(t, err, outboxplugin.ErrMisconfigured, "a mixed batch is split, to publish the others")
	var perr *outboxplugin.PublishError
	assert.False(t, errors.As(err, &perr), "a whole-batch error: the broker does not say which message")

	// Alone — or with others routed to the same exchange — the message is at fault: a configuration
	// error, naming the exchange and the broker.
	failed := publishError(t, pub.Publish(ctx, msgs[1:2]))
	require.Len(t, failed, 1)
	err = failed[msgs[1].ID]
	assert.ErrorIs(t, err, outboxrabbitmq.ErrChannelClosed)
	assert.ErrorIs(t, err, outboxplugin.ErrMisconfigured, "a missing exchange is a configuration error")
	assert.ErrorContains(t, err, missing, "names the exchange")
	assert.ErrorContains(t, err, brokerAddr(t), "names the broker")

	// The next batch goes out on a new channel.
	next := testMessages(2, "Present")
	require.NoError(t, pub.Publish(ctx, next))

	// Through a worker: the others are published, the one at fault stays pending, no attempt spent.
	db := openDB(t)
	require.NoError(t, db.Use(outboxplugin.New()))
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		for i, agg := range []string{"Present", "Present", "Missing", "Present", "Present"} {
			if err := outboxplugin.Emit(tx, "Tested", map[string]int{"n": i}, outboxplugin.WithAggregate(agg, strconv.Itoa(i))); err != nil {
				return err
			}
		}
		return nil
	}))
	w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithoutListen(), outboxplugin.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	published := 0
	for round := 0; round < 10 && published < 4; round++ {
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		published += n
	}
	assert.Equal(t, 4, published)
	_, err = w.ProcessOnce(ctx) // the one at fault alone: nothing else published
	require.NoError(t, err)
	assert.ErrorIs(t, w.Health(), outboxplugin.ErrMisconfigured)
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&rows).Error)
	require.Len(t, rows, 5)
	for i, r := range rows {
		if i != 2 {
			assert.True(t, r.Processed, "event %d", i)
			continue
		}
		assert.False(t, r.Processed, "the event at fault")
		assert.Zero(t, r.Attempts, "a configuration error spends no attempt")
		assert.Nil(t, r.DeadAt)
		require.NotNil(t, r.LastError)
		assert.Contains(t, *r.LastError, "NOT_FOUND")
	}

	// Confirmed messages are in the queue: its count is final.
	got := ids(b.receive(queue, b.count(queue), 5*time.Second))
	for _, m := range next {
		assert.Contains(t, got, m.ID, "a message reported published is delivered")
	}
	for i, r := range rows {
		if i != 2 {
			assert.Contains(t, got, r.MessageID, "event %d published by the worker is delivered", i)
		}
	}
	assert.NotContains(t, got, msgs[1].ID)
	assert.NotContains(t, got, rows[2].MessageID)
}

func TestContextDeadline(t *testing.T) {
	b := newBroker(t)
	exchange := b.exchange()
	queue := b.queue(exchange, nil, "#")
	proxy, err := outboxtest.NewProxy(brokerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	pub := dial(t, viaProxy(t, proxy.Addr()), outboxrabbitmq.WithExchange(exchange))

	t.Run("broker that never confirms", func(t *testing.T) {
		proxy.Mute(true)
		msgs := testMessages(50, "Slow")
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := pub.Publish(ctx, msgs)
		took := time.Since(start)
		proxy.Mute(false)
		assert.Less(t, took, 2*time.Second, "Publish returns at the deadline")
		failed := publishError(t, err)
		require.Len(t, failed, len(msgs), "no message was confirmed")
		for _, m := range msgs {
			assert.ErrorIs(t, failed[m.ID], context.DeadlineExceeded)
			assert.ErrorIs(t, failed[m.ID], outboxplugin.ErrBrokerUnavailable, "no confirmation is no refusal")
		}

		// The timed-out connection was closed; the next Publish reconnects and succeeds.
		require.NoError(t, pub.Publish(withTimeout(t, 10*time.Second), msgs))
		got := b.receive(queue, len(msgs), 5*time.Second)
		for _, m := range msgs {
			assert.Contains(t, ids(got), m.ID)
		}
		time.Sleep(100 * time.Millisecond) // copies of the first attempt, if the broker had taken them
		b.receive(queue, b.count(queue), time.Second)
	})

	t.Run("context already ended", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		msgs := testMessages(5, "Cancelled")
		err := pub.Publish(ctx, msgs)
		assert.ErrorIs(t, err, context.Canceled)
		var perr *outboxplugin.PublishError
		assert.False(t, errors.As(err, &perr), "the whole batch failed")
		time.Sleep(100 * time.Millisecond)
		assert.Equal(t, 0, b.count(queue), "nothing was sent")
	})
}

func TestOptionsRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  string
		cfg  amqp.Config
		opts []outboxrabbitmq.Option
	}{
		{name: "nil route", opts: []outboxrabbitmq.Option{outboxrabbitmq.WithRoute(nil)}},
		{name: "nil topology", opts: []outboxrabbitmq.Option{outboxrabbitmq.WithTopology(nil)}},
		{name: "empty exchange", opts: []outboxrabbitmq.Option{outboxrabbitmq.WithExchange("")}},
		{name: "nil option", opts: []outboxrabbitmq.Option{nil}},
		{name: "bad url", url: "http://127.0.0.1:5672/"},
		{name: "library recovery", cfg: amqp.Config{Recovery: &amqp.Recovery{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url
			if url == "" {
				url = brokerURL()
			}
			pub, err := outboxrabbitmq.DialConfig(url, tc.cfg, tc.opts...)
			assert.Nil(t, pub)
			assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
			assert.ErrorContains(t, err, "outboxrabbitmq:")
		})
	}

	t.Run("unreachable broker", func(t *testing.T) {
		proxy, err := outboxtest.NewProxy(brokerAddr(t))
		require.NoError(t, err)
		defer proxy.Close()
		proxy.Cut()
		_, err = outboxrabbitmq.Dial(viaProxy(t, proxy.Addr()))
		assert.ErrorContains(t, err, "outboxrabbitmq: connect")
	})
}

// TestConnectionLost cuts the connection while a batch waits for its confirmations: the unconfirmed
// messages fail with ErrConnectionLost, as not delivered (wrapping outboxplugin.ErrBrokerUnavailable);
// while the connection cannot be made, a batch fails as a whole, not delivered either.
func TestConnectionLost(t *testing.T) {
	ctx := withTimeout(t, 30*time.Second)
	b := newBroker(t)
	exchange := b.exchange()
	queue := b.queue(exchange, nil, "#")
	proxy, err := outboxtest.NewProxy(brokerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	pub := dial(t, viaProxy(t, proxy.Addr()), outboxrabbitmq.WithExchange(exchange))

	// The broker takes the batch, but its confirmations are held back until the cut drops them.
	proxy.Mute(true)
	msgs := testMessages(5, "Lost")
	published := make(chan error, 1)
	go func() { published <- pub.Publish(ctx, msgs) }()
	require.Eventually(t, func() bool { return b.count(queue) == len(msgs) }, 10*time.Second, 5*time.Millisecond, "the broker got the batch")
	proxy.Cut()
	failed := publishError(t, <-published)
	require.Len(t, failed, len(msgs))
	for _, m := range msgs {
		assert.ErrorIs(t, failed[m.ID], outboxrabbitmq.ErrConnectionLost)
		assert.ErrorIs(t, failed[m.ID], outboxplugin.ErrBrokerUnavailable)
	}

	err = pub.Publish(ctx, msgs)
	require.ErrorIs(t, err, outboxplugin.ErrBrokerUnavailable, "no connection can be made")
	var perr *outboxplugin.PublishError
	assert.False(t, errors.As(err, &perr), "a whole-batch error")

	proxy.Mute(false)
	proxy.Restore()
	require.NoError(t, pub.Publish(ctx, msgs), "the next Publish reconnects")
	assert.Len(t, b.receive(queue, 2*len(msgs), 5*time.Second), 2*len(msgs), "both copies: RabbitMQ does not de-duplicate")
}

func TestClose(t *testing.T) {
	b := newBroker(t)
	exchange := b.exchange()
	b.queue(exchange, nil, "#")
	pub, err := outboxrabbitmq.Dial(brokerURL(), outboxrabbitmq.WithExchange(exchange))
	require.NoError(t, err)
	require.NoError(t, pub.Publish(withTimeout(t, 10*time.Second), testMessages(1, "Close")))
	require.NoError(t, pub.Close())
	assert.ErrorIs(t, pub.Publish(withTimeout(t, 10*time.Second), testMessages(1, "Close")), outboxrabbitmq.ErrClosed)
	assert.NoError(t, pub.Close(), "a second Close does nothing")
}

// TestBrokerOutage cuts the connection between the publisher and the broker while a worker drains
// the outbox, and restores it: the worker retries without spending attempts, and every event
// arrives.
func TestBrokerOutage(t *testing.T) {
	const events = 3000
	ctx := withTimeout(t, 90*time.Second)
	b := newBroker(t)
	exchange := b.exchange()
	queue := b.queue(exchange, nil, "#")
	proxy, err := outboxtest.NewProxy(brokerAddr(t))
	require.NoError(t, err)
	defer proxy.Close()
	pub := dial(t, viaProxy(t, proxy.Addr()), outboxrabbitmq.WithExchange(exchange))

	db := openDB(t)
	written, err := outboxtest.Fill(ctx, db, events, outboxtest.FillOptions{})
	require.NoError(t, err)

	// Count deliveries per id, on a connection of the test's own that the proxy does not carry.
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	consumer := b.channel()
	deliveries, err := consumer.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for d := range deliveries {
			mu.Lock()
			seen[d.MessageId]++
			mu.Unlock()
		}
	}()
	unique := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %s (%d of %d delivered)", what, unique(), events)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}

	obs := &failureCounter{}
	w, err := outboxplugin.NewWorker(db, pub,
		outboxplugin.WithoutListen(),
		outboxplugin.WithPollInterval(5*time.Millisecond),
		outboxplugin.WithBatchSize(50),
		outboxplugin.WithPublishTimeout(2*time.Second),
		outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond}),
		outboxplugin.WithMaxAttempts(1000),
		outboxplugin.WithObserver(obs),
		outboxplugin.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()

	waitFor("first deliveries", func() bool { return unique() >= events/5 })
	proxy.Cut()
	// What the broker had taken before the cut still reaches the consumer: wait until that stops.
	before := -1
	waitFor("deliveries to settle", func() bool {
		n := unique()
		settled := n == before
		before = n
		time.Sleep(150 * time.Millisecond)
		return settled
	})
	time.Sleep(400 * time.Millisecond)
	assert.Equal(t, before, unique(), "nothing goes through a cut connection")
	proxy.Restore()
	waitFor("every event", func() bool { return unique() == events })
	waitFor("every event marked processed", func() bool {
		var pending int64
		return db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", false).Count(&pending).Error == nil && pending == 0
	})
	stop()
	require.NoError(t, <-ran)
	require.NoError(t, consumer.Close())
	<-consumed

	refused, notDelivered, dead := obs.counts()
	assert.Positive(t, notDelivered, "the worker saw deliveries fail during the outage and retried them")
	assert.Zero(t, refused, "a cut connection refuses nothing")
	assert.Zero(t, dead, "dead events")
	var spent int64
	require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("attempts <> 1").Count(&spent).Error)
	assert.Zero(t, spent, "events whose attempts are not 1 once published: the outage spent attempts")
	mu.Lock()
	defer mu.Unlock()
	duplicates := 0
	for _, e := range written {
		require.Positive(t, seen[e.MessageID], "event %s lost", e.MessageID)
		duplicates += seen[e.MessageID] - 1
	}
	t.Logf("%d events delivered, %d duplicates, %d deliveries not made and retried", events, duplicates, notDelivered)
}

// failureCounter counts the messages whose delivery failed: refused, or not delivered; and the dead.
type failureCounter struct {
	outboxplugin.NopObserver
	mu                          sync.Mutex
	refused, notDelivered, dead int
}

func (c *failureCounter) BatchDone(_ context.Context, r outboxplugin.BatchResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refused += len(r.Failed)
	c.notDelivered += len(r.NotDelivered)
}

func (c *failureCounter) Dead(context.Context, outboxplugin.Message, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dead++
}

func (c *failureCounter) counts() (refused, notDelivered, dead int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused, c.notDelivered, c.dead
}

// TestConcurrentWorkers shares one publisher between two workers: each batch gets its own
// confirmations, and every event is delivered once.
func TestConcurrentWorkers(t *testing.T) {
	const events = 2000
	ctx := withTimeout(t, 60*time.Second)
	b := newBroker(t)
	exchange := b.exchange()
	queue := b.queue(exchange, nil, "#")
	pub := dial(t, brokerURL(), outboxrabbitmq.WithExchange(exchange))
	db := openDB(t)
	written, err := outboxtest.Fill(ctx, db, events, outboxtest.FillOptions{})
	require.NoError(t, err)
	_, err = outboxtest.DrainWith(ctx, db, pub, events, 2, outboxplugin.WithBatchSize(50))
	require.NoError(t, err)
	got := ids(b.receive(queue, events, 10*time.Second))
	slices.Sort(got)
	want := make([]string, len(written))
	for i, e := range written {
		want[i] = e.MessageID
	}
	slices.Sort(want)
	assert.Equal(t, want, got)
	assert.Equal(t, 0, b.count(queue), "no duplicates")
}
