package outboxplugin_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// A published event has no next attempt time, whether it was delayed or retried: the mark clears it.
// On MySQL and MariaDB that is what keeps it in the run of the claim index that cleanup and the Admin
// read (there is no reference index there), so it is listed among the processed events, counted and
// cleaned up like any other.
func TestPublishedDelayedAndRetriedEventsAreProcessedRows(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db))
		ctx := context.Background()
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Reminder", map[string]int{"n": 1}, outboxplugin.DeliverAt(time.Now().Add(-time.Second)))
		}))
		require.NoError(t, db.Create(&User{Name: "retried"}).Error)
		evs := loadEvents(t, db)
		require.Len(t, evs, 2)
		// The second one failed once and its retry is due.
		require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("id = ?", evs[1].ID).
			Updates(map[string]any{"next_attempt_at": time.Now().Add(-time.Second).UTC(), "attempts": 1, "last_error": "refused"}).Error)

		rec := newRecorder()
		n, err := newWorker(t, db, rec).ProcessOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)

		for _, e := range loadEvents(t, db) {
			assert.True(t, e.Processed, "event %d", e.ID)
			assert.Nil(t, e.NextAttemptAt, "event %d: a processed event has no next attempt", e.ID)
		}
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		page, err := admin.ListEvents(ctx, outboxplugin.EventFilter{State: outboxplugin.StateProcessed})
		require.NoError(t, err)
		assert.ElementsMatch(t, []int64{evs[0].ID, evs[1].ID}, pageIDs(page))
		st, err := admin.Stats(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(2), st.Processed)
		removed, err := admin.Cleanup(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, int64(2), removed)
	})
}

// Rows an earlier version marked processed kept their retry time. Cleanup deletes them on every
// database once they are old enough, also when no migration cleared the time (a relay of that version
// still running beside the new ones): on MySQL and MariaDB through a second range of the claim index,
// which takes them once that time too lies before the cutoff.
func TestCleanupDeletesRowsAnEarlierVersionMarked(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db))
		ctx := context.Background()
		for range 3 {
			require.NoError(t, db.Create(&User{Name: "u"}).Error)
		}
		evs := loadEvents(t, db)
		require.Len(t, evs, 3)
		old := time.Now().Add(-10 * 24 * time.Hour).UTC()
		rows := func(i int) *gorm.DB {
			return db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", evs[i].ID)
		}
		// Marked by an earlier version after a retry ten days ago, and after a plain delivery.
		require.NoError(t, rows(0).Updates(map[string]any{"processed": true, "processed_at": old.Add(time.Minute),
			"created_at": old, "next_attempt_at": old.Add(30 * time.Second), "attempts": 2, "last_error": "refused"}).Error)
		require.NoError(t, rows(1).Updates(map[string]any{"processed": true, "processed_at": old, "created_at": old, "attempts": 1}).Error)

		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		removed, err := admin.Cleanup(ctx, 7*24*time.Hour)
		require.NoError(t, err)
		assert.Equal(t, int64(2), removed, "both old processed rows")
		left := loadEvents(t, db)
		require.Len(t, left, 1)
		assert.Equal(t, evs[2].ID, left[0].ID, "the pending event stays")
	})
}

// MariaDB and MySQL: a cleanup that finds nothing old enough reads a couple of rows, not the run of
// processed rows the table keeps (its DELETE bounds the claim index's run by the cutoff). The server's
// own counters of the rows its handlers read, on the one connection the Admin uses.
func TestCleanupOnMySQLReadsOnlyWhatItDeletes(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() != "mysql" {
			t.Skip("the counters are MySQL's and MariaDB's")
		}
		const kept = 20000
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db))
		fillOutbox(t, db, d, outboxplugin.DefaultTableName, kept, true) // processed, created now
		require.NoError(t, db.Exec(`ANALYZE TABLE outbox_events`).Error)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		oneConnection(t, sqlDB)
		rowsRead := func() int64 { return handlerReads(t, db) }
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		before := rowsRead()
		removed, err := admin.Cleanup(context.Background(), 24*time.Hour)
		require.NoError(t, err)
		assert.Zero(t, removed)
		assert.LessOrEqual(t, rowsRead()-before, int64(10), "rows read by a cleanup with nothing to delete, of %d kept", kept)

		removed, err = admin.Cleanup(context.Background(), 0)
		require.NoError(t, err)
		assert.Equal(t, int64(kept), removed)
	})
}

// A page of the backlog, newest first, is the fresh events read in creation order from the claim
// index merged with the timed ones (retries, delayed events), sorted: read as one group, the whole
// backlog was sorted for every page. On MariaDB and MySQL the server's counters show that a page reads
// about a page of rows, not the backlog; on every database the page is the newest events, in order.
func TestAdminListsABacklogWithoutSortingIt(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		const backlog = 20000
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db))
		fillOutbox(t, db, d, outboxplugin.DefaultTableName, backlog, false) // pending, fresh
		// A few retries waiting, among them the newest event.
		require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("id % 1000 = 0").
			Updates(map[string]any{"next_attempt_at": time.Now().Add(time.Hour).UTC(), "attempts": 1, "last_error": "refused"}).Error)
		counted := d.server() == "mysql"
		if counted {
			require.NoError(t, db.Exec(`ANALYZE TABLE outbox_events`).Error)
			sqlDB, err := db.DB()
			require.NoError(t, err)
			oneConnection(t, sqlDB)
		}
		reads := func() int64 {
			if !counted {
				return 0
			}
			return handlerReads(t, db)
		}
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		ctx := context.Background()
		for _, state := range []outboxplugin.EventState{"", outboxplugin.StatePending, outboxplugin.StateDue} {
			before := reads()
			page, err := admin.ListEvents(ctx, outboxplugin.EventFilter{State: state})
			require.NoError(t, err)
			read := reads() - before
			require.Len(t, page.Events, 50, "state %q", state)
			for i := 1; i < len(page.Events); i++ {
				assert.True(t, page.Events[i-1].ID > page.Events[i].ID, "state %q: newest first", state)
			}
			if state != outboxplugin.StateDue {
				assert.Equal(t, int64(backlog), page.Events[0].ID, "state %q: the newest event, a waiting retry", state)
			}
			assert.LessOrEqual(t, read, int64(500), "state %q: rows read for a page of 50 in a backlog of %d", state, backlog)
		}
	})
}

// handlerReads is the sum of the server's Handler_read* counters of db's connection (see oneConnection).
func handlerReads(t *testing.T, db *gorm.DB) int64 {
	t.Helper()
	rows, err := db.Raw(`SHOW SESSION STATUS LIKE 'Handler_read%'`).Rows()
	require.NoError(t, err)
	defer rows.Close()
	var total int64
	for rows.Next() {
		var name string
		var n int64
		require.NoError(t, rows.Scan(&name, &n))
		total += n
	}
	require.NoError(t, rows.Err())
	return total
}

// oneConnection limits the tests' shared pool to one connection for this test, so that session
// counters are the Admin's, then sets it back (openDB leaves the idle connections at database/sql's
// default, 2).
func oneConnection(t *testing.T, sqlDB *sql.DB) {
	previous := sqlDB.Stats().MaxOpenConnections
	sqlDB.SetMaxOpenConns(1)
	t.Cleanup(func() {
		sqlDB.SetMaxOpenConns(previous)
		sqlDB.SetMaxIdleConns(2)
	})
}
