package outboxplugin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outboxplugin"
)

// linesOf returns the records of h whose message is msg.
func (h *recordingHandler) linesOf(msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.records {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

// countAt returns how many records of h have the level.
func (h *recordingHandler) countAt(level slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.records {
		if r.Level == level {
			n++
		}
	}
	return n
}

// attrOf returns the value of r's attribute key, or the zero Value.
func attrOf(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// misconfigured is a publisher whose destination does not exist until create is called.
type misconfigured struct {
	rec     *recorder
	created atomic.Bool
	checks  atomic.Int64
}

var errNoStream = fmt.Errorf("outboxtest: %w: no stream captures subject \"zz.User.User_create\" (server 127.0.0.1:4222)", outboxplugin.ErrMisconfigured)

func (p *misconfigured) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	if !p.created.Load() {
		failed := map[string]error{}
		for _, m := range msgs {
			failed[m.ID] = errNoStream
		}
		return outboxplugin.FailedMessages(failed)
	}
	return p.rec.Publish(ctx, msgs)
}

func (p *misconfigured) Check(context.Context) error {
	p.checks.Add(1)
	if !p.created.Load() {
		return errNoStream
	}
	return nil
}

// A destination that does not exist is a configuration error, not a refusal: however many batches
// the broker refuses for it, no event spends an attempt or dies, Health names the cause while it
// lasts, and the batch is one error line, not one per event. Once the destination exists, the events
// go out on their first attempt and Health is nil again.
func TestMisconfiguredDestinationSpendsNoAttempt(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(make([]User, 55)).Error)
		pub := &misconfigured{rec: newRecorder()}
		logs := &recordingHandler{}
		w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithMaxAttempts(2), outboxplugin.WithLogger(slog.New(logs)))
		require.NoError(t, err)
		ctx := context.Background()
		require.NoError(t, w.Health(), "nil before any batch")
		for range 5 { // more than the 2 attempts
			n, err := w.ProcessOnce(ctx)
			require.NoError(t, err)
			require.Zero(t, n)
		}
		for _, e := range loadEvents(t, db) {
			assert.Zero(t, e.Attempts, "no attempt spent")
			assert.Nil(t, e.DeadAt, "not dead")
			assert.False(t, e.Processed)
		}
		require.Error(t, w.Health())
		assert.ErrorIs(t, w.Health(), outboxplugin.ErrMisconfigured)
		assert.Contains(t, w.Health().Error(), `subject "zz.User.User_create"`)
		lines := logs.linesOf("outboxplugin: the broker did not take the events: a configuration error; they are pending again, no attempt spent, until it is fixed")
		require.NotEmpty(t, lines)
		assert.Equal(t, slog.LevelError, lines[0].Level)
		assert.EqualValues(t, 55, attrOf(lines[0], "events").Int64(), "one line for the batch's 55 events")
		assert.Equal(t, 1, logs.countAt(slog.LevelError), "the same cause is logged at error once, not once per batch")

		pub.created.Store(true)
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 55, n)
		assert.NoError(t, w.Health(), "ready again once the broker takes a batch")
		for _, e := range loadEvents(t, db) {
			assert.True(t, e.Processed)
			assert.Equal(t, 1, e.Attempts, "published on its first attempt")
		}
	})
}

// A whole-batch error wrapping ErrMisconfigured is not split in halves (it says nothing of the
// messages): one call per batch, nothing spent.
func TestMisconfiguredWholeBatchIsNotSplit(t *testing.T) {
	db := setup(t, dialects[0], nil)
	require.NoError(t, db.Create(make([]User, 8)).Error)
	var calls atomic.Int64
	pub := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error {
		calls.Add(1)
		return fmt.Errorf("broker: %w: ACCESS_REFUSED (login refused, 127.0.0.1:5672)", outboxplugin.ErrMisconfigured)
	})
	w := newWorker(t, db, pub)
	_, err := w.ProcessOnce(context.Background())
	require.NoError(t, err)
	assert.EqualValues(t, 1, calls.Load(), "not split")
	for _, e := range loadEvents(t, db) {
		assert.Zero(t, e.Attempts)
	}
	assert.ErrorIs(t, w.Health(), outboxplugin.ErrMisconfigured)
}

// 55 events dying in one batch for one cause are one error line, naming the count, the event types
// and the first ids — not 55 lines.
func TestDeathsAreSummarisedPerBatch(t *testing.T) {
	db := setup(t, dialects[0], nil)
	require.NoError(t, db.Create(make([]User, 55)).Error)
	require.NoError(t, db.Create(&[]Language{{Code: "a"}, {Code: "b"}, {Code: "c"}}).Error)
	rec := newRecorder()
	rec.fail = func(m outboxplugin.Message) error {
		if m.EventType == "Language_create" {
			return errors.New("message too large")
		}
		return errors.New("schema rejected")
	}
	logs := &recordingHandler{}
	w, err := outboxplugin.NewWorker(db, rec, outboxplugin.WithMaxAttempts(1), outboxplugin.WithLogger(slog.New(logs)))
	require.NoError(t, err)
	_, err = w.ProcessOnce(context.Background())
	require.NoError(t, err)
	lines := logs.linesOf("outboxplugin: events are dead after their last attempt")
	require.Len(t, lines, 2, "one line per cause")
	assert.Equal(t, 2, logs.countAt(slog.LevelError))
	byCount := map[int64]slog.Record{}
	for _, l := range lines {
		byCount[attrOf(l, "events").Int64()] = l
	}
	require.Contains(t, byCount, int64(55))
	require.Contains(t, byCount, int64(3))
	assert.Equal(t, []string{"User_create"}, attrOf(byCount[55], "event_types").Any())
	assert.Len(t, attrOf(byCount[55], "message_ids").Any(), 5, "the first few ids")
	assert.Contains(t, attrOf(byCount[55], "error").String(), "schema rejected")
}

// Run logs its start with its effective configuration and its stop; a progress line at info when
// something happened (published, refused, the backlog), at most every progress interval; and a
// debug line per batch.
func TestWorkerLogsStartProgressAndStop(t *testing.T) {
	db := setup(t, dialects[0], nil)
	logs := &recordingHandler{}
	rec := newRecorder()
	rec.fail = func(m outboxplugin.Message) error {
		if m.EventType == "Language_create" {
			return errors.New("refused")
		}
		return nil
	}
	w, err := outboxplugin.NewWorker(db, rec, outboxplugin.WithLogger(slog.New(logs)), outboxplugin.WithBatchSize(7),
		outboxplugin.WithPollInterval(20*time.Millisecond), outboxplugin.WithProgressInterval(50*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, db.Create(make([]User, 4)).Error)
	require.NoError(t, db.Create(&[]Language{{Code: "a"}, {Code: "b"}}).Error)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	require.Eventually(t, func() bool {
		var published, refused int64
		for _, r := range logs.linesOf("outboxplugin: progress") {
			published += attrOf(r, "published").Int64()
			refused += attrOf(r, "refused").Int64()
		}
		return published == 4 && refused >= 2
	}, 20*time.Second, 10*time.Millisecond, "progress lines add up to what happened")
	cancel()
	require.NoError(t, <-done)

	start := logs.linesOf("outboxplugin: worker started")
	require.Len(t, start, 1)
	assert.Equal(t, slog.LevelInfo, start[0].Level)
	assert.Equal(t, "outbox_events", attrOf(start[0], "table").String())
	assert.EqualValues(t, 7, attrOf(start[0], "batch_size").Int64())
	assert.Equal(t, "sqlite", attrOf(start[0], "database").String())
	assert.Equal(t, outboxplugin.DefaultLease, attrOf(start[0], "lease").Duration())
	assert.EqualValues(t, outboxplugin.DefaultMaxAttempts, attrOf(start[0], "max_attempts").Int64())
	assert.False(t, attrOf(start[0], "key_ordering").Bool())
	assert.Contains(t, attrOf(start[0], "publisher").String(), "recorder")
	stop := logs.linesOf("outboxplugin: worker stopped")
	require.Len(t, stop, 1)
	assert.EqualValues(t, 4, attrOf(stop[0], "published").Int64())

	progress := logs.linesOf("outboxplugin: progress")
	for _, r := range progress {
		assert.Equal(t, slog.LevelInfo, r.Level)
		assert.Equal(t, slog.KindInt64, attrOf(r, "backlog").Kind(), "the backlog is measured for the line")
	}
	assert.NotEmpty(t, logs.linesOf("outboxplugin: batch"), "a debug line per batch")
	for _, r := range logs.linesOf("outboxplugin: batch") {
		assert.Equal(t, slog.LevelDebug, r.Level)
	}
}

// Claims that fail — the outbox table dropped under a running worker — make Health fail, naming the
// claim; it recovers with the first claim that succeeds once the table is back.
func TestHealthReportsFailingClaims(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db))
		w := newWorker(t, db, newRecorder(), outboxplugin.WithPollInterval(20*time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { assert.NoError(t, w.Run(ctx)) })
		defer func() { cancel(); wg.Wait() }()
		require.NoError(t, db.Create(&User{Name: "a"}).Error)
		require.Eventually(t, func() bool { return len(loadEvents(t, db)) == 1 && loadEvents(t, db)[0].Processed }, 20*time.Second, 10*time.Millisecond)
		require.NoError(t, w.Health())

		require.NoError(t, db.Migrator().DropTable(&outboxplugin.OutboxEvent{}))
		require.Eventually(t, func() bool { return w.Health() != nil }, 20*time.Second, 10*time.Millisecond, "not healthy once claims fail")
		assert.Contains(t, w.Health().Error(), "claim")

		require.NoError(t, outboxplugin.AutoMigrate(db))
		require.Eventually(t, func() bool { return w.Health() == nil }, 60*time.Second, 10*time.Millisecond, "healthy again once a claim succeeds")
	})
}

// A CheckingPublisher is checked when Run starts: a configuration error is logged at error and makes
// Health fail before any event exists; Run keeps running and checks again, and Health recovers once
// the check passes.
func TestStartCheckOfTheDestination(t *testing.T) {
	db := setup(t, dialects[0], nil)
	pub := &misconfigured{rec: newRecorder()}
	logs := &recordingHandler{}
	w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithLogger(slog.New(logs)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, w.Run(ctx)) })
	defer func() { cancel(); wg.Wait() }()
	require.Eventually(t, func() bool { return w.Health() != nil }, 20*time.Second, 10*time.Millisecond)
	assert.ErrorIs(t, w.Health(), outboxplugin.ErrMisconfigured)
	lines := logs.linesOf("outboxplugin: the publisher's start check found a configuration error; the relay runs, not ready, and checks again")
	require.Len(t, lines, 1)
	assert.Equal(t, slog.LevelError, lines[0].Level)
	assert.Contains(t, attrOf(lines[0], "error").String(), "zz.User.User_create")

	pub.created.Store(true)
	require.Eventually(t, func() bool { return w.Health() == nil }, 30*time.Second, 20*time.Millisecond, "the check runs again and passes")
	checks := pub.checks.Load()
	assert.NotEmpty(t, logs.linesOf("outboxplugin: the publisher's start check passes now"))
	require.NoError(t, db.Create(&User{Name: "a"}).Error)
	require.Eventually(t, func() bool { return len(pub.rec.published()) == 1 }, 20*time.Second, 10*time.Millisecond)
	assert.Equal(t, checks, pub.checks.Load(), "no more checks once one passed")
}
