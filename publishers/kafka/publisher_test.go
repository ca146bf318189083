package outboxkafka_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	outboxkafka "github.com/gorm-outbox/outboxplugin/publishers/kafka"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"gorm.io/gorm"
)

// Order is a business model whose writes the plugin captures.
type Order struct {
	ID     uint
	Status string
}

// TestEndToEnd writes an order through GORM with the plugin registered, relays its events with a
// Worker and the Publisher, and reads them back from Kafka.
func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cluster := newCluster(t, []string{"outbox.Order"}) // the default topic of the Order aggregate
	db := openDB(t)
	require.NoError(t, db.AutoMigrate(&Order{}))

	order := Order{Status: "new"}
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		return outboxplugin.Emit(tx, "OrderPlaced", map[string]any{"total": 42},
			outboxplugin.WithAggregate("Order", strconv.Itoa(int(order.ID))),
			outboxplugin.WithHeaders(map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a-first": "1"}))
	}))
	require.NoError(t, db.Model(&order).Update("status", "paid").Error)
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&rows).Error)
	require.Len(t, rows, 3) // Order_create, OrderPlaced, Order_update

	pub, err := outboxkafka.New(newProducer(t, cluster))
	require.NoError(t, err)
	n, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	records := consume(ctx, t, cluster, "outbox.Order", 3)
	require.Len(t, records, 3)
	wantKey := "Order:" + strconv.Itoa(int(order.ID))
	for i, row := range rows {
		r := records[i] // one key, so one partition, in the order written
		h := headerMap(t, r)
		require.Equal(t, row.MessageID, h[outboxplugin.HeaderID], "record %d is not event %d", i, row.ID)
		require.Equal(t, wantKey, string(r.Key))
		require.Equal(t, records[0].Partition, r.Partition)
		require.Equal(t, row.EventType, h[outboxplugin.HeaderEventType])
		require.Equal(t, wantKey, h[outboxplugin.HeaderKey])
		require.Equal(t, "Order", h[outboxplugin.HeaderAggregateType])
		require.Equal(t, strconv.Itoa(int(order.ID)), h[outboxplugin.HeaderAggregateID])
		require.Equal(t, "1", h[outboxplugin.HeaderAttempt])
		created, err := time.Parse(time.RFC3339Nano, h[outboxplugin.HeaderCreatedAt])
		require.NoError(t, err)
		require.True(t, created.Equal(row.CreatedAt), "created-at %v, row %v", created, row.CreatedAt)
		require.True(t, r.Timestamp.Equal(row.CreatedAt.Truncate(time.Millisecond)), "timestamp %v, row %v", r.Timestamp, row.CreatedAt)
		require.JSONEq(t, string(row.Payload), string(r.Value))
	}
	// The event's own headers come first, sorted, then the outbox's.
	placed := records[1].Headers
	require.Equal(t, []string{"a-first", "traceparent", outboxplugin.HeaderID, outboxplugin.HeaderEventType,
		outboxplugin.HeaderKey, outboxplugin.HeaderAggregateType, outboxplugin.HeaderAggregateID,
		outboxplugin.HeaderCreatedAt, outboxplugin.HeaderAttempt}, headerNames(placed))
	require.Equal(t, "OrderPlaced", headerMap(t, records[1])[outboxplugin.HeaderEventType])
	require.JSONEq(t, `{"total":42}`, string(records[1].Value))

	var pending int64
	require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", false).Count(&pending).Error)
	require.Zero(t, pending)
}

func headerNames(hs []kgo.RecordHeader) []string {
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = h.Key
	}
	return names
}

func TestDefaultTopic(t *testing.T) {
	for _, tc := range []struct {
		aggregate, want string
	}{
		{"User", "outbox.User"},
		{"", "outbox._"},
		{"order line.v2", "outbox.order_line_v2"},
		{"Invoice-7", "outbox.Invoice-7"},
	} {
		require.Equal(t, tc.want, outboxkafka.DefaultTopic(outboxplugin.Message{AggregateType: tc.aggregate, EventType: "X"}), tc.aggregate)
	}
}

// TestWithTopic routes by event type, sends a message without a key as a record without a key, and
// fails a message without a topic.
func TestWithTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prefix := "events-" + suffix(t) + "."
	cluster := newCluster(t, []string{prefix + "Shipped", prefix + "Paid"})
	pub, err := outboxkafka.New(newProducer(t, cluster), outboxkafka.WithTopic(func(m outboxplugin.Message) string {
		if m.EventType == "Nowhere" {
			return "" // and the client has no default topic
		}
		return prefix + m.EventType
	}))
	require.NoError(t, err)
	msgs := []outboxplugin.Message{
		{ID: "m-1", EventType: "Shipped", Payload: []byte(`{}`), CreatedAt: time.Now().UTC(), Attempt: 1},
		{ID: "m-2", EventType: "Paid", Key: "Order:9", AggregateType: "Order", AggregateID: "9", Payload: []byte(`{"n":2}`), CreatedAt: time.Now().UTC(), Attempt: 3},
		{ID: "m-3", EventType: "Nowhere", Payload: []byte(`{}`), CreatedAt: time.Now().UTC(), Attempt: 1},
	}
	var pe *outboxplugin.PublishError
	require.ErrorAs(t, pub.Publish(ctx, msgs), &pe)
	require.Len(t, pe.Failed, 1)
	require.Error(t, pe.Failed["m-3"])
	require.NotErrorIs(t, pe.Failed["m-3"], outboxplugin.ErrBrokerUnavailable, "a record without a topic is refused")

	shipped := consume(ctx, t, cluster, prefix+"Shipped", 1)
	require.Len(t, shipped, 1)
	require.Nil(t, shipped[0].Key)
	require.Equal(t, "m-1", headerMap(t, shipped[0])[outboxplugin.HeaderID])
	require.NotContains(t, headerMap(t, shipped[0]), outboxplugin.HeaderKey)
	paid := consume(ctx, t, cluster, prefix+"Paid", 1)
	require.Len(t, paid, 1)
	require.Equal(t, "Order:9", string(paid[0].Key))
	require.Equal(t, "3", headerMap(t, paid[0])[outboxplugin.HeaderAttempt])
	require.Equal(t, `{"n":2}`, string(paid[0].Value))
}

// TestPartlyFailedBatch relays a batch in which Kafka refuses one record (a topic the producer may
// not write: a configuration error) and the client refuses another (larger than a batch may be):
// only those two stay pending, with their error, and the others are published and marked done.
func TestPartlyFailedBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sfx := suffix(t)
	okAgg, deniedAgg := "Ok"+sfx, "Denied"+sfx
	okTopic, deniedTopic := "outbox."+okAgg, "outbox."+deniedAgg
	cluster := newCluster(t, []string{okTopic, deniedTopic})
	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: deniedTopic, Err: kerr.TopicAuthorizationFailed, Count: -1})
	db := openDB(t)

	huge := `{"pad":"` + strings.Repeat("x", 2<<20) + `"}`
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		for _, e := range []struct {
			agg, id, payload string
		}{{okAgg, "1", `{"n":1}`}, {deniedAgg, "2", `{"n":2}`}, {okAgg, "3", huge}, {okAgg, "4", `{"n":4}`}} {
			if err := outboxplugin.Emit(tx, "Tested", []byte(e.payload), outboxplugin.WithAggregate(e.agg, e.id)); err != nil {
				return err
			}
		}
		return nil
	}))
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&rows).Error)
	require.Len(t, rows, 4)

	pub, err := outboxkafka.New(newProducer(t, cluster))
	require.NoError(t, err)
	var failed []outboxplugin.FailedMessage
	obs := observerFunc(func(r outboxplugin.BatchResult) { failed = append(append(failed, r.Failed...), r.NotDelivered...) })
	n, err := mustWorker(t, db, pub, outboxplugin.WithoutListen(), outboxplugin.WithObserver(obs), quiet).ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	errOf := map[string]error{}
	for _, f := range failed {
		errOf[f.Message.ID] = f.Err
	}
	require.Len(t, errOf, 2)
	require.ErrorIs(t, errOf[rows[1].MessageID], kerr.TopicAuthorizationFailed)
	require.ErrorIs(t, errOf[rows[1].MessageID], outboxplugin.ErrMisconfigured, "a permission refused: a configuration error")
	require.ErrorIs(t, errOf[rows[2].MessageID], kerr.MessageTooLarge)
	require.NotErrorIs(t, errOf[rows[2].MessageID], outboxplugin.ErrMisconfigured)
	for id, err := range errOf {
		require.NotErrorIs(t, err, outboxplugin.ErrBrokerUnavailable, "%s was refused", id)
	}

	require.NoError(t, db.Order("id").Find(&rows).Error)
	for i, want := range []bool{true, false, false, true} {
		require.Equal(t, want, rows[i].Processed, "event %d", i)
		require.Equal(t, !want, rows[i].LastError != nil, "event %d", i)
	}
	records := consume(ctx, t, cluster, okTopic, 2)
	ids := []string{headerMap(t, records[0])[outboxplugin.HeaderID], headerMap(t, records[1])[outboxplugin.HeaderID]}
	require.ElementsMatch(t, []string{rows[0].MessageID, rows[3].MessageID}, ids)
}

// quiet keeps the worker's warnings about the failures a test provokes out of the test output.
var quiet = outboxplugin.WithLogger(slog.New(slog.DiscardHandler))

// observerFunc is an Observer that hands every batch result to a function.
type observerFunc func(outboxplugin.BatchResult)

func (f observerFunc) BatchDone(_ context.Context, r outboxplugin.BatchResult) { f(r) }
func (observerFunc) Dead(context.Context, outboxplugin.Message, error)         {}
func (observerFunc) Backlog(context.Context, int64)                            {}

// TestNotDeliveredOrRefused checks which record failures Publish reports as not delivered (wrapping
// outboxplugin.ErrBrokerUnavailable: the worker spends no attempt on them) and which as refused.
func TestNotDeliveredOrRefused(t *testing.T) {
	msg := func(id, topic string) outboxplugin.Message {
		return outboxplugin.Message{ID: id, EventType: "Tested", AggregateType: topic, Payload: []byte(`{}`), CreatedAt: time.Now().UTC(), Attempt: 1}
	}
	byTopic := outboxkafka.WithTopic(func(m outboxplugin.Message) string { return m.AggregateType })
	// Retry and refresh metadata at once, so that kgo gives up quickly where it gives up.
	fast := []kgo.Opt{kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond }), kgo.MetadataMinAge(10 * time.Millisecond)}
	for _, tc := range []struct {
		name    string
		fault   func(c *kfake.Cluster, topic string)
		opts    []kgo.Opt
		topic   func(topic string) string // the topic the message goes to, default the cluster's
		timeout time.Duration
		wantErr error // the client's error, which every failure wraps
		refused bool  // a refusal; otherwise not delivered, wrapping outboxplugin.ErrBrokerUnavailable
	}{
		{
			name: "connection dropped until the deadline",
			fault: func(c *kfake.Cluster, _ string) {
				c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
					c.KeepControl()
					return nil, errors.New("broker down"), true // the cluster closes the connection
				})
			},
			timeout: 300 * time.Millisecond, wantErr: context.DeadlineExceeded, refused: false,
		},
		{
			name: "retriable broker error, retries used up",
			fault: func(c *kfake.Cluster, topic string) {
				c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: -1})
			},
			opts: []kgo.Opt{kgo.RecordRetries(2)}, wantErr: kerr.NotEnoughReplicas, refused: false,
		},
		{
			name: "authorization refused",
			fault: func(c *kfake.Cluster, topic string) {
				c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.TopicAuthorizationFailed, Count: -1})
			},
			wantErr: kerr.TopicAuthorizationFailed, refused: true,
		},
		{
			name:    "topic that does not exist",
			opts:    []kgo.Opt{kgo.UnknownTopicRetries(1)},
			topic:   func(topic string) string { return topic + "-missing" },
			wantErr: kerr.UnknownTopicOrPartition, refused: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			topic := "kind-" + suffix(t)
			cluster := newCluster(t, []string{topic})
			if tc.fault != nil {
				tc.fault(cluster, topic)
			}
			pub, err := outboxkafka.New(newProducer(t, cluster, append(fast, tc.opts...)...), byTopic)
			require.NoError(t, err)
			to := topic
			if tc.topic != nil {
				to = tc.topic(topic)
			}
			pctx := ctx
			if tc.timeout > 0 {
				var pcancel context.CancelFunc
				pctx, pcancel = context.WithTimeout(ctx, tc.timeout)
				defer pcancel()
			}
			var pe *outboxplugin.PublishError
			require.ErrorAs(t, pub.Publish(pctx, []outboxplugin.Message{msg("a", to), msg("b", to)}), &pe)
			require.Len(t, pe.Failed, 2)
			for id, err := range pe.Failed {
				require.ErrorIs(t, err, tc.wantErr, id)
				if tc.refused {
					require.NotErrorIs(t, err, outboxplugin.ErrBrokerUnavailable, "%s: a refusal", id)
				} else {
					require.ErrorIs(t, err, outboxplugin.ErrBrokerUnavailable, "%s: Kafka did not get it", id)
				}
			}
		})
	}
}

// TestBrokerDown makes the broker drop every produce connection for a while: the worker's publishes
// fail as not delivered and are retried without spending an attempt, and once the broker is back
// every event reaches Kafka.
func TestBrokerDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	agg := "Outage" + suffix(t)
	topic := "outbox." + agg
	cluster := newCluster(t, []string{topic})
	var down atomic.Bool
	down.Store(true)
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if down.Load() {
			return nil, errors.New("broker down"), true // the cluster closes the connection
		}
		return nil, nil, false
	})
	db := openDB(t)
	emit := func(from, to int) {
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			for i := from; i < to; i++ {
				if err := outboxplugin.Emit(tx, "Tested", map[string]int{"n": i}, outboxplugin.WithAggregate(agg, strconv.Itoa(i%5))); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	emit(0, 30)

	pub, err := outboxkafka.New(newProducer(t, cluster))
	require.NoError(t, err)
	var (
		mu                    sync.Mutex
		notDelivered, refused int
	)
	obs := observerFunc(func(r outboxplugin.BatchResult) {
		mu.Lock()
		defer mu.Unlock()
		notDelivered += len(r.NotDelivered)
		refused += len(r.Failed)
	})
	w, err := outboxplugin.NewWorker(db, pub,
		outboxplugin.WithoutListen(),
		outboxplugin.WithBatchSize(10),
		outboxplugin.WithPollInterval(20*time.Millisecond),
		outboxplugin.WithPublishTimeout(300*time.Millisecond),
		outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond}),
		outboxplugin.WithMaxAttempts(100),
		outboxplugin.WithObserver(obs),
		quiet)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()

	waitFor(ctx, t, "failed deliveries while the broker is down", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return notDelivered >= 60 // every event failed at least twice
	})
	emit(30, 40)
	var published int64
	require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", true).Count(&published).Error)
	require.Zero(t, published)

	down.Store(false)
	waitFor(ctx, t, "every event published", func() bool {
		var pending int64
		require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", false).Count(&pending).Error)
		return pending == 0
	})
	stop()
	require.NoError(t, <-ran)

	mu.Lock()
	require.Zero(t, refused, "a broker that is down refuses nothing")
	mu.Unlock()
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&rows).Error)
	require.Len(t, rows, 40)
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.MessageID
		require.Nil(t, r.DeadAt, "event %d is dead", i)
		// The failed deliveries gave their attempt back: each event was published on its first.
		require.Equal(t, 1, r.Attempts, "attempts of event %d", i)
	}
	records := consumeIDs(ctx, t, cluster, topic, ids)
	t.Logf("%d events, %d records read (duplicates are allowed: at least once)", len(ids), len(records))
}

// waitFor polls cond until it holds, failing the test when ctx ends first.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// TestPublishDeadline holds the produce requests of one broker: Publish returns at its deadline,
// failing only the records that broker did not acknowledge, and a later Publish succeeds once the
// broker answers again.
func TestPublishDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sfx := suffix(t)
	fast, slow := "fast-"+sfx, "slow-"+sfx
	cluster, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(1, fast, slow))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	require.NoError(t, cluster.MoveTopicPartition(fast, 0, 0))
	require.NoError(t, cluster.MoveTopicPartition(slow, 0, 1))

	release := make(chan struct{})
	var held atomic.Int32
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if cluster.CurrentNode() == 1 {
			select {
			case <-release:
			default:
				held.Add(1)
				cluster.SleepControl(func() { <-release })
			}
		}
		return nil, nil, false
	})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before the cluster closes

	pub, err := outboxkafka.New(newProducer(t, cluster), outboxkafka.WithTopic(func(m outboxplugin.Message) string { return m.AggregateType }))
	require.NoError(t, err)
	msg := func(id, topic string) outboxplugin.Message {
		return outboxplugin.Message{ID: id, EventType: "Tested", AggregateType: topic, Payload: []byte(`{}`), CreatedAt: time.Now().UTC(), Attempt: 1}
	}

	start := time.Now()
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer pcancel()
	err = pub.Publish(pctx, []outboxplugin.Message{msg("f1", fast), msg("s1", slow), msg("f2", fast)})
	took := time.Since(start)
	var pe *outboxplugin.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	require.ErrorIs(t, pe.Failed["s1"], context.DeadlineExceeded)
	require.ErrorIs(t, pe.Failed["s1"], outboxplugin.ErrBrokerUnavailable, "not acknowledged is not refused")
	require.GreaterOrEqual(t, took, 300*time.Millisecond)
	require.Less(t, took, 2*time.Second, "Publish did not honour its deadline")
	require.Positive(t, held.Load())

	// Once the broker answers, the client fails what it still buffers for the partition of s1 (kgo
	// never fails a record and then sends a later one), so a publish may fail once more, as the
	// worker's next attempt would; the one after succeeds.
	releaseOnce.Do(func() { close(release) })
	err = pub.Publish(ctx, []outboxplugin.Message{msg("s2", slow), msg("f3", fast)})
	if err != nil {
		require.ErrorAs(t, err, &pe)
		require.ErrorContains(t, pe.Failed["s2"], "earlier record")
		require.ErrorIs(t, pe.Failed["s2"], outboxplugin.ErrBrokerUnavailable)
		require.NoError(t, pub.Publish(ctx, []outboxplugin.Message{msg("s2", slow), msg("f3", fast)}))
	}
	consumeIDs(ctx, t, cluster, fast, []string{"f1", "f2", "f3"})
	consumeIDs(ctx, t, cluster, slow, []string{"s2"})

	done, stop := context.WithCancel(ctx)
	stop()
	require.ErrorIs(t, pub.Publish(done, []outboxplugin.Message{msg("x", fast)}), context.Canceled)
}

// TestFlushModes publishes on clients that send at once, linger, and flush only by hand: Publish
// never waits out a linger, nor hangs on a client that flushes by hand.
func TestFlushModes(t *testing.T) {
	for name, opt := range map[string]kgo.Opt{
		"no linger":      kgo.ProducerLinger(0),
		"linger":         kgo.ProducerLinger(20 * time.Second),
		"manual flushes": kgo.ManualFlushing(),
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			topic := "flush-" + suffix(t)
			cluster := newCluster(t, []string{topic})
			pub, err := outboxkafka.New(newProducer(t, cluster, opt), outboxkafka.WithTopic(func(outboxplugin.Message) string { return topic }))
			require.NoError(t, err)
			msgs := make([]outboxplugin.Message, 50)
			for i := range msgs {
				msgs[i] = outboxplugin.Message{ID: "m" + strconv.Itoa(i), EventType: "Tested", Key: "k" + strconv.Itoa(i%3), Payload: []byte(`{}`), CreatedAt: time.Now().UTC(), Attempt: 1}
			}
			start := time.Now()
			require.NoError(t, pub.Publish(ctx, msgs))
			require.Less(t, time.Since(start), 5*time.Second)
			require.Len(t, consume(ctx, t, cluster, topic, 50), 50)
		})
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	cluster := newCluster(t, nil)
	cl := newProducer(t, cluster)
	txn, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.TransactionalID("outbox-"+suffix(t)))
	require.NoError(t, err)
	defer txn.Close()
	for name, tc := range map[string]struct {
		client *kgo.Client
		opts   []outboxkafka.Option
	}{
		"nil client":         {nil, nil},
		"nil topic function": {cl, []outboxkafka.Option{outboxkafka.WithTopic(nil)}},
		"nil option":         {cl, []outboxkafka.Option{nil}},
		"transactional":      {txn, nil},
	} {
		pub, err := outboxkafka.New(tc.client, tc.opts...)
		require.ErrorIs(t, err, outboxplugin.ErrInvalidOption, name)
		require.ErrorContains(t, err, "outboxkafka:", name)
		require.Nil(t, pub, name)
	}
	pub, err := outboxkafka.New(cl)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(context.Background(), nil), "an empty batch")
}
