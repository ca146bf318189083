package outboxwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/gorm-outbox/outboxplugin"
	outboxwatermill "github.com/gorm-outbox/outboxplugin/publishers/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// newGoChannel returns an in-process Watermill pub/sub, closed at the end of the test.
func newGoChannel(t *testing.T, cfg gochannel.Config) *gochannel.GoChannel {
	gc := gochannel.NewGoChannel(cfg, nil)
	t.Cleanup(func() { assert.NoError(t, gc.Close()) })
	return gc
}

func subscribe(t *testing.T, ctx context.Context, sub message.Subscriber, topic string) <-chan *message.Message {
	t.Helper()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	return ch
}

func newPublisher(t *testing.T, pub message.Publisher, opts ...outboxwatermill.Option) *outboxwatermill.Publisher {
	t.Helper()
	p, err := outboxwatermill.New(pub, opts...)
	require.NoError(t, err)
	closeAtCleanup(t, p)
	return p
}

func failedIDs(t *testing.T, err error) []string {
	t.Helper()
	var pe *outboxplugin.PublishError
	require.ErrorAs(t, err, &pe)
	ids := make([]string, 0, len(pe.Failed))
	for id := range pe.Failed {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func idsOf(msgs []outboxplugin.Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	sort.Strings(ids)
	return ids
}

// A GORM write through the plugin, a Worker with the Publisher, gochannel, and a subscriber: every
// event arrives on its default topic, in order within the topic, with its fields mapped.
func TestGoChannelEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := openDB(t)
	// gochannel delivers in publish order only when each message waits for its acknowledgement.
	gc := newGoChannel(t, gochannel.Config{BlockPublishUntilSubscriberAck: true})
	orders := collect(ctx, subscribe(t, ctx, gc, "outbox.Order"), 4)
	invites := collect(ctx, subscribe(t, ctx, gc, "outbox.Shop_Invite"), 1)
	unkeyed := collect(ctx, subscribe(t, ctx, gc, "outbox._"), 1)
	pub := newPublisher(t, gc)

	createOrders(t, ctx, db, 3, "trace-1")
	require.NoError(t, db.WithContext(context.WithValue(ctx, traceKey{}, "trace-2")).Transaction(func(tx *gorm.DB) error {
		if err := tx.Model(&Order{ID: 2}).Update("qty", 20).Error; err != nil {
			return err
		}
		if err := outboxplugin.Emit(tx, "Invited", map[string]string{"by": "ann"}, outboxplugin.WithAggregate("Shop Invite", "7")); err != nil {
			return err
		}
		return outboxplugin.Emit(tx, "Ping", map[string]int{"n": 1})
	}))

	n, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, n)

	rows := outboxRows(t, db)
	require.Len(t, rows, 6)
	for _, r := range rows {
		assert.True(t, r.Processed, "row %d not processed", r.ID)
	}
	// Rows 1-4 are the orders (three creates, one update) in commit order, which the Order topic keeps.
	got := <-orders
	require.Len(t, got, 4)
	for i, r := range rows[:4] {
		trace := "trace-1"
		if i == 3 {
			trace = "trace-2"
			assert.Equal(t, "Order_update", r.EventType)
		}
		checkMessage(t, r, got[i], trace, "1")
	}
	for i, ch := range []<-chan []*message.Message{invites, unkeyed} {
		got := <-ch
		require.Len(t, got, 1)
		checkMessage(t, rows[4+i], got[0], "trace-2", "1")
	}
}

func TestDefaultTopic(t *testing.T) {
	for _, tc := range []struct{ aggregate, topic string }{
		{"Order", "outbox.Order"},
		{"", "outbox._"},
		{"billing.Invoice v2", "outbox.billing_Invoice_v2"},
	} {
		assert.Equal(t, tc.topic, outboxwatermill.DefaultTopic(outboxplugin.Message{AggregateType: tc.aggregate, EventType: "X"}))
	}
}

// failTopic fails every Publish to one topic while failing is set, and passes the others on.
type failTopic struct {
	message.Publisher
	topic   string
	failing atomic.Bool
}

var errRefused = errors.New("broker refused the topic")

func (f *failTopic) Publish(topic string, msgs ...*message.Message) error {
	if topic == f.topic && f.failing.Load() {
		return errRefused
	}
	return f.Publisher.Publish(topic, msgs...)
}

// A Watermill publisher that fails one topic fails that topic's group only; the worker marks the
// rest done and retries the failed events until they are delivered.
func TestOneTopicFailsOnlyItsGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gc := newGoChannel(t, gochannel.Config{OutputChannelBuffer: 64})
	orders := subscribe(t, ctx, gc, "outbox.Order")
	invoices := subscribe(t, ctx, gc, "outbox.Invoice")
	ft := &failTopic{Publisher: gc, topic: "outbox.Invoice"}
	ft.failing.Store(true)
	pub := newPublisher(t, ft)

	t.Run("batch", func(t *testing.T) {
		o, i := testMessages("Order", 3), testMessages("Invoice", 2)
		batch := []outboxplugin.Message{o[0], i[0], o[1], i[1], o[2]}
		err := pub.Publish(ctx, batch)
		assert.Equal(t, idsOf(i), failedIDs(t, err))
		var pe *outboxplugin.PublishError
		require.ErrorAs(t, err, &pe)
		assert.ErrorIs(t, pe.Failed[i[0].ID], errRefused)
		assert.ErrorContains(t, pe.Failed[i[0].ID], `"outbox.Invoice"`)
		assert.NotErrorIs(t, pe.Failed[i[0].ID], outboxplugin.ErrBrokerUnavailable, "a refusal")
		var got []string
		for _, m := range receive(t, ctx, orders, 3) {
			got = append(got, m.UUID)
		}
		sort.Strings(got)
		assert.Equal(t, idsOf(o), got)
	})

	t.Run("worker", func(t *testing.T) {
		db := openDB(t)
		createOrders(t, ctx, db, 2, "t")
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			for _, id := range []string{"1", "2"} {
				if err := outboxplugin.Emit(tx, "InvoiceIssued", map[string]string{"id": id}, outboxplugin.WithAggregate("Invoice", id)); err != nil {
					return err
				}
			}
			return nil
		}))
		w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithoutListen(), fastRetry, quiet)
		require.NoError(t, err)
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, n, "the orders are published")
		receive(t, ctx, orders, 2)
		for _, r := range outboxRows(t, db)[2:] {
			assert.False(t, r.Processed)
			assert.Equal(t, 1, r.Attempts)
			require.NotNil(t, r.LastError)
			assert.Contains(t, *r.LastError, errRefused.Error())
		}

		ft.failing.Store(false)
		for published := 0; published < 2; {
			n, err := w.ProcessOnce(ctx)
			require.NoError(t, err)
			published += n
			if n == 0 {
				time.Sleep(10 * time.Millisecond) // until the retry is due
			}
		}
		byID := map[string]outboxplugin.OutboxEvent{}
		for _, r := range outboxRows(t, db) {
			assert.True(t, r.Processed)
			byID[r.MessageID] = r
		}
		for _, m := range receive(t, ctx, invoices, 2) {
			checkMessage(t, byID[m.UUID], m, "", "2")
		}
	})
}

// Publish returns when its context ends although the Watermill call is still blocked: the messages
// of the unfinished group are failed with the context's error, those of the finished group are
// not; Close waits for the call left running.
func TestContextDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Publish blocks until the subscriber acknowledges; the test holds the Slow messages back.
	gc := newGoChannel(t, gochannel.Config{BlockPublishUntilSubscriberAck: true})
	held := subscribe(t, ctx, gc, "outbox.Slow")
	fast := subscribe(t, ctx, gc, "outbox.Fast")
	pub := newPublisher(t, gc)
	acked := make(chan int)
	go func() { // acknowledges Fast at once
		n := 0
		for range 2 {
			(<-fast).Ack()
			n++
		}
		acked <- n
	}()

	slow, quick := testMessages("Slow", 2), testMessages("Fast", 2)
	pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer pcancel()
	start := time.Now()
	err := pub.Publish(pctx, append(append([]outboxplugin.Message{}, slow...), quick...))
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, 190*time.Millisecond)
	assert.Less(t, took, 2*time.Second, "Publish outlived its context")
	assert.Equal(t, idsOf(slow), failedIDs(t, err))
	var pe *outboxplugin.PublishError
	require.ErrorAs(t, err, &pe)
	assert.ErrorIs(t, pe.Failed[slow[0].ID], context.DeadlineExceeded)
	assert.ErrorIs(t, pe.Failed[slow[0].ID], outboxplugin.ErrBrokerUnavailable, "not finished is not refused")
	assert.Equal(t, 2, <-acked)

	// The Slow call is still running: Close gives up on a short context, and Publish is refused.
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	assert.ErrorIs(t, pub.Close(short), context.DeadlineExceeded)
	assert.ErrorIs(t, pub.Publish(ctx, quick), outboxwatermill.ErrClosed)

	// Once the subscriber acknowledges, the call returns and Close completes.
	for _, want := range slow {
		m := <-held
		assert.Equal(t, want.ID, m.UUID)
		m.Ack()
	}
	done, stop2 := context.WithTimeout(ctx, 5*time.Second)
	defer stop2()
	assert.NoError(t, pub.Close(done))

	t.Run("ended before", func(t *testing.T) {
		var calls atomic.Int32
		p := newPublisher(t, publisherFunc(func(string, ...*message.Message) error { calls.Add(1); return nil }))
		ended, end := context.WithCancel(ctx)
		end()
		assert.ErrorIs(t, p.Publish(ended, testMessages("Order", 1)), context.Canceled)
		assert.Zero(t, calls.Load())
	})
}

// errNotConnected is a backend's error of a lost connection, of no type the Publisher knows.
var errNotConnected = errors.New("not connected to the broker")

// The error of a group says whether the broker did not get its messages — wrapping
// outboxplugin.ErrBrokerUnavailable, and the worker spends no attempt — or refused them: by default
// the end of the context and network errors are the first kind, WithUnavailable adds the backend's
// own, and every other error is a refusal.
func TestUnavailableErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := map[string]error{
		"outbox.Reset":     fmt.Errorf("cannot publish msg: %w", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}),
		"outbox.Eof":       fmt.Errorf("commit: %w", io.EOF),
		"outbox.Ctx":       fmt.Errorf("publish: %w", context.DeadlineExceeded),
		"outbox.Marked":    fmt.Errorf("backend: %w", outboxplugin.ErrBrokerUnavailable),
		"outbox.Custom":    errNotConnected,
		"outbox.Refused":   errRefused,
		"outbox.Published": nil,
	}
	backend := publisherFunc(func(topic string, _ ...*message.Message) error { return errs[topic] })
	var batch []outboxplugin.Message
	for topic := range errs {
		batch = append(batch, testMessages(topic[len("outbox."):], 1)...)
	}
	for name, tc := range map[string]struct {
		opts        []outboxwatermill.Option
		unavailable []string // the topics whose messages are not delivered; the others failed are refused
	}{
		"defaults": {unavailable: []string{"outbox.Reset", "outbox.Eof", "outbox.Ctx", "outbox.Marked"}},
		"WithUnavailable": {
			opts:        []outboxwatermill.Option{outboxwatermill.WithUnavailable(func(err error) bool { return errors.Is(err, errNotConnected) })},
			unavailable: []string{"outbox.Reset", "outbox.Eof", "outbox.Ctx", "outbox.Marked", "outbox.Custom"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := newPublisher(t, backend, tc.opts...)
			var pe *outboxplugin.PublishError
			require.ErrorAs(t, p.Publish(ctx, batch), &pe)
			require.Len(t, pe.Failed, len(errs)-1)
			for _, m := range batch {
				topic := outboxwatermill.DefaultTopic(m)
				err, failed := pe.Failed[m.ID]
				if errs[topic] == nil {
					assert.False(t, failed, "%s published", topic)
					continue
				}
				require.True(t, failed, topic)
				assert.ErrorIs(t, err, errs[topic], "%s: the backend's error is kept", topic)
				assert.Equal(t, slices.Contains(tc.unavailable, topic), errors.Is(err, outboxplugin.ErrBrokerUnavailable),
					"%s: %v", topic, err)
			}
		})
	}
}

// publisherFunc adapts a function to message.Publisher.
type publisherFunc func(topic string, msgs ...*message.Message) error

func (f publisherFunc) Publish(topic string, msgs ...*message.Message) error {
	return f(topic, msgs...)
}
func (publisherFunc) Close() error { return nil }

// Groups of one batch run concurrently, never more than WithConcurrency at once.
func TestConcurrency(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var batch []outboxplugin.Message
	for _, a := range []string{"A", "B", "C", "D"} {
		batch = append(batch, testMessages(a, 2)...)
	}

	t.Run("all at once", func(t *testing.T) {
		// Each call waits until all four are running: that fails unless the groups run concurrently.
		var wg sync.WaitGroup
		wg.Add(4)
		all := make(chan struct{})
		go func() { wg.Wait(); close(all) }()
		p := newPublisher(t, publisherFunc(func(string, ...*message.Message) error {
			wg.Done()
			select {
			case <-all:
				return nil
			case <-time.After(5 * time.Second):
				return errors.New("groups were not published concurrently")
			}
		}))
		assert.NoError(t, p.Publish(ctx, batch))
	})

	t.Run("bounded", func(t *testing.T) {
		var mu sync.Mutex
		running, most := 0, 0
		topics := map[string][]string{}
		p := newPublisher(t, publisherFunc(func(topic string, msgs ...*message.Message) error {
			mu.Lock()
			running++
			most = max(most, running)
			for _, m := range msgs {
				topics[topic] = append(topics[topic], m.UUID)
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			running--
			mu.Unlock()
			return nil
		}), outboxwatermill.WithConcurrency(2))
		assert.NoError(t, p.Publish(ctx, batch))
		assert.Equal(t, 2, most)
		assert.Equal(t, map[string][]string{
			"outbox.A": {batch[0].ID, batch[1].ID}, "outbox.B": {batch[2].ID, batch[3].ID},
			"outbox.C": {batch[4].ID, batch[5].ID}, "outbox.D": {batch[6].ID, batch[7].ID},
		}, topics, "one call per topic, with its messages in batch order")
	})
}

// A message without a topic and a group whose Watermill call panics fail alone.
func TestEmptyTopicAndPanic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := newPublisher(t, publisherFunc(func(topic string, _ ...*message.Message) error {
		if topic == "outbox.Boom" {
			panic("backend bug")
		}
		return nil
	}), outboxwatermill.WithTopic(func(m outboxplugin.Message) string {
		if m.AggregateType == "None" {
			return ""
		}
		return outboxwatermill.DefaultTopic(m)
	}))
	none, boom, ok := testMessages("None", 1), testMessages("Boom", 1), testMessages("Ok", 1)
	err := p.Publish(ctx, []outboxplugin.Message{none[0], boom[0], ok[0]})
	assert.Equal(t, idsOf(append(none, boom...)), failedIDs(t, err))
	var pe *outboxplugin.PublishError
	require.ErrorAs(t, err, &pe)
	assert.ErrorIs(t, pe.Failed[none[0].ID], outboxwatermill.ErrEmptyTopic)
	assert.ErrorContains(t, pe.Failed[boom[0].ID], "panicked: backend bug")
	for id, err := range pe.Failed {
		assert.NotErrorIs(t, err, outboxplugin.ErrBrokerUnavailable, "%s: a refusal", id)
	}
	assert.NoError(t, p.Publish(ctx, nil), "an empty batch")
}

func TestInvalidOptions(t *testing.T) {
	gc := newGoChannel(t, gochannel.Config{})
	for name, tc := range map[string]struct {
		pub  message.Publisher
		opts []outboxwatermill.Option
	}{
		"nil publisher":    {nil, nil},
		"nil topic":        {gc, []outboxwatermill.Option{outboxwatermill.WithTopic(nil)}},
		"zero concurrency": {gc, []outboxwatermill.Option{outboxwatermill.WithConcurrency(0)}},
		"huge concurrency": {gc, []outboxwatermill.Option{outboxwatermill.WithConcurrency(10001)}},
		"nil option":       {gc, []outboxwatermill.Option{nil}},
		"nil unavailable":  {gc, []outboxwatermill.Option{outboxwatermill.WithUnavailable(nil)}},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := outboxwatermill.New(tc.pub, tc.opts...)
			assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
			assert.ErrorContains(t, err, "outboxwatermill:")
			assert.Nil(t, p)
		})
	}
	p, err := outboxwatermill.New(gc, outboxwatermill.WithConcurrency(1), outboxwatermill.WithTopic(outboxwatermill.DefaultTopic))
	assert.NoError(t, err)
	assert.NoError(t, p.Close(context.Background()))
}
