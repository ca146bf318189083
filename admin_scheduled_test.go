package outboxplugin_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// scheduledFixture is a table with delayed events beside failed ones:
//
//	evs[0]  Reminder, scheduled a day ahead (DeliverAfter), written an hour ago: the oldest row
//	evs[1]  Reminder, scheduled two days ahead (DeliverAt)
//	evs[2]  Order, waiting for a retry in an hour (1 attempt, refused)
//	evs[3]  Order, dead
//	evs[4]  Order, due (new)
type scheduledFixture struct {
	db    *gorm.DB
	admin *outboxplugin.Admin
	evs   []outboxplugin.OutboxEvent
}

func newScheduledFixture(t *testing.T, d dialect) scheduledFixture {
	t.Helper()
	db := setup(t, d, nil)
	require.NoError(t, outboxplugin.AutoMigrate(db))
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		for _, e := range []struct {
			typ string
			opt outboxplugin.EmitOption
		}{
			{"Reminder", outboxplugin.DeliverAfter(24 * time.Hour)},
			{"Reminder", outboxplugin.DeliverAt(time.Now().Add(48 * time.Hour))},
			{"Order", nil}, {"Order", nil}, {"Order", nil},
		} {
			if err := outboxplugin.Emit(tx, e.typ, map[string]string{"t": e.typ}, e.opt); err != nil {
				return err
			}
		}
		return nil
	}))
	evs := loadEvents(t, db)
	require.Len(t, evs, 5)
	row := func(i int) *gorm.DB {
		return db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", evs[i].ID)
	}
	now := time.Now().UTC()
	require.NoError(t, row(0).Update("created_at", now.Add(-time.Hour)).Error)
	require.NoError(t, row(2).Updates(map[string]any{"next_attempt_at": now.Add(time.Hour), "attempts": 1, "last_error": "refused"}).Error)
	require.NoError(t, row(3).Updates(map[string]any{"dead_at": now.Add(-time.Minute), "attempts": 3, "last_error": "broker said no"}).Error)
	admin, err := outboxplugin.NewAdmin(db)
	require.NoError(t, err)
	return scheduledFixture{db: db, admin: admin, evs: loadEvents(t, db)}
}

// reload returns event i as the table has it now.
func (f scheduledFixture) reload(t *testing.T, i int) outboxplugin.OutboxEvent {
	t.Helper()
	var e outboxplugin.OutboxEvent
	require.NoError(t, f.db.Session(&gorm.Session{NewDB: true}).First(&e, f.evs[i].ID).Error)
	return e
}

// assertStillScheduled checks that event i keeps the time it was written with, unattempted.
func (f scheduledFixture) assertStillScheduled(t *testing.T, i int, msg string) {
	t.Helper()
	e := f.reload(t, i)
	require.NotNil(t, e.NextAttemptAt, "event %d: %s", i, msg)
	require.NotNil(t, f.evs[i].NextAttemptAt)
	assert.True(t, e.NextAttemptAt.Equal(*f.evs[i].NextAttemptAt), "event %d keeps its time: %s (was %v, is %v)", i, msg, f.evs[i].NextAttemptAt, e.NextAttemptAt)
	assert.Zero(t, e.Attempts, "event %d: %s", i, msg)
}

// Requeueing failed events never moves a delayed one: not by message id, not by filter (no state,
// or waiting), and a worker then leaves it alone. A waiting retry (attempts > 0) is requeued as
// before.
func TestAdminRequeueLeavesScheduledEvents(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newScheduledFixture(t, d)
		ctx := context.Background()

		n, err := f.admin.Requeue(ctx, f.evs[0].MessageID, f.evs[2].MessageID)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "the waiting retry only")
		f.assertStillScheduled(t, 0, "Requeue by id")
		assert.Nil(t, f.reload(t, 2).NextAttemptAt, "the waiting retry is due now")

		n, err = f.admin.RequeueWhere(ctx, outboxplugin.EventFilter{State: outboxplugin.StateWaiting})
		require.NoError(t, err)
		assert.Zero(t, n, "no failed event waits any more")
		n, err = f.admin.RequeueWhere(ctx, outboxplugin.EventFilter{})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "the dead event only")
		n, err = f.admin.RequeueWhere(ctx, outboxplugin.EventFilter{EventType: "Reminder"})
		require.NoError(t, err)
		assert.Zero(t, n)
		for _, i := range []int{0, 1} {
			f.assertStillScheduled(t, i, "RequeueWhere")
		}

		rec := newRecorder()
		_, err = newWorker(t, f.db, rec).ProcessOnce(ctx)
		require.NoError(t, err)
		got := publishedIDs(rec)
		assert.True(t, got[f.evs[2].MessageID] && got[f.evs[3].MessageID] && got[f.evs[4].MessageID], "the requeued and the due events are published: %v", got)
		assert.False(t, got[f.evs[0].MessageID] || got[f.evs[1].MessageID], "not the scheduled ones: %v", got)
	})
}

// A delayed event whose time has not come is scheduled: counted apart from the backlog (pending),
// by type, not in the oldest pending age; listed under its own state and not under waiting or
// pending; shown as scheduled. A failed event waiting for its retry is still waiting.
func TestAdminScheduledState(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newScheduledFixture(t, d)
		ctx := context.Background()
		st, err := f.admin.Stats(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(2), st.Scheduled)
		assert.Equal(t, int64(1), st.Waiting)
		assert.Equal(t, int64(1), st.Due)
		assert.Zero(t, st.Leased)
		assert.Equal(t, int64(2), st.Pending, "the waiting retry and the due event")
		assert.Equal(t, int64(1), st.Dead)
		assert.WithinDuration(t, f.evs[2].CreatedAt, st.OldestPending, time.Millisecond,
			"the reminder written an hour ago is not late")
		assert.Equal(t, []outboxplugin.TypeStats{{EventType: "Order", Pending: 2, Dead: 1}, {EventType: "Reminder", Scheduled: 2}}, st.ByType)

		for _, c := range []struct {
			state outboxplugin.EventState
			want  []int
		}{
			{outboxplugin.StateScheduled, []int{0, 1}},
			{outboxplugin.StateWaiting, []int{2}},
			{outboxplugin.StateDue, []int{4}},
			{outboxplugin.StatePending, []int{2, 4}},
			{"", []int{0, 1, 2, 3, 4}},
		} {
			page, err := f.admin.ListEvents(ctx, outboxplugin.EventFilter{State: c.state, Oldest: true})
			require.NoError(t, err, c.state)
			assert.ElementsMatch(t, idsOf(f.evs, c.want...), pageIDs(page), "state %q", c.state)
		}
		page, err := f.admin.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StateScheduled, EventType: "Order"})
		require.NoError(t, err)
		assert.Empty(t, page.Events)

		for i, want := range []outboxplugin.EventState{outboxplugin.StateScheduled, outboxplugin.StateScheduled,
			outboxplugin.StateWaiting, outboxplugin.StateDead, outboxplugin.StateDue} {
			e, err := f.admin.Event(ctx, f.evs[i].MessageID)
			require.NoError(t, err)
			assert.Equal(t, want, e.State, "event %d", i)
		}
		e, err := f.admin.Event(ctx, f.evs[0].MessageID)
		require.NoError(t, err)
		require.NotNil(t, e.NextAttemptAt)
		assert.WithinDuration(t, time.Now().Add(24*time.Hour), *e.NextAttemptAt, time.Minute, "when it will be delivered")

		st2, err := outboxplugin.ParseEventState(" Scheduled ")
		require.NoError(t, err)
		assert.Equal(t, outboxplugin.StateScheduled, st2)
	})
}

// DeliverNow, and DeliverNowWhere, make scheduled events due at once, and act on nothing else; a
// worker then publishes them.
func TestAdminDeliverNow(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newScheduledFixture(t, d)
		ctx := context.Background()
		n, err := f.admin.DeliverNow(ctx, f.evs[0].MessageID, f.evs[2].MessageID, f.evs[3].MessageID, f.evs[4].MessageID, "no-such-id")
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "the scheduled event only")
		e, err := f.admin.Event(ctx, f.evs[0].MessageID)
		require.NoError(t, err)
		assert.Equal(t, outboxplugin.StateDue, e.State)
		assert.Nil(t, e.NextAttemptAt)
		assert.Zero(t, e.Attempts)
		for i, want := range map[int]outboxplugin.EventState{2: outboxplugin.StateWaiting, 3: outboxplugin.StateDead, 1: outboxplugin.StateScheduled} {
			e, err := f.admin.Event(ctx, f.evs[i].MessageID)
			require.NoError(t, err)
			assert.Equal(t, want, e.State, "event %d is left alone", i)
		}

		rec := newRecorder()
		_, err = newWorker(t, f.db, rec).ProcessOnce(ctx)
		require.NoError(t, err)
		got := publishedIDs(rec)
		assert.True(t, got[f.evs[0].MessageID], "delivered now: %v", got)
		assert.False(t, got[f.evs[1].MessageID], "still scheduled: %v", got)

		_, err = f.admin.DeliverNowWhere(ctx, outboxplugin.EventFilter{State: outboxplugin.StateWaiting})
		assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter)
		_, err = f.admin.DeliverNowWhere(ctx, outboxplugin.EventFilter{State: outboxplugin.StateDead})
		assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter)
		n, err = f.admin.DeliverNowWhere(ctx, outboxplugin.EventFilter{EventType: "Order"})
		require.NoError(t, err)
		assert.Zero(t, n)
		n, err = f.admin.DeliverNowWhere(ctx, outboxplugin.EventFilter{})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		st, err := f.admin.Stats(ctx)
		require.NoError(t, err)
		assert.Zero(t, st.Scheduled)
		assert.Equal(t, int64(1), st.Waiting, "the retry still waits")
	})
}

func idsOf(evs []outboxplugin.OutboxEvent, i ...int) []int64 {
	out := make([]int64, len(i))
	for k, n := range i {
		out[k] = evs[n].ID
	}
	return out
}

// The worker's backlog measurement leaves scheduled events out of the backlog and of its oldest age,
// and reports them apart to a ScheduledObserver.
func TestBacklogLeavesOutScheduledEvents(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newScheduledFixture(t, d)
		var (
			mu                 sync.Mutex
			backlog, scheduled []int64
			oldest             []time.Time
		)
		obs := &scheduledObserver{backlogObserver: backlogObserver{onBacklog: func(n int64) {
			mu.Lock()
			defer mu.Unlock()
			backlog = append(backlog, n)
		}, onOldest: func(t time.Time) {
			mu.Lock()
			defer mu.Unlock()
			oldest = append(oldest, t)
		}}, onScheduled: func(n int64) {
			mu.Lock()
			defer mu.Unlock()
			scheduled = append(scheduled, n)
		}}
		// A broker that is down keeps the due event due (its attempt given back).
		down := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error {
			return fmt.Errorf("down: %w", outboxplugin.ErrBrokerUnavailable)
		})
		stop := runWorkers(t, 1, func() *outboxplugin.Worker {
			return newWorker(t, f.db, down, outboxplugin.WithObserver(obs), outboxplugin.WithBacklogInterval(20*time.Millisecond),
				outboxplugin.WithPollInterval(10*time.Millisecond))
		})
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(scheduled) >= 2
		}, 10*time.Second, 20*time.Millisecond)
		stop()
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, backlog, len(scheduled), "Scheduled follows each Backlog")
		require.Len(t, oldest, len(scheduled))
		last := len(backlog) - 1
		assert.EqualValues(t, 2, backlog[last], "the waiting retry and the due event; not the scheduled ones")
		assert.EqualValues(t, 2, scheduled[last])
		assert.WithinDuration(t, f.evs[2].CreatedAt, oldest[last], time.Millisecond, "the oldest pending event, not the reminder written an hour ago")
	})
}

type scheduledObserver struct {
	backlogObserver
	onScheduled func(int64)
}

var _ outboxplugin.ScheduledObserver = (*scheduledObserver)(nil)

func (o *scheduledObserver) Scheduled(_ context.Context, n int64) { o.onScheduled(n) }
