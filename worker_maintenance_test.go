package outboxplugin_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// oldProcessed writes n processed events created two days ago.
func oldProcessed(t *testing.T, db *gorm.DB, n int) {
	t.Helper()
	old := time.Now().UTC().Add(-48 * time.Hour)
	rows := make([]outboxplugin.OutboxEvent, n)
	for i := range rows {
		rows[i] = outboxplugin.OutboxEvent{EventType: "old_processed", CreatedAt: old, Processed: true}
	}
	require.NoError(t, db.CreateInBatches(&rows, 500).Error)
}

func countType(t *testing.T, db *gorm.DB, eventType string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).
		Where("event_type = ?", eventType).Count(&n).Error)
	return n
}

// Run's cleanup runs beside its publishing loop: a cleanup that cannot go on (another transaction
// holds a row it must delete) does not hold up publishing. SQLite has one writer at a time, so a
// blocked cleanup there blocks every write: PostgreSQL and MariaDB only.
func TestCleanupRunsBesideThePublishingLoop(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.name == "sqlite" {
			t.Skip("one writer at a time")
		}
		db := setup(t, d, nil)
		oldProcessed(t, db, 10)
		// Another transaction locks an old processed row: the cleanup's DELETE waits for it.
		tx := db.Session(&gorm.Session{NewDB: true}).Begin()
		require.NoError(t, tx.Error)
		defer tx.Rollback()
		var locked outboxplugin.OutboxEvent
		require.NoError(t, tx.Raw("SELECT * FROM outbox_events WHERE event_type = ? ORDER BY id LIMIT 1 FOR UPDATE", "old_processed").
			Scan(&locked).Error)
		require.NotZero(t, locked.ID)

		rec := newRecorder()
		stop := runWorkers(t, 1, func() *outboxplugin.Worker {
			return newWorker(t, db, rec, outboxplugin.WithCleanup(10*time.Millisecond), outboxplugin.WithRetention(24*time.Hour),
				outboxplugin.WithPollInterval(10*time.Millisecond), outboxplugin.WithoutListen())
		})
		defer stop()
		require.NoError(t, db.Create(&User{Name: "during the cleanup"}).Error)
		require.Eventually(t, func() bool { return rec.distinct() == 1 }, 20*time.Second, 10*time.Millisecond,
			"published while the cleanup waits")
		assert.EqualValues(t, 10, countType(t, db, "old_processed"), "the cleanup was still waiting")

		require.NoError(t, tx.Rollback().Error)
		require.Eventually(t, func() bool { return countType(t, db, "old_processed") == 0 }, 20*time.Second, 10*time.Millisecond,
			"the cleanup goes on once the row is free")
	})
}

// With several relays on one table, one cleans at a time: a turn finds the lock taken and does
// nothing; once it is free, a turn deletes.
func TestCleanupOneRelayAtATime(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		oldProcessed(t, db, 2500)
		ctx := context.Background()
		a := newWorker(t, db, newRecorder())
		b := newWorker(t, db, newRecorder())
		release, got, err := outboxplugin.HoldCleanupLock(ctx, a)
		require.NoError(t, err)
		require.True(t, got)
		if d.name != "sqlite" {
			n, ran, err := outboxplugin.CleanupTurn(ctx, b, 24*time.Hour)
			require.NoError(t, err)
			assert.False(t, ran, "another relay is cleaning")
			assert.Zero(t, n)
			assert.EqualValues(t, 2500, countType(t, db, "old_processed"))
		}
		release()
		n, ran, err := outboxplugin.CleanupTurn(ctx, b, 24*time.Hour)
		require.NoError(t, err)
		assert.True(t, ran)
		assert.EqualValues(t, 2500, n, "in chunks of 1000")
		assert.Zero(t, countType(t, db, "old_processed"))
		// The lock was let go: another turn takes it.
		_, ran, err = outboxplugin.CleanupTurn(ctx, a, 24*time.Hour)
		require.NoError(t, err)
		assert.True(t, ran)
	})
}
