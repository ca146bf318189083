package outboxnats_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// Widget is the business model of the end-to-end tests.
type Widget struct {
	ID   uint
	Name string
}

type traceKey struct{}

// prefixed returns a subject function that puts prefix before the default subject, so that a test's
// stream captures its own messages only.
func prefixed(prefix string) func(outboxplugin.Message) string {
	return func(m outboxplugin.Message) string { return prefix + "." + outboxnats.DefaultSubject(m) }
}

// TestEndToEnd writes rows through GORM, relays their events with a Worker and reads them back from
// the stream: subject, Nats-Msg-Id, every header and the payload.
func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := openDB(t, outboxplugin.WithContextHeaders(func(ctx context.Context) map[string]string {
		if v, ok := ctx.Value(traceKey{}).(string); ok {
			return map[string]string{"traceparent": v}
		}
		return nil
	}))
	require.NoError(t, db.AutoMigrate(&Widget{}))
	_, js := connect(t, natsURL(), nil)
	prefix := testName("e2e")
	stream := newStream(t, js, prefix+".>")
	pub, err := outboxnats.New(js, outboxnats.WithSubject(prefixed(prefix)))
	require.NoError(t, err)

	traced := db.WithContext(context.WithValue(ctx, traceKey{}, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
	widgets := []Widget{{Name: "a"}, {Name: "b"}}
	require.NoError(t, traced.Create(&widgets).Error)
	require.NoError(t, traced.Model(&widgets[0]).Update("name", "c").Error)

	var events []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&events).Error)
	require.Len(t, events, 3)

	w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithoutListen())
	require.NoError(t, err)
	n, err := w.ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	got := readStream(t, stream, 3)
	for i, ev := range events {
		m := got[i]
		assert.Equal(t, prefix+".outbox.Widget."+ev.EventType, m.Subject())
		assert.JSONEq(t, string(ev.Payload), string(m.Data()))
		want := nats.Header{
			"traceparent":                    {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			jetstream.MsgIDHeader:            {ev.MessageID},
			outboxplugin.HeaderID:            {ev.MessageID},
			outboxplugin.HeaderEventType:     {ev.EventType},
			outboxplugin.HeaderKey:           {"Widget:" + ev.AggregateID},
			outboxplugin.HeaderAggregateType: {"Widget"},
			outboxplugin.HeaderAggregateID:   {ev.AggregateID},
			outboxplugin.HeaderCreatedAt:     {ev.CreatedAt.UTC().Format(time.RFC3339Nano)},
			outboxplugin.HeaderAttempt:       {"1"},
		}
		assert.Equal(t, want, m.Headers(), "headers of event %d", i)
	}
	assert.Equal(t, []string{"Widget_create", "Widget_create", "Widget_update"},
		[]string{events[0].EventType, events[1].EventType, events[2].EventType})

	var pending int64
	require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", false).Count(&pending).Error)
	assert.Zero(t, pending, "events left unprocessed")
}

// TestDefaultSubject checks the default subject, outbox.<aggregate>.<event>, on its own and through
// the broker.
func TestDefaultSubject(t *testing.T) {
	cases := []struct {
		aggregate, event, want string
	}{
		{"User", "User_create", "outbox.User.User_create"},
		{"", "OrderPlaced", "outbox._.OrderPlaced"},
		{"a.b", "x y*>", "outbox.a_b.x_y__"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, outboxnats.DefaultSubject(outboxplugin.Message{AggregateType: c.aggregate, EventType: c.event}))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := openDB(t)
	_, js := connect(t, natsURL(), nil)
	aggregate := "T" + suffix()
	stream := newStream(t, js, "outbox."+aggregate+".>")
	pub, err := outboxnats.New(js)
	require.NoError(t, err)
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		return outboxplugin.Emit(tx, "Thing.happened", map[string]int{"n": 1}, outboxplugin.WithAggregate(aggregate, "7"))
	}))
	n, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	got := readStream(t, stream, 1)
	assert.Equal(t, "outbox."+aggregate+".Thing_happened", got[0].Subject())
	assert.Equal(t, aggregate+":7", got[0].Headers().Get(outboxplugin.HeaderKey))
}

// TestDuplicateDropped publishes the same events twice, as a worker does when it crashes between
// publishing and marking them done: the stream keeps one copy of each, by Nats-Msg-Id.
func TestDuplicateDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := openDB(t)
	_, js := connect(t, natsURL(), nil)
	prefix := testName("dup")
	stream := newStream(t, js, prefix+".>")
	pub, err := outboxnats.New(js, outboxnats.WithSubject(prefixed(prefix)))
	require.NoError(t, err)

	events, err := outboxtest.Fill(ctx, db, 50, outboxtest.FillOptions{})
	require.NoError(t, err)
	for round := 0; round < 2; round++ {
		n, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 50, n, "round %d", round)
		// Forget the outcome, as a crash before it was recorded would.
		require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", true).
			Updates(map[string]any{"processed": false, "processed_at": nil}).Error)
	}

	got := readStream(t, stream, 50)
	for i, m := range got {
		assert.Equal(t, events[i].MessageID, m.Headers().Get(jetstream.MsgIDHeader))
		assert.Equal(t, "1", m.Headers().Get(outboxplugin.HeaderAttempt), "the first delivery is the one kept")
	}

	// The second publication was acknowledged, as a duplicate, without storing anything.
	msgs := []outboxplugin.Message{message("Again", "A", "1", `{}`)}
	require.NoError(t, pub.Publish(ctx, msgs))
	msgs[0].Attempt = 2
	require.NoError(t, pub.Publish(ctx, msgs))
	readStream(t, stream, 51)
}

// TestPartlyFailedBatch publishes a batch in which some messages cannot be stored: the publisher
// names exactly those, and the rest are in the stream.
func TestPartlyFailedBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js := connect(t, natsURL(), nil)
	prefix := testName("part")
	stream := newStream(t, js, prefix+".>")
	nowhere := testName("nowhere")
	pub, err := outboxnats.New(js, outboxnats.WithSubject(func(m outboxplugin.Message) string {
		switch m.EventType {
		case "lost":
			return nowhere + ".x" // no stream captures it
		case "wild":
			return prefix + ".*"
		}
		return prefix + "." + m.EventType
	}))
	require.NoError(t, err)

	msgs := []outboxplugin.Message{
		message("ok", "A", "1", `{"n":1}`),
		message("lost", "A", "2", `{"n":2}`),
		message("big", "A", "3", `{"pad":"`+strings.Repeat("x", 2<<20)+`"}`),
		message("wild", "A", "4", `{"n":4}`),
		message("ok", "A", "5", `{"n":5}`),
	}
	err = pub.Publish(ctx, msgs)
	var perr *outboxplugin.PublishError
	require.ErrorAs(t, err, &perr)
	require.Len(t, perr.Failed, 3)
	assert.ErrorIs(t, perr.Failed[msgs[1].ID], jetstream.ErrNoStreamResponse)
	assert.ErrorIs(t, perr.Failed[msgs[1].ID], outboxplugin.ErrMisconfigured, "no stream: a configuration error")
	assert.Contains(t, perr.Failed[msgs[1].ID].Error(), nowhere+".x", "names the subject")
	assert.ErrorIs(t, perr.Failed[msgs[2].ID], nats.ErrMaxPayload)
	assert.ErrorIs(t, perr.Failed[msgs[3].ID], outboxnats.ErrInvalidSubject)
	for id, err := range perr.Failed {
		assert.NotErrorIs(t, err, outboxplugin.ErrBrokerUnavailable, "%s was refused, not lost", id)
	}
	assert.NotErrorIs(t, perr.Failed[msgs[2].ID], outboxplugin.ErrMisconfigured)
	assert.NotErrorIs(t, perr.Failed[msgs[3].ID], outboxplugin.ErrMisconfigured)

	got := readStream(t, stream, 2)
	assert.Equal(t, msgs[0].ID, got[0].Headers().Get(jetstream.MsgIDHeader))
	assert.Equal(t, msgs[4].ID, got[1].Headers().Get(jetstream.MsgIDHeader))

	// Through a worker: the stored event is done, the other one is pending again, no attempt spent.
	db := openDB(t)
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		if err := outboxplugin.Emit(tx, "ok", map[string]int{"n": 6}); err != nil {
			return err
		}
		return outboxplugin.Emit(tx, "lost", map[string]int{"n": 7})
	}))
	n, err := mustWorker(t, db, pub, outboxplugin.WithoutListen()).ProcessOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&rows).Error)
	require.Len(t, rows, 2)
	assert.True(t, rows[0].Processed)
	assert.False(t, rows[1].Processed)
	assert.Equal(t, 0, rows[1].Attempts)
	require.NotNil(t, rows[1].LastError)
	assert.Contains(t, *rows[1].LastError, "no response from stream")
	readStream(t, stream, 3)
}

// TestExpectedStream checks that WithExpectedStream lets a message into the named stream only.
func TestExpectedStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js := connect(t, natsURL(), nil)
	prefix := testName("exp")
	stream := newStream(t, js, prefix+".>")

	right, err := outboxnats.New(js, outboxnats.WithSubject(prefixed(prefix)), outboxnats.WithExpectedStream(stream.CachedInfo().Config.Name))
	require.NoError(t, err)
	require.NoError(t, right.Publish(ctx, []outboxplugin.Message{message("E", "A", "1", `{}`)}))

	wrong, err := outboxnats.New(js, outboxnats.WithSubject(prefixed(prefix)), outboxnats.WithExpectedStream("OTHER_"+suffix()))
	require.NoError(t, err)
	msgs := []outboxplugin.Message{message("E", "A", "2", `{}`), message("E", "A", "3", `{}`)}
	var perr *outboxplugin.PublishError
	require.ErrorAs(t, wrong.Publish(ctx, msgs), &perr)
	assert.Len(t, perr.Failed, 2)
	for _, m := range msgs {
		var apiErr *jetstream.APIError
		require.ErrorAs(t, perr.Failed[m.ID], &apiErr)
		assert.NotErrorIs(t, perr.Failed[m.ID], outboxplugin.ErrBrokerUnavailable, "the stream refused it")
	}
	readStream(t, stream, 1)
}

// TestContextDeadline publishes to a subject whose responder never acknowledges: Publish returns
// when ctx ends, failing only the unacknowledged message — also when the window of unacknowledged
// messages is full.
func TestContextDeadline(t *testing.T) {
	nc, js := connect(t, natsURL(), nil)
	prefix := testName("dl")
	stream := newStream(t, js, prefix+".stored")
	// A core subscriber answers nothing: the client gets no "no responders" either, and waits.
	hang := prefix + ".hang"
	sub, err := nc.SubscribeSync(hang)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	route := func(m outboxplugin.Message) string { return prefix + "." + m.EventType }

	pub, err := outboxnats.New(js, outboxnats.WithSubject(route))
	require.NoError(t, err)
	msgs := []outboxplugin.Message{message("stored", "A", "1", `{}`), message("hang", "A", "2", `{}`), message("stored", "A", "3", `{}`)}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = pub.Publish(ctx, msgs)
	took := time.Since(start)
	var perr *outboxplugin.PublishError
	require.ErrorAs(t, err, &perr)
	require.Len(t, perr.Failed, 1)
	assert.ErrorIs(t, perr.Failed[msgs[1].ID], context.DeadlineExceeded)
	assert.ErrorIs(t, perr.Failed[msgs[1].ID], outboxplugin.ErrBrokerUnavailable, "no acknowledgement is no refusal")
	assert.Less(t, took, time.Second)
	readStream(t, stream, 2)

	// A window of two: the third message cannot even be sent before ctx ends.
	_, small := connect(t, natsURL(), []jetstream.JetStreamOpt{jetstream.WithPublishAsyncMaxPending(2)})
	pub, err = outboxnats.New(small, outboxnats.WithSubject(route))
	require.NoError(t, err)
	msgs = []outboxplugin.Message{message("hang", "A", "1", `{}`), message("hang", "A", "2", `{}`), message("hang", "A", "3", `{}`), message("hang", "A", "4", `{}`)}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	err = pub.Publish(ctx, msgs)
	took = time.Since(start)
	require.ErrorAs(t, err, &perr)
	require.Len(t, perr.Failed, 4)
	for _, m := range msgs {
		assert.ErrorIs(t, perr.Failed[m.ID], context.DeadlineExceeded)
		assert.ErrorIs(t, perr.Failed[m.ID], outboxplugin.ErrBrokerUnavailable)
	}
	assert.Less(t, took, time.Second, "the client's stall wait is 200 ms")
}

// TestBatchLargerThanWindow publishes a batch twenty times the client's window of unacknowledged
// messages: it waits for acknowledgements instead of failing.
func TestBatchLargerThanWindow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js := connect(t, natsURL(), []jetstream.JetStreamOpt{jetstream.WithPublishAsyncMaxPending(10)})
	prefix := testName("win")
	stream := newStream(t, js, prefix+".>")
	pub, err := outboxnats.New(js, outboxnats.WithSubject(prefixed(prefix)))
	require.NoError(t, err)
	msgs := make([]outboxplugin.Message, 200)
	for i := range msgs {
		msgs[i] = message("W", "A", "1", `{}`)
	}
	require.NoError(t, pub.Publish(ctx, msgs))
	readStream(t, stream, 200)
}

// TestConnectionClosed checks that a closed connection fails the batch at once, as a whole.
func TestConnectionClosed(t *testing.T) {
	nc, js := connect(t, natsURL(), nil)
	pub, err := outboxnats.New(js)
	require.NoError(t, err)
	nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = pub.Publish(ctx, []outboxplugin.Message{message("E", "A", "1", `{}`)})
	require.ErrorIs(t, err, nats.ErrConnectionClosed)
	assert.ErrorIs(t, err, outboxplugin.ErrBrokerUnavailable)
	var perr *outboxplugin.PublishError
	assert.False(t, errors.As(err, &perr), "a whole-batch error, not a partial one")
	assert.NoError(t, pub.Publish(ctx, nil), "an empty batch needs no connection")
}

// TestConnectionLost cuts the connection while a batch waits for its acknowledgements: the
// unacknowledged messages fail as not delivered (wrapping outboxplugin.ErrBrokerUnavailable), and so
// does, as a whole, a batch published while the client reconnects.
func TestConnectionLost(t *testing.T) {
	proxy, err := outboxtest.NewProxy(strings.TrimPrefix(natsURL(), "nats://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	_, adminJS := connect(t, natsURL(), nil)
	prefix := testName("lost")
	stream := newStream(t, adminJS, prefix+".>")
	_, js := connect(t, "nats://"+proxy.Addr(), nil, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	pub, err := outboxnats.New(js, outboxnats.WithSubject(prefixed(prefix)))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The server stores the batch, but its acknowledgements are held back until the cut drops them.
	proxy.Mute(true)
	msgs := []outboxplugin.Message{message("E", "A", "1", `{}`), message("E", "A", "2", `{}`), message("E", "A", "3", `{}`)}
	published := make(chan error, 1)
	go func() { published <- pub.Publish(ctx, msgs) }()
	require.Eventually(t, func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == uint64(len(msgs))
	}, 10*time.Second, 5*time.Millisecond, "the server got the batch")
	proxy.Cut()
	var perr *outboxplugin.PublishError
	require.ErrorAs(t, <-published, &perr)
	require.Len(t, perr.Failed, len(msgs))
	for _, m := range msgs {
		assert.ErrorIs(t, perr.Failed[m.ID], nats.ErrDisconnected)
		assert.ErrorIs(t, perr.Failed[m.ID], outboxplugin.ErrBrokerUnavailable)
	}

	// While the client reconnects, a batch fails whole, at once, as not delivered.
	err = pub.Publish(ctx, []outboxplugin.Message{message("E", "A", "4", `{}`)})
	require.ErrorIs(t, err, outboxplugin.ErrBrokerUnavailable)
	assert.ErrorIs(t, err, nats.ErrDisconnected)
	assert.False(t, errors.As(err, &perr), "a whole-batch error, not a partial one")

	proxy.Mute(false)
	proxy.Restore()
	require.Eventually(t, func() bool { return js.Conn().IsConnected() }, 10*time.Second, 5*time.Millisecond, "reconnected")
	require.NoError(t, pub.Publish(ctx, msgs), "the retry goes through; the stream drops the copies")
	readStream(t, stream, len(msgs))
}

// retryObserver counts what the worker published, refused and did not deliver, and calls onFirst
// after the first batch that published anything.
type retryObserver struct {
	outboxplugin.NopObserver
	once         sync.Once
	onFirst      func()
	published    atomic.Int64
	refused      atomic.Int64
	notDelivered atomic.Int64
	dead         atomic.Int64
}

func (o *retryObserver) BatchDone(_ context.Context, r outboxplugin.BatchResult) {
	o.published.Add(int64(len(r.Published)))
	o.refused.Add(int64(len(r.Failed)))
	o.notDelivered.Add(int64(len(r.NotDelivered)))
	if len(r.Published) > 0 {
		o.once.Do(o.onFirst)
	}
}

func (o *retryObserver) Dead(context.Context, outboxplugin.Message, error) { o.dead.Add(1) }

// TestBrokerDown cuts the connection to the server while a worker publishes, restores it, and
// checks that every event is in the stream exactly once, and that the outage spent no attempt: the
// failures during the cut are reported as not delivered, none as refused, and every event went out
// on its first attempt.
func TestBrokerDown(t *testing.T) {
	const events = 3000
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	proxy, err := outboxtest.NewProxy(strings.TrimPrefix(natsURL(), "nats://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	_, adminJS := connect(t, natsURL(), nil)
	prefix := testName("down")
	stream := newStream(t, adminJS, prefix+".>")

	_, js := connect(t, "nats://"+proxy.Addr(), nil,
		nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	pub, err := outboxnats.New(js, outboxnats.WithSubject(prefixed(prefix)))
	require.NoError(t, err)

	db := openDB(t)
	filled, err := outboxtest.Fill(ctx, db, events, outboxtest.FillOptions{})
	require.NoError(t, err)

	restored := make(chan struct{})
	obs := &retryObserver{onFirst: func() {
		proxy.Cut()
		go func() {
			defer close(restored)
			time.Sleep(300 * time.Millisecond)
			proxy.Restore()
		}()
	}}
	w, err := outboxplugin.NewWorker(db, pub,
		outboxplugin.WithoutListen(),
		outboxplugin.WithBatchSize(100),
		outboxplugin.WithPollInterval(5*time.Millisecond),
		outboxplugin.WithPublishTimeout(2*time.Second),
		outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond}),
		outboxplugin.WithMaxAttempts(1000),
		outboxplugin.WithObserver(obs))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	require.Eventually(t, func() bool {
		var pending int64
		err := db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", false).Count(&pending).Error
		return err == nil && pending == 0
	}, 45*time.Second, 20*time.Millisecond, "events left unpublished")
	<-restored

	assert.Positive(t, obs.notDelivered.Load(), "the worker saw deliveries fail while the connection was cut")
	assert.Zero(t, obs.refused.Load(), "a lost connection refuses nothing")
	assert.Zero(t, obs.dead.Load(), "dead events")
	var retried int64
	require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("attempts <> 1").Count(&retried).Error)
	assert.Zero(t, retried, "events whose attempts are not 1 once published: the outage spent attempts")

	got := readStream(t, stream, events)
	seen := make(map[string]int, events)
	for _, m := range got {
		seen[m.Headers().Get(jetstream.MsgIDHeader)]++
	}
	for _, ev := range filled {
		assert.Equal(t, 1, seen[ev.MessageID], "copies of %s", ev.MessageID)
	}
}

// TestNewRejectsBadOptions checks that New reports invalid options as errors.
func TestNewRejectsBadOptions(t *testing.T) {
	_, js := connect(t, natsURL(), nil)
	cases := map[string]struct {
		js   jetstream.JetStream
		opts []outboxnats.Option
	}{
		"nil JetStream":             {nil, nil},
		"nil subject function":      {js, []outboxnats.Option{outboxnats.WithSubject(nil)}},
		"empty expected stream":     {js, []outboxnats.Option{outboxnats.WithExpectedStream("")}},
		"dotted expected stream":    {js, []outboxnats.Option{outboxnats.WithExpectedStream("A.B")}},
		"wildcard expected stream":  {js, []outboxnats.Option{outboxnats.WithExpectedStream("A*")}},
		"bad option after good one": {js, []outboxnats.Option{outboxnats.WithExpectedStream("OK"), outboxnats.WithSubject(nil)}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			pub, err := outboxnats.New(c.js, c.opts...)
			require.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
			assert.Nil(t, pub)
			assert.True(t, strings.HasPrefix(err.Error(), "outboxnats: "), err.Error())
		})
	}
	pub, err := outboxnats.New(js, nil)
	require.NoError(t, err, "a nil option is skipped")
	assert.NotNil(t, pub)
}

// TestInvalidSubjects checks the subjects the publisher refuses before sending, message by message.
func TestInvalidSubjects(t *testing.T) {
	_, js := connect(t, natsURL(), nil)
	for _, subject := range []string{"", ".a", "a.", "a..b", "a.*", "a.>.b", "*", "a b", "a.\tb"} {
		pub, err := outboxnats.New(js, outboxnats.WithSubject(func(outboxplugin.Message) string { return subject }))
		require.NoError(t, err)
		m := message("E", "A", "1", `{}`)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = pub.Publish(ctx, []outboxplugin.Message{m})
		cancel()
		var perr *outboxplugin.PublishError
		require.ErrorAs(t, err, &perr, "subject %q", subject)
		assert.ErrorIs(t, perr.Failed[m.ID], outboxnats.ErrInvalidSubject, "subject %q", subject)
	}
}
