package outboxplugin_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// adminFixture is a table with events in every state:
//
//	evs[0], evs[1]  processed (evs[0] created ten days ago)
//	evs[2]          dead          evs[8] dead (Billed)
//	evs[3]          waiting for a retry in an hour
//	evs[4]          leased to another worker for an hour
//	evs[5], evs[6]  due (new)     evs[7] due (a retry whose time has come)    evs[9] due (Billed)
//
// evs[0..7] are User creates, evs[8..9] Emit "Billed" with the aggregate Invoice 42.
type adminFixture struct {
	db    *gorm.DB
	admin *outboxplugin.Admin
	evs   []outboxplugin.OutboxEvent
}

func newAdminFixture(t *testing.T, d dialect) adminFixture {
	t.Helper()
	db := setup(t, d, nil)
	require.NoError(t, outboxplugin.AutoMigrate(db))
	users := make([]User, 8)
	for i := range users {
		require.NoError(t, db.Create(&users[i]).Error) // one event each, in id order
	}
	for range 2 {
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Billed", map[string]int{"invoice": 42}, outboxplugin.WithAggregate("Invoice", "42"))
		}))
	}
	evs := loadEvents(t, db)
	require.Len(t, evs, 10)
	rows := func(i ...int) *gorm.DB {
		ids := make([]int64, len(i))
		for k, n := range i {
			ids[k] = evs[n].ID
		}
		return db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id IN ?", ids)
	}
	past, later := time.Now().Add(-time.Minute).UTC(), time.Now().Add(time.Hour).UTC()
	require.NoError(t, rows(0, 1).Updates(map[string]any{"processed": true, "processed_at": past, "attempts": 1}).Error)
	require.NoError(t, rows(0).Update("created_at", time.Now().Add(-10*24*time.Hour).UTC()).Error)
	require.NoError(t, rows(2, 8).Updates(map[string]any{"dead_at": past, "attempts": 3, "last_error": "broker said no"}).Error)
	require.NoError(t, rows(3).Updates(map[string]any{"next_attempt_at": later, "attempts": 1, "last_error": "refused"}).Error)
	require.NoError(t, rows(4).Updates(map[string]any{"locked_by": "other-worker", "locked_until": later, "attempts": 1}).Error)
	require.NoError(t, rows(7).Updates(map[string]any{"next_attempt_at": past, "attempts": 1, "last_error": "refused"}).Error)
	admin, err := outboxplugin.NewAdmin(db)
	require.NoError(t, err)
	return adminFixture{db: db, admin: admin, evs: loadEvents(t, db)}
}

func (f adminFixture) ids(i ...int) []int64 {
	out := make([]int64, len(i))
	for k, n := range i {
		out[k] = f.evs[n].ID
	}
	return out
}

func pageIDs(p outboxplugin.Page) []int64 {
	out := make([]int64, len(p.Events))
	for i, e := range p.Events {
		out[i] = e.ID
	}
	return out
}

func TestAdminStats(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newAdminFixture(t, d)
		st, err := f.admin.Stats(context.Background())
		require.NoError(t, err)
		assert.Equal(t, int64(6), st.Pending, "due, leased and waiting")
		assert.Equal(t, int64(4), st.Due)
		assert.Equal(t, int64(1), st.Leased)
		assert.Equal(t, int64(1), st.Waiting)
		assert.Equal(t, int64(2), st.Dead)
		assert.Equal(t, int64(2), st.Processed)
		assert.False(t, st.ProcessedApproximate, "a small count is exact")
		assert.WithinDuration(t, f.evs[3].CreatedAt, st.OldestPending, time.Millisecond, "the oldest event still to be delivered")
		assert.Equal(t, st.At.Sub(st.OldestPending), st.OldestPendingAge)
		userType := f.evs[0].EventType
		assert.Equal(t, []outboxplugin.TypeStats{{EventType: "Billed", Pending: 1, Dead: 1}, {EventType: userType, Pending: 5, Dead: 1}}, st.ByType)

		// An empty outbox.
		require.NoError(t, f.db.Session(&gorm.Session{AllowGlobalUpdate: true}).Delete(&outboxplugin.OutboxEvent{}).Error)
		st, err = f.admin.Stats(context.Background())
		require.NoError(t, err)
		assert.Zero(t, st.Pending+st.Dead+st.Processed)
		assert.True(t, st.OldestPending.IsZero())
		assert.Zero(t, st.OldestPendingAge)
		assert.Empty(t, st.ByType)
	})
}

func TestAdminListEvents(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newAdminFixture(t, d)
		ctx := context.Background()
		// Creation order: evs[0] (ten days ago), then evs[1..9].
		oldestFirst := f.ids(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
		newestFirst := slices.Clone(oldestFirst)
		slices.Reverse(newestFirst)
		for _, oldest := range []bool{false, true} {
			var got []int64
			filter := outboxplugin.EventFilter{Limit: 3, Oldest: oldest}
			pages := 0
			for {
				p, err := f.admin.ListEvents(ctx, filter)
				require.NoError(t, err)
				got = append(got, pageIDs(p)...)
				pages++
				if p.Next == "" {
					break
				}
				require.Less(t, pages, 10, "the cursor must move")
				filter.Cursor = p.Next
			}
			want := newestFirst
			if oldest {
				want = oldestFirst
			}
			assert.Equal(t, want, got, "every event once, in order (oldest first: %v)", oldest)
			assert.Equal(t, 4, pages)
		}

		byState := map[outboxplugin.EventState][]int64{
			outboxplugin.StateProcessed: f.ids(0, 1),
			outboxplugin.StateDead:      f.ids(2, 8),
			outboxplugin.StateWaiting:   f.ids(3),
			outboxplugin.StateLeased:    f.ids(4),
			outboxplugin.StateDue:       f.ids(5, 6, 7, 9),
			outboxplugin.StatePending:   f.ids(3, 4, 5, 6, 7, 9),
		}
		for state, want := range byState {
			p, err := f.admin.ListEvents(ctx, outboxplugin.EventFilter{State: state, Oldest: true})
			require.NoError(t, err)
			assert.Equal(t, want, pageIDs(p), "state %s", state)
			for _, e := range p.Events {
				if state != outboxplugin.StatePending {
					assert.Equal(t, state, e.State, "event %d", e.ID)
				}
			}
		}
		filtered := map[string]outboxplugin.EventFilter{
			"type":           {EventType: "Billed"},
			"aggregate":      {AggregateType: "Invoice", AggregateID: "42"},
			"dead of a type": {EventType: "Billed", State: outboxplugin.StateDead},
			"message id":     {MessageID: f.evs[1].MessageID},
			"since":          {Since: f.evs[1].CreatedAt.Add(-time.Microsecond), Until: f.evs[3].CreatedAt},
		}
		want := map[string][]int64{
			"type":           f.ids(8, 9),
			"aggregate":      f.ids(8, 9),
			"dead of a type": f.ids(8),
			"message id":     f.ids(1),
			"since":          f.ids(1, 2),
		}
		for name, filter := range filtered {
			filter.Oldest = true
			p, err := f.admin.ListEvents(ctx, filter)
			require.NoError(t, err, name)
			assert.Equal(t, want[name], pageIDs(p), name)
		}

		// What an event shows.
		p, err := f.admin.ListEvents(ctx, outboxplugin.EventFilter{MessageID: f.evs[2].MessageID})
		require.NoError(t, err)
		require.Len(t, p.Events, 1)
		dead := p.Events[0]
		assert.Equal(t, outboxplugin.StateDead, dead.State)
		assert.Equal(t, 3, dead.Attempts)
		assert.Equal(t, "broker said no", dead.LastError)
		assert.NotNil(t, dead.DeadAt)
		assert.JSONEq(t, string(f.evs[2].Payload), string(dead.Payload))

		for name, bad := range map[string]outboxplugin.EventFilter{
			"state":  {State: "stuck"},
			"limit":  {Limit: 1001},
			"cursor": {Cursor: "page-2"},
		} {
			_, err := f.admin.ListEvents(ctx, bad)
			assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter, name)
		}
	})
}

func TestAdminEvent(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newAdminFixture(t, d)
		ctx := context.Background()
		for i, state := range map[int]outboxplugin.EventState{
			1: outboxplugin.StateProcessed, 2: outboxplugin.StateDead,
			3: outboxplugin.StateWaiting, 4: outboxplugin.StateLeased, 7: outboxplugin.StateDue,
		} {
			e, err := f.admin.Event(ctx, f.evs[i].MessageID)
			require.NoError(t, err, "event %d", i)
			assert.Equal(t, f.evs[i].ID, e.ID)
			assert.Equal(t, state, e.State, "event %d", i)
		}
		w, err := f.admin.Event(ctx, f.evs[3].MessageID)
		require.NoError(t, err)
		assert.Equal(t, "refused", w.LastError)
		require.NotNil(t, w.NextAttemptAt)
		assert.True(t, w.NextAttemptAt.After(time.Now()))
		l, err := f.admin.Event(ctx, f.evs[4].MessageID)
		require.NoError(t, err)
		assert.Equal(t, "other-worker", l.LockedBy)

		// evs[0]'s created_at was moved ten days away from its id's time: among processed rows
		// Event looks within a minute of that time only, so that an id that is not there costs no
		// more than one that is; ListEvents over its time finds it.
		_, err = f.admin.Event(ctx, f.evs[0].MessageID)
		assert.ErrorIs(t, err, outboxplugin.ErrEventNotFound)
		old, err := f.admin.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StateProcessed, Until: time.Now().Add(-24 * time.Hour)})
		require.NoError(t, err)
		assert.Equal(t, []int64{f.evs[0].ID}, pageIDs(old))

		// A processed event found without its UUIDv7's time: a message id written by hand.
		require.NoError(t, f.db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).
			Where("id = ?", f.evs[1].ID).Update("message_id", "order-1-placed").Error)
		e, err := f.admin.Event(ctx, "order-1-placed")
		require.NoError(t, err)
		assert.Equal(t, f.evs[1].ID, e.ID)

		_, err = f.admin.Event(ctx, "0190a6f0-0000-7000-8000-000000000000")
		assert.ErrorIs(t, err, outboxplugin.ErrEventNotFound)
		_, err = f.admin.Event(ctx, "")
		assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter)
	})
}

func TestAdminRequeueAndDiscard(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newAdminFixture(t, d)
		ctx := context.Background()
		// Only failed events are requeued: not the processed, leased or due one named beside them.
		n, err := f.admin.Requeue(ctx, f.evs[2].MessageID, f.evs[3].MessageID, f.evs[1].MessageID, f.evs[4].MessageID, f.evs[5].MessageID, "no-such-id")
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		for _, i := range []int{2, 3} {
			e, err := f.admin.Event(ctx, f.evs[i].MessageID)
			require.NoError(t, err)
			assert.Equal(t, outboxplugin.StateDue, e.State, "event %d", i)
			assert.Zero(t, e.Attempts, "attempts start again")
			assert.NotEmpty(t, e.LastError, "the last error stays for whoever looks")
		}
		l, err := f.admin.Event(ctx, f.evs[4].MessageID)
		require.NoError(t, err)
		assert.Equal(t, outboxplugin.StateLeased, l.State)

		// A requeued event is published by a worker.
		var (
			mu        sync.Mutex
			published []string
		)
		pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				published = append(published, m.ID)
			}
			return nil
		})
		_, err = newWorker(t, f.db, pub).ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Contains(t, published, f.evs[2].MessageID)
		assert.Contains(t, published, f.evs[3].MessageID)
		assert.NotContains(t, published, f.evs[8].MessageID, "still dead")

		// By filter: only the state it acts on.
		_, err = f.admin.RequeueWhere(ctx, outboxplugin.EventFilter{State: outboxplugin.StateProcessed})
		assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter)
		_, err = f.admin.DiscardWhere(ctx, outboxplugin.EventFilter{State: outboxplugin.StateWaiting})
		assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter)
		n, err = f.admin.RequeueWhere(ctx, outboxplugin.EventFilter{EventType: "NoSuchType"})
		require.NoError(t, err)
		assert.Zero(t, n)

		// Discard deletes dead events only.
		n, err = f.admin.Discard(ctx, f.evs[8].MessageID, f.evs[9].MessageID, f.evs[1].MessageID)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		_, err = f.admin.Event(ctx, f.evs[8].MessageID)
		assert.ErrorIs(t, err, outboxplugin.ErrEventNotFound)
		_, err = f.admin.Event(ctx, f.evs[9].MessageID)
		assert.NoError(t, err)
		_, err = f.admin.Discard(ctx, "")
		assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter)
	})
}

// The *Where methods work in chunks: more events than a chunk are all reached, and only those the
// filter selects.
func TestAdminWhereMethodsCoverEveryChunk(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db))
		const n = 2500
		fillOutbox(t, db, d, outboxplugin.DefaultTableName, n, false)
		rows := db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{})
		require.NoError(t, rows.Where("1 = 1").Updates(map[string]any{"dead_at": time.Now().UTC(), "attempts": 3}).Error)
		// One dead event of another type, which the filters below leave alone.
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return outboxplugin.Emit(tx, "Other", 1) }))
		require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).
			Where("event_type = ?", "Other").Update("dead_at", time.Now().UTC()).Error)
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		ctx := context.Background()

		got, err := admin.RequeueWhere(ctx, outboxplugin.EventFilter{State: outboxplugin.StateDead, EventType: "Bench_create"})
		require.NoError(t, err)
		assert.Equal(t, int64(n), got)
		st, err := admin.Stats(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(n), st.Due)
		assert.Equal(t, int64(1), st.Dead)

		require.NoError(t, rows.Where("event_type = ?", "Bench_create").Update("dead_at", time.Now().UTC()).Error)
		got, err = admin.DiscardWhere(ctx, outboxplugin.EventFilter{EventType: "Bench_create"})
		require.NoError(t, err)
		assert.Equal(t, int64(n), got)
		st, err = admin.Stats(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(0), st.Pending)
		assert.Equal(t, int64(1), st.Dead, "the other type's dead event stays")
	})
}

func TestAdminCleanup(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newAdminFixture(t, d)
		ctx := context.Background()
		n, err := f.admin.Cleanup(ctx, 7*24*time.Hour)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "the processed event of ten days ago")
		_, err = f.admin.Event(ctx, f.evs[0].MessageID)
		assert.ErrorIs(t, err, outboxplugin.ErrEventNotFound)
		n, err = f.admin.Cleanup(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "the other processed one; dead and pending events stay")
		st, err := f.admin.Stats(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(6), st.Pending)
		assert.Equal(t, int64(2), st.Dead)
		_, err = f.admin.Cleanup(ctx, -time.Hour)
		assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter)
	})
}

func TestNewAdminRefusesBadInput(t *testing.T) {
	_, err := outboxplugin.NewAdmin(nil)
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
	db := openDB(t, dialects[0], nil)
	_, err = outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable("events; DROP TABLE x"))
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidTableName)
	_, err = outboxplugin.ParseEventState("stuck")
	assert.True(t, errors.Is(err, outboxplugin.ErrInvalidFilter))
}
