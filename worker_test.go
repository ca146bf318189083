package outboxplugin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// recorder is a publisher that keeps what it was given.
type recorder struct {
	mu    sync.Mutex
	msgs  []outboxplugin.Message
	count map[string]int
	fail  func(m outboxplugin.Message) error // nil: everything succeeds
}

func newRecorder() *recorder { return &recorder{count: map[string]int{}} }

func (r *recorder) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	failed := map[string]error{}
	for _, m := range msgs {
		if r.fail != nil {
			if err := r.fail(m); err != nil {
				failed[m.ID] = err
				continue
			}
		}
		r.msgs = append(r.msgs, m)
		r.count[m.ID]++
	}
	return outboxplugin.FailedMessages(failed)
}

func (r *recorder) published() []outboxplugin.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outboxplugin.Message(nil), r.msgs...)
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.count)
}

// outboxRow reads one outbox row back by message id.
func outboxRow(t testing.TB, db *gorm.DB, messageID string) outboxplugin.OutboxEvent {
	t.Helper()
	var e outboxplugin.OutboxEvent
	require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Where("message_id = ?", messageID).First(&e).Error)
	return e
}

func newWorker(t testing.TB, db *gorm.DB, pub outboxplugin.Publisher, opts ...outboxplugin.WorkerOption) *outboxplugin.Worker {
	t.Helper()
	w, err := outboxplugin.NewWorker(db, pub, append([]outboxplugin.WorkerOption{outboxplugin.WithLogger(quietLogger)}, opts...)...)
	require.NoError(t, err)
	return w
}

func TestWorkerPublishesInOrderAndMarksProcessed(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		users := []User{{Name: "a"}, {Name: "b"}, {Name: "c"}}
		require.NoError(t, db.Create(&users).Error)
		require.NoError(t, db.Model(&users[1]).Update("age", 5).Error)
		require.NoError(t, db.WithContext(context.WithValue(context.Background(), traceKey{}, "x")).Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Hello", map[string]int{"n": 1}, outboxplugin.WithHeaders(map[string]string{"h": "v"}))
		}))
		stored := loadEvents(t, db)

		rec := newRecorder()
		w := newWorker(t, db, rec)
		n, err := w.ProcessOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, 5, n)

		got := rec.published()
		require.Len(t, got, 5)
		for i, m := range got {
			e := stored[i]
			assert.Equal(t, e.MessageID, m.ID, "creation order")
			assert.Equal(t, e.EventType, m.EventType)
			assert.JSONEq(t, string(e.Payload), string(m.Payload))
			assert.Equal(t, 1, m.Attempt)
			assert.WithinDuration(t, e.CreatedAt, m.CreatedAt, time.Millisecond)
		}
		assert.Equal(t, fmt.Sprintf("User:%d", users[0].ID), got[0].Key)
		assert.Equal(t, "User", got[0].AggregateType)
		assert.Equal(t, "User_update", got[3].EventType)
		assert.Equal(t, "", got[4].Key, "an emitted event without aggregate has no key")
		assert.Equal(t, map[string]string{"h": "v"}, got[4].Headers)

		for _, e := range loadEvents(t, db) {
			assert.True(t, e.Processed)
			assert.NotNil(t, e.ProcessedAt)
			assert.Empty(t, e.LeaseOwner())
			assert.Nil(t, e.LockedUntil)
			assert.Equal(t, 1, e.Attempts)
		}
		n, err = w.ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Zero(t, n, "nothing left")
	})
}

func TestWorkerNeverPublishesRolledBackWrites(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		_ = db.Transaction(func(tx *gorm.DB) error {
			require.NoError(t, tx.Create(&User{Name: "ghost"}).Error)
			require.NoError(t, outboxplugin.Emit(tx, "Ghost", nil))
			return errors.New("roll back")
		})
		kept := User{Name: "kept"}
		require.NoError(t, db.Create(&kept).Error)

		rec := newRecorder()
		_, err := newWorker(t, db, rec).ProcessOnce(context.Background())
		require.NoError(t, err)
		got := rec.published()
		require.Len(t, got, 1)
		assert.Equal(t, fmt.Sprintf("User:%d", kept.ID), got[0].Key)
	})
}

func TestWorkerDeleteOnPublish(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&[]User{{Name: "a"}, {Name: "b"}}).Error)
		n, err := newWorker(t, db, newRecorder(), outboxplugin.WithDeleteOnPublish()).ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		assert.Empty(t, loadEvents(t, db))
	})
}

// The broker refuses an event: it is retried after a backoff, and becomes dead after the last
// attempt; requeueing brings it back.
func TestWorkerRetriesWithBackoffThenDead(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&User{Name: "poison"}).Error)
		msgID := loadEvents(t, db)[0].MessageID

		brokerDown := errors.New("broker down")
		failing := true
		var mu sync.Mutex
		calls := 0
		pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			defer mu.Unlock()
			calls++
			if failing {
				return fmt.Errorf("refused: %w", &outboxplugin.PublishError{Failed: map[string]error{msgs[0].ID: brokerDown}})
			}
			return nil
		})
		var deadMu sync.Mutex
		var dead []string
		obs := &deadObserver{onDead: func(m outboxplugin.Message, err error) {
			deadMu.Lock()
			defer deadMu.Unlock()
			dead = append(dead, m.ID)
			assert.ErrorIs(t, err, brokerDown)
		}}
		backoff := outboxplugin.ExponentialBackoff{Base: 300 * time.Millisecond, Max: time.Second}
		w := newWorker(t, db, pub, outboxplugin.WithMaxAttempts(3), outboxplugin.WithRetryPolicy(backoff), outboxplugin.WithObserver(obs))
		ctx := context.Background()

		failedAt := time.Now()
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err, "a failed publish is not an error of ProcessOnce")
		require.Zero(t, n)
		row := outboxRow(t, db, msgID)
		assert.Equal(t, 1, row.Attempts, "the attempt is recorded although publishing failed")
		require.NotNil(t, row.LastError)
		assert.Contains(t, *row.LastError, "broker down")
		require.NotNil(t, row.NextAttemptAt)
		assert.WithinDuration(t, failedAt.Add(300*time.Millisecond), *row.NextAttemptAt, 150*time.Millisecond)
		assert.Empty(t, row.LeaseOwner())

		// Not due yet: nothing is claimed.
		n, err = w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Zero(t, n)
		assert.Equal(t, 1, calls)

		// Attempts 2 and 3, each after its backoff; the third is the last.
		for attempt := 2; attempt <= 3; attempt++ {
			require.Eventually(t, func() bool {
				_, err := w.ProcessOnce(ctx)
				require.NoError(t, err)
				return outboxRow(t, db, msgID).Attempts == attempt
			}, 5*time.Second, 20*time.Millisecond)
		}
		row = outboxRow(t, db, msgID)
		require.NotNil(t, row.DeadAt, "dead after the last attempt")
		assert.False(t, row.Processed)
		assert.Equal(t, []string{msgID}, dead)

		// Dead events are not retried.
		time.Sleep(1200 * time.Millisecond)
		n, err = w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Zero(t, n)
		assert.Equal(t, 3, calls)

		// Requeued, with the broker back: published.
		mu.Lock()
		failing = false
		mu.Unlock()
		requeued, err := w.RequeueDead(ctx, msgID)
		require.NoError(t, err)
		assert.EqualValues(t, 1, requeued)
		n, err = w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.True(t, outboxRow(t, db, msgID).Processed)
	})
}

type deadObserver struct {
	outboxplugin.NopObserver
	onDead func(outboxplugin.Message, error)
}

func (o *deadObserver) Dead(_ context.Context, m outboxplugin.Message, err error) { o.onDead(m, err) }

func TestWorkerPartlyFailedBatch(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		users := []User{{Name: "ok1"}, {Name: "bad"}, {Name: "ok2"}}
		require.NoError(t, db.Create(&users).Error)
		badKey := fmt.Sprintf("User:%d", users[1].ID)

		rec := newRecorder()
		rec.fail = func(m outboxplugin.Message) error {
			if m.Key == badKey {
				return errors.New("rejected by broker")
			}
			return nil
		}
		var results []outboxplugin.BatchResult
		obs := &batchObserver{onBatch: func(r outboxplugin.BatchResult) { results = append(results, r) }}
		w := newWorker(t, db, rec, outboxplugin.WithObserver(obs),
			outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: time.Millisecond, Max: time.Millisecond}))
		n, err := w.ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		require.Len(t, results, 1)
		assert.Len(t, results[0].Published, 2)
		require.Len(t, results[0].Failed, 1)
		assert.Equal(t, badKey, results[0].Failed[0].Message.Key)

		evs := loadEvents(t, db)
		assert.True(t, evs[0].Processed)
		assert.False(t, evs[1].Processed)
		assert.Equal(t, "rejected by broker", *evs[1].LastError)
		assert.True(t, evs[2].Processed)

		// Only the failed one is retried.
		rec.fail = nil
		time.Sleep(5 * time.Millisecond)
		n, err = w.ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.Equal(t, 3, rec.distinct())
		for _, c := range rec.count {
			assert.Equal(t, 1, c)
		}
	})
}

type batchObserver struct {
	outboxplugin.NopObserver
	onBatch func(outboxplugin.BatchResult)
}

func (o *batchObserver) BatchDone(_ context.Context, r outboxplugin.BatchResult) { o.onBatch(r) }

func TestWorkerPublisherPanicIsAFailure(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&User{Name: "a"}).Error)
		w := newWorker(t, db, outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error { panic("boom") }))
		n, err := w.ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Zero(t, n)
		e := loadEvents(t, db)[0]
		require.NotNil(t, e.LastError)
		assert.Contains(t, *e.LastError, "panicked: boom")
	})
}

// A row leased by a relay that died is left alone until its lease runs out, then taken over; a
// relay whose lease was taken over does not mark the row.
func TestWorkerLeases(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&User{Name: "a"}).Error)
		plain := db.Session(&gorm.Session{NewDB: true})
		ctx := context.Background()

		require.NoError(t, plain.Model(&outboxplugin.OutboxEvent{}).Where("1 = 1").
			Updates(map[string]any{"locked_by": "dead-relay", "locked_until": time.Now().UTC().Add(time.Hour)}).Error)
		rec := newRecorder()
		w := newWorker(t, db, rec)
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Zero(t, n, "leased to another relay")

		require.NoError(t, plain.Model(&outboxplugin.OutboxEvent{}).Where("1 = 1").
			Update("locked_until", time.Now().UTC().Add(-time.Second)).Error)
		// This publisher loses its lease while it publishes: another relay took the row.
		stolen := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			return plain.Model(&outboxplugin.OutboxEvent{}).Where("1 = 1").Update("locked_by", "other-relay").Error
		})
		n, err = newWorker(t, db, stolen).ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "published")
		e := loadEvents(t, db)[0]
		assert.False(t, e.Processed, "not marked: the lease is no longer ours")
		assert.Equal(t, "other-relay", *e.LockedBy)
	})
}

// Four relays drain 10 000 events at once: each event is published exactly once.
func TestConcurrentWorkersPublishEachEventOnce(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		const total = 10000
		users := make([]User, total)
		for i := range users {
			users[i] = User{Name: fmt.Sprint("u", i)}
		}
		require.NoError(t, db.CreateInBatches(&users, 500).Error)
		require.Len(t, loadEvents(t, db), total)

		rec := newRecorder()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for i := 0; i < 4; i++ {
			w := newWorker(t, db, rec, outboxplugin.WithPollInterval(20*time.Millisecond))
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- w.Run(ctx)
			}()
		}
		require.Eventually(t, func() bool { return rec.distinct() == total }, 90*time.Second, 50*time.Millisecond)
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		assert.Len(t, rec.published(), total, "no duplicates")
		var pending int64
		require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", false).Count(&pending).Error)
		assert.Zero(t, pending)
	})
}

func TestCleanup(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		old := time.Now().UTC().Add(-10 * 24 * time.Hour)
		recent := time.Now().UTC().Add(-time.Hour)
		deadAt := old
		rows := []outboxplugin.OutboxEvent{
			{EventType: "old_processed", CreatedAt: old, Processed: true},
			{EventType: "old_processed", CreatedAt: old, Processed: true},
			{EventType: "recent_processed", CreatedAt: recent, Processed: true},
			{EventType: "old_pending", CreatedAt: old},
			{EventType: "old_dead", CreatedAt: old, DeadAt: &deadAt},
		}
		require.NoError(t, db.Create(&rows).Error)
		n, err := newWorker(t, db, newRecorder()).Cleanup(context.Background(), 7*24*time.Hour)
		require.NoError(t, err)
		assert.EqualValues(t, 2, n)
		var left []string
		for _, e := range loadEvents(t, db) {
			left = append(left, e.EventType)
		}
		assert.Equal(t, []string{"recent_processed", "old_pending", "old_dead"}, left)
	})
}

func TestCleanupInBatches(t *testing.T) {
	db := setup(t, dialects[0], nil)
	old := time.Now().UTC().Add(-48 * time.Hour)
	rows := make([]outboxplugin.OutboxEvent, 2500)
	for i := range rows {
		rows[i] = outboxplugin.OutboxEvent{EventType: "x", CreatedAt: old, Processed: true}
	}
	require.NoError(t, db.CreateInBatches(&rows, 500).Error)
	n, err := newWorker(t, db, newRecorder()).Cleanup(context.Background(), 24*time.Hour)
	require.NoError(t, err)
	assert.EqualValues(t, 2500, n)
	assert.Empty(t, loadEvents(t, db))
}

// Run returns nil when its context ends, hands back the batch whose publishing it cut short, and
// leaves no goroutine behind.
func TestWorkerShutdown(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&User{Name: "a"}).Error)

		started := make(chan struct{})
		blocking := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
		w := newWorker(t, db, blocking, outboxplugin.WithPollInterval(10*time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		<-started
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
		e := loadEvents(t, db)[0]
		assert.False(t, e.Processed)
		assert.Empty(t, e.LeaseOwner(), "handed back")
		assert.Zero(t, e.Attempts, "an interrupted delivery does not count")
		assert.Nil(t, e.LastError)

		require.Eventually(t, func() bool { return workerGoroutines() == 0 }, 5*time.Second, 10*time.Millisecond,
			"goroutines of the worker left behind")
	})
}

func TestWorkerInvalidOptions(t *testing.T) {
	db := openDB(t, dialects[0], nil)
	pub := newRecorder()
	cases := map[string]struct {
		db   *gorm.DB
		pub  outboxplugin.Publisher
		opts []outboxplugin.WorkerOption
	}{
		"batch size":   {db, pub, []outboxplugin.WorkerOption{outboxplugin.WithBatchSize(0)}},
		"poll":         {db, pub, []outboxplugin.WorkerOption{outboxplugin.WithPollInterval(0)}},
		"lease":        {db, pub, []outboxplugin.WorkerOption{outboxplugin.WithLease(time.Second / 2)}},
		"attempts":     {db, pub, []outboxplugin.WorkerOption{outboxplugin.WithMaxAttempts(0)}},
		"nil policy":   {db, pub, []outboxplugin.WorkerOption{outboxplugin.WithRetryPolicy(nil)}},
		"table":        {db, pub, []outboxplugin.WorkerOption{outboxplugin.WithTable("x;y")}},
		"nil db":       {nil, pub, nil},
		"nil pub":      {db, nil, nil},
		"nil logger":   {db, pub, []outboxplugin.WorkerOption{outboxplugin.WithLogger(nil)}},
		"nil observer": {db, pub, []outboxplugin.WorkerOption{outboxplugin.WithObserver(nil)}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			w, err := outboxplugin.NewWorker(c.db, c.pub, c.opts...)
			assert.Nil(t, w, "no worker to start by mistake")
			assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
		})
	}
}

// workerGoroutines counts the goroutines running the worker's code (database/sql keeps goroutines of
// its own, so a plain count says nothing).
func workerGoroutines() int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), "outboxplugin.(*Worker)")
}

// On PostgreSQL the outbox gets the storage settings claims want: from AutoMigrate, or from the first
// run of a worker when the table was made with db.AutoMigrate; a value set by the user is kept.
func TestPostgresStorageOptions(t *testing.T) {
	db := setupGormTable(t, dialects[1], nil)
	reloptions := func() string {
		var s string
		require.NoError(t, db.Raw(`SELECT COALESCE(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = 'outbox_events'::regclass`).Scan(&s).Error)
		return s
	}
	require.Empty(t, reloptions(), "db.AutoMigrate sets nothing")

	require.NoError(t, db.Exec(`ALTER TABLE outbox_events SET (fillfactor = 90)`).Error)
	_, err := newWorker(t, db, newRecorder()).ProcessOnce(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "fillfactor=90", reloptions(), "the worker runs no DDL")
	require.NoError(t, outboxplugin.AutoMigrate(db))
	assert.Equal(t, "fillfactor=90,autovacuum_vacuum_scale_factor=0,autovacuum_vacuum_threshold=10000", reloptions(),
		"AutoMigrate adds what is missing, and keeps a value of the user's")

	require.NoError(t, db.Exec(`ALTER TABLE outbox_events RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold)`).Error)
	require.NoError(t, outboxplugin.AutoMigrate(db))
	assert.Equal(t, "fillfactor=50,autovacuum_vacuum_scale_factor=0,autovacuum_vacuum_threshold=10000", reloptions())
}

func TestPeriodicCleanupAndBacklog(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		old := time.Now().UTC().Add(-48 * time.Hour)
		require.NoError(t, db.Create(&[]outboxplugin.OutboxEvent{
			{EventType: "old_processed", CreatedAt: old, Processed: true},
			{EventType: "recent_processed", CreatedAt: time.Now().UTC().Add(-time.Minute), Processed: true},
		}).Error)
		var (
			mu      sync.Mutex
			backlog []int64
			oldest  []time.Time
		)
		obs := &backlogObserver{onBacklog: func(n int64) {
			mu.Lock()
			defer mu.Unlock()
			backlog = append(backlog, n)
		}, onOldest: func(t time.Time) {
			mu.Lock()
			defer mu.Unlock()
			oldest = append(oldest, t)
		}}
		// A publisher that fails keeps one event pending, for the backlog to count.
		failing := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error { return errors.New("down") })
		require.NoError(t, db.Create(&User{Name: "pending"}).Error)
		stop := runWorkers(t, 1, func() *outboxplugin.Worker {
			return newWorker(t, db, failing, outboxplugin.WithCleanup(20*time.Millisecond), outboxplugin.WithRetention(24*time.Hour),
				outboxplugin.WithObserver(obs), outboxplugin.WithBacklogInterval(20*time.Millisecond), outboxplugin.WithPollInterval(10*time.Millisecond))
		})
		require.Eventually(t, func() bool {
			var types []string
			for _, e := range loadEvents(t, db) {
				types = append(types, e.EventType)
			}
			return len(types) == 2 && types[0] == "recent_processed" && types[1] == "User_create"
		}, 10*time.Second, 20*time.Millisecond, "the old processed event is cleaned up, the others stay")
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(backlog) >= 2
		}, 10*time.Second, 20*time.Millisecond)
		stop()
		mu.Lock()
		defer mu.Unlock()
		assert.EqualValues(t, 1, backlog[len(backlog)-1], "one event waiting")
		require.Len(t, oldest, len(backlog), "OldestPending follows each Backlog")
		var pending outboxplugin.OutboxEvent
		for _, e := range loadEvents(t, db) {
			if e.EventType == "User_create" {
				pending = e
			}
		}
		assert.WithinDuration(t, pending.CreatedAt, oldest[len(oldest)-1], time.Millisecond,
			"the oldest pending event's created_at; the old and recent processed ones do not count")
	})
}

type backlogObserver struct {
	outboxplugin.NopObserver
	onBacklog func(int64)
	onOldest  func(time.Time)
}

var _ outboxplugin.BacklogAgeObserver = (*backlogObserver)(nil)

func (o *backlogObserver) Backlog(_ context.Context, n int64)           { o.onBacklog(n) }
func (o *backlogObserver) OldestPending(_ context.Context, t time.Time) { o.onOldest(t) }

// countingHandler counts log records by level.
type countingHandler struct {
	mu     sync.Mutex
	counts map[slog.Level]int
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[r.Level]++
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// A broker that hangs costs one publish timeout: the batch then counts as not delivered, its rows are
// pending again (no lease, no lock held, the attempt given back: a timeout says nothing about the
// messages), and the failure is logged once for the batch, not once per event.
func TestPublishTimeout(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		// The table as AutoMigrate makes it: on a table made by GORM's own, the worker also warns
		// of what the table lacks (TestGormAutoMigrateTableWarnings).
		require.NoError(t, outboxplugin.AutoMigrate(db))
		require.NoError(t, db.Create(&[]User{{Name: "a"}, {Name: "b"}, {Name: "c"}}).Error)
		hanging := outboxplugin.PublisherFunc(func(ctx context.Context, _ []outboxplugin.Message) error {
			<-ctx.Done()
			return ctx.Err()
		})
		logs := &countingHandler{counts: map[slog.Level]int{}}
		w, err := outboxplugin.NewWorker(db, hanging, outboxplugin.WithPublishTimeout(200*time.Millisecond), outboxplugin.WithLogger(slog.New(logs)))
		require.NoError(t, err)
		start := time.Now()
		n, err := w.ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Zero(t, n)
		assert.Less(t, time.Since(start), 5*time.Second)
		for _, e := range loadEvents(t, db) {
			assert.Empty(t, e.LeaseOwner())
			assert.Zero(t, e.Attempts, "no attempt spent")
			assert.Nil(t, e.NextAttemptAt, "due again at once")
			require.NotNil(t, e.LastError)
			assert.Contains(t, *e.LastError, "deadline exceeded")
		}
		assert.Equal(t, 1, logs.counts[slog.LevelWarn], "one log line for the failed batch")
	})
}
