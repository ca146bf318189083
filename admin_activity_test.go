package outboxplugin_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// DeadGroups groups the dead events by type and error text, largest first; EventFilter.LastError
// selects one group, so that a console can requeue or discard it whole and nothing beside it.
func TestAdminDeadGroups(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newAdminFixture(t, d)
		ctx := context.Background()
		// Two more dead Billed events: one with the fixture's error (that group is now 2), one with
		// another error (a group of its own).
		for _, text := range []string{"broker said no", "timeout"} {
			require.NoError(t, f.db.Transaction(func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Billed", map[string]int{"invoice": 43}, outboxplugin.WithAggregate("Invoice", "43"))
			}))
			evs := loadEvents(t, f.db)
			last := evs[len(evs)-1]
			require.NoError(t, f.db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", last.ID).
				Updates(map[string]any{"dead_at": time.Now().UTC(), "attempts": 3, "last_error": text}).Error)
		}
		userType := f.evs[2].EventType
		groups, more, err := f.admin.DeadGroups(ctx, 0)
		require.NoError(t, err)
		assert.False(t, more)
		require.Len(t, groups, 3)
		assert.Equal(t, outboxplugin.DeadGroup{EventType: "Billed", LastError: "broker said no", Count: 2},
			outboxplugin.DeadGroup{EventType: groups[0].EventType, LastError: groups[0].LastError, Count: groups[0].Count}, "the largest first")
		assert.False(t, groups[0].FirstDead.After(groups[0].LastDead))
		rest := map[string]int64{}
		for _, g := range groups[1:] {
			rest[g.EventType+"/"+g.LastError] = g.Count
		}
		assert.Equal(t, map[string]int64{"Billed/timeout": 1, userType + "/broker said no": 1}, rest)

		top, more, err := f.admin.DeadGroups(ctx, 1)
		require.NoError(t, err)
		assert.True(t, more, "a limit below the groups says there are more")
		assert.Len(t, top, 1)
		for _, bad := range []int{-1, outboxplugin.MaxDeadGroups + 1} {
			_, _, err = f.admin.DeadGroups(ctx, bad)
			assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter)
		}

		// One group, by its type and error: the other Billed error and the other type stay dead.
		group := outboxplugin.EventFilter{State: outboxplugin.StateDead, EventType: "Billed", LastError: "broker said no"}
		page, err := f.admin.ListEvents(ctx, group)
		require.NoError(t, err)
		assert.Len(t, page.Events, 2)
		n, err := f.admin.RequeueWhere(ctx, group)
		require.NoError(t, err)
		assert.Equal(t, int64(2), n)
		groups, _, err = f.admin.DeadGroups(ctx, 0)
		require.NoError(t, err)
		assert.Len(t, groups, 2, "the requeued group is gone, the others stay")
		n, err = f.admin.DiscardWhere(ctx, outboxplugin.EventFilter{EventType: "Billed", LastError: "timeout"})
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
		st, err := f.admin.Stats(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(1), st.Dead, "only the other type's dead event is left")
	})
}

// Activity counts the processed events per interval of their write time and takes the lag of the
// latest ones from their processed_at.
func TestAdminActivity(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newAdminFixture(t, d)
		ctx := context.Background()
		// Four more processed events: three written 10 s ago, one 70 s ago, each published 2 s after
		// its write.
		now := time.Now().UTC()
		for i := range 4 {
			require.NoError(t, f.db.Create(&User{Name: fmt.Sprint("activity", i)}).Error)
			evs := loadEvents(t, f.db)
			created := now.Add(-10 * time.Second)
			if i == 3 {
				created = now.Add(-70 * time.Second)
			}
			require.NoError(t, f.db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", evs[len(evs)-1].ID).
				Updates(map[string]any{"processed": true, "created_at": created, "processed_at": created.Add(2 * time.Second)}).Error)
		}
		act, err := f.admin.Activity(ctx, 5, time.Minute)
		require.NoError(t, err)
		require.Len(t, act.Published, 5)
		require.Len(t, act.AtLeast, 5)
		assert.Equal(t, time.Minute, act.Interval)
		// Where each write time falls, computed from the Activity's own start: the fixture's evs[1]
		// (written now, published a minute ago) is counted too.
		want := make([]int64, 5)
		for _, c := range []time.Time{now.Add(-10 * time.Second), now.Add(-10 * time.Second), now.Add(-10 * time.Second), now.Add(-70 * time.Second), f.evs[1].CreatedAt} {
			if i := int(c.Sub(act.Start) / time.Minute); i >= 0 && i < 5 {
				want[i]++
			}
		}
		assert.Equal(t, want, act.Published)
		assert.Equal(t, []bool{false, false, false, false, false}, act.AtLeast)
		// Six processed events: the four above, the fixture's evs[1] (lag clamped to 0: processed_at
		// before created_at) and evs[0] (written ten days ago).
		assert.Equal(t, 6, act.LagSample)
		assert.Equal(t, 2*time.Second, act.LagP50.Round(time.Second))
		assert.Greater(t, act.LagMax, 9*24*time.Hour)

		for _, bad := range [][2]int64{{0, int64(time.Minute)}, {121, int64(time.Minute)}, {5, int64(time.Millisecond)}} {
			_, err := f.admin.Activity(ctx, int(bad[0]), time.Duration(bad[1]))
			assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter, "%v", bad)
		}
	})
}

// An interval holding more processed events than ActivityIntervalLimit is counted up to it and marked.
func TestAdminActivityCapsAnInterval(t *testing.T) {
	d := dialects[0] // SQLite: the rows are inserted by one statement
	require.Equal(t, "sqlite", d.name)
	db := setup(t, d, nil)
	require.NoError(t, outboxplugin.AutoMigrate(db))
	written := time.Now().UTC().Add(-time.Second)
	require.NoError(t, db.Exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		INSERT INTO outbox_events (message_id, event_type, aggregate_type, aggregate_id, payload, created_at, processed, processed_at, attempts)
		SELECT 'cap-' || i, 'Cap', '', '', '{}', ?, true, ?, 1 FROM n`, outboxplugin.ActivityIntervalLimit+5, written, written).Error)
	admin, err := outboxplugin.NewAdmin(db)
	require.NoError(t, err)
	act, err := admin.Activity(context.Background(), 2, time.Hour)
	require.NoError(t, err)
	i := int(written.Sub(act.Start) / time.Hour)
	assert.Equal(t, int64(outboxplugin.ActivityIntervalLimit), act.Published[i])
	assert.True(t, act.AtLeast[i])
	assert.Equal(t, outboxplugin.ActivityLagSample, act.LagSample)
}

// A search among processed events for a filter their index does not hold reads at most
// MaxProcessedScan rows per page: a page that did not fill says so (Partial, SearchedTo), and its
// Next continues the search, so that paging on finds every match once, beside the other groups' rows.
func TestAdminListEventsBoundsTheProcessedScan(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db))
		// One rare event, processed two hours ago; a dead one of the same type three hours ago; then
		// MaxProcessedScan+10 processed events of another type, an hour ago: newer than both.
		ctx := context.Background()
		for _, ev := range []struct {
			created time.Time
			dead    bool
		}{{time.Now().UTC().Add(-2 * time.Hour), false}, {time.Now().UTC().Add(-3 * time.Hour), true}} {
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return outboxplugin.Emit(tx, "Rare", map[string]int{"n": 1}) }))
			evs := loadEvents(t, db)
			upd := map[string]any{"created_at": ev.created, "processed": true, "processed_at": ev.created}
			if ev.dead {
				upd = map[string]any{"created_at": ev.created, "dead_at": ev.created, "last_error": "no"}
			}
			require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", evs[len(evs)-1].ID).Updates(upd).Error)
		}
		n := outboxplugin.MaxProcessedScan + 10
		hourAgo := time.Now().UTC().Add(-time.Hour)
		gen := `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)`
		cols := `INSERT INTO outbox_events (message_id, event_type, aggregate_type, aggregate_id, payload, created_at, processed, processed_at, attempts) `
		sel := `SELECT CONCAT('bulk-', i), 'Bulk', '', '', '{}', ?, true, ?, 1 FROM n`
		switch d.name {
		case "mysql": // MariaDB bounds recursion at 1000 rows: five cross-joined digits instead
			digits := `WITH d(x) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
				UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9),
				n(i) AS (SELECT 1 + a.x + 10*b.x + 100*c.x + 1000*e.x + 10000*f.x FROM d a, d b, d c, d e, d f)`
			require.NoError(t, db.Exec(cols+digits+` `+sel+` WHERE i <= ?`, hourAgo, hourAgo, n).Error)
		default:
			require.NoError(t, db.Exec(gen+` `+cols+strings.Replace(sel, "CONCAT('bulk-', i)", "'bulk-' || i", 1), n, hourAgo, hourAgo).Error)
		}
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)

		page, err := admin.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StateProcessed, EventType: "Rare"})
		require.NoError(t, err)
		assert.Empty(t, page.Events, "the rare event lies past the first MaxProcessedScan rows")
		assert.True(t, page.Partial)
		assert.WithinDuration(t, hourAgo, page.SearchedTo, time.Second)
		require.NotEmpty(t, page.Next)
		page, err = admin.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StateProcessed, EventType: "Rare", Cursor: page.Next})
		require.NoError(t, err)
		require.Len(t, page.Events, 1, "the next page continues the search and finds it")
		assert.Equal(t, "Rare", page.Events[0].EventType)
		assert.False(t, page.Partial)

		// Every state: the dead event (older than the cut) waits for the page past the cut, and
		// appears once.
		seen := map[string]int{}
		f := outboxplugin.EventFilter{EventType: "Rare"}
		for range 5 {
			page, err = admin.ListEvents(ctx, f)
			require.NoError(t, err)
			for _, e := range page.Events {
				seen[string(e.State)]++
			}
			if page.Next == "" {
				break
			}
			f.Cursor = page.Next
		}
		assert.Equal(t, map[string]int{"processed": 1, "dead": 1}, seen)
	})
}
