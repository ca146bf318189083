package outboxplugin_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// A transaction of many writes holds at most one INSERT's worth of events: the rest were written
// before its commit, in the order of their statements, and a rollback undoes them all.
func TestBulkTransactionWritesItsEventsEarly(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		log := &statementLog{}
		db := setup(t, d, nil)
		logged := db.Session(&gorm.Session{Logger: log})
		users := make([]User, 2500)
		for i := range users {
			users[i] = User{Name: fmt.Sprint("bulk", i)}
		}
		var beforeCommit int
		require.NoError(t, logged.Transaction(func(tx *gorm.DB) error {
			for start := 0; start < len(users); start += 250 {
				batch := users[start : start+250]
				if err := tx.Create(&batch).Error; err != nil {
					return err
				}
			}
			beforeCommit = log.outboxInserts()
			return nil
		}))
		assert.Equal(t, 2, beforeCommit, "2000 of the 2500 events written before the commit, in INSERTs of 1000")
		assert.Equal(t, 1, log.outboxInserts(), "the last 500 at commit")
		evs := loadEvents(t, db)
		require.Len(t, evs, len(users))
		for i, e := range evs {
			require.Equal(t, fmt.Sprint(users[i].ID), e.AggregateID, "event %d in the order of the writes", i)
		}

		// The same rolled back: the events written early go with it.
		require.Error(t, db.Transaction(func(tx *gorm.DB) error {
			more := make([]User, 2500)
			for i := range more {
				more[i] = User{Name: fmt.Sprint("undone", i)}
			}
			if err := tx.CreateInBatches(&more, 500).Error; err != nil {
				return err
			}
			return errors.New("roll back")
		}))
		assert.Len(t, loadEvents(t, db), len(users))
		assert.EqualValues(t, len(users), count(t, db, &User{}))
	})
}

// An update by condition of thousands of rows, some of which already hold the value it sets: on
// MySQL and MariaDB, which do not write a row left as it was, one event per row changed; on
// PostgreSQL and SQLite, which write every row matched, one per row matched. The rows' keys are read
// a chunk at a time either way.
func TestBulkUpdateByConditionEventsPerRowWritten(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		users := make([]User, 2500)
		for i := range users {
			users[i] = User{Name: fmt.Sprint("u", i), Status: "new"}
			if i%3 == 0 {
				users[i].Status = "done"
			}
		}
		require.NoError(t, db.WithContext(outboxplugin.WithoutCapture(context.Background())).CreateInBatches(&users, 500).Error)
		res := db.Model(&User{}).Where("name LIKE ?", "u%").UpdateColumn("status", "done") // no updated_at: a row already done is left as it was
		require.NoError(t, res.Error)
		var want []string
		for _, u := range users {
			if u.Status != "done" || d.server() != "mysql" {
				want = append(want, fmt.Sprint("User_update ", u.ID))
			}
		}
		assert.EqualValues(t, len(want), res.RowsAffected)
		var got []string
		for _, e := range loadEvents(t, db) {
			got = append(got, e.EventType+" "+e.AggregateID)
		}
		sort.Strings(want)
		sort.Strings(got)
		assert.Equal(t, want, got)

		// A delete by condition of them all.
		res = db.Where("status = ?", "done").Delete(&User{})
		require.NoError(t, res.Error)
		assert.EqualValues(t, len(users), res.RowsAffected)
		deletes := 0
		for _, e := range loadEvents(t, db) {
			if e.EventType == "User_delete" {
				deletes++
			}
		}
		assert.Equal(t, len(users), deletes)
	})
}

// A statement whose rows are written but whose events cannot be made fails, and its transaction
// cannot commit — its rows would commit without their events — unless it rolls back to a savepoint
// set before the statement, which undoes them: then it commits, as it would without the plugin.
func TestFailedCaptureRecoveredBySavepoint(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil, outboxplugin.WithPayloadMode(outboxplugin.PayloadRow))
		resetTables(t, db, &Vault{})

		// Recovered: the outer work commits with its events.
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "a"}).Error; err != nil {
				return err
			}
			err := tx.Transaction(func(inner *gorm.DB) error { return inner.Create(&Vault{Secret: "s"}).Error })
			require.ErrorIs(t, err, outboxplugin.ErrEncodePayload)
			return tx.Create(&User{Name: "b"}).Error
		}))
		assert.Equal(t, []string{"a", "b"}, userNames(t, db))
		assert.Zero(t, count(t, db, &Vault{}), "the row whose event failed is undone")
		assertOneEventPerUser(t, db)

		// Not recovered: a caller that ignores the error cannot commit the row without its event.
		err := db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "c"}).Error; err != nil {
				return err
			}
			require.ErrorIs(t, tx.Create(&Vault{Secret: "s"}).Error, outboxplugin.ErrEncodePayload)
			return nil // ignored
		})
		require.ErrorIs(t, err, outboxplugin.ErrEncodePayload, "the commit fails with the statement's error")
		assert.Equal(t, []string{"a", "b"}, userNames(t, db))
		assert.Zero(t, count(t, db, &Vault{}))

		// A savepoint set after the failure does not undo it.
		err = db.Transaction(func(tx *gorm.DB) error {
			require.ErrorIs(t, tx.Create(&Vault{Secret: "s"}).Error, outboxplugin.ErrEncodePayload)
			require.NoError(t, tx.SavePoint("later").Error)
			require.NoError(t, tx.RollbackTo("later").Error)
			return nil
		})
		require.ErrorIs(t, err, outboxplugin.ErrEncodePayload)
		assert.Zero(t, count(t, db, &Vault{}))
	})
}

// A transaction the application ended with a COMMIT or ROLLBACK statement of its own takes no more
// captured writes or Emits: each would commit on its own, apart from its event. AND CHAIN begins a
// new transaction at once, which takes them as usual.
func TestWritesAfterACommitStatementAreRefused(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		for _, end := range []string{"COMMIT", "ROLLBACK"} {
			t.Run(end, func(t *testing.T) {
				tx := db.Begin()
				require.NoError(t, tx.Create(&User{Name: "before " + end}).Error)
				require.NoError(t, tx.Exec(end).Error)
				err := tx.Create(&User{Name: "after " + end}).Error
				require.ErrorIs(t, err, outboxplugin.ErrTransactionEnded)
				require.ErrorIs(t, outboxplugin.Emit(tx, "After", nil), outboxplugin.ErrTransactionEnded)
				_ = tx.Rollback()
			})
		}
		names := userNames(t, db)
		assert.Equal(t, []string{"before COMMIT"}, names)
		assertOneEventPerUser(t, db)

		if d.name == "sqlite" {
			return // SQLite has no AND CHAIN
		}
		tx := db.Begin()
		require.NoError(t, tx.Create(&User{Name: "chained a"}).Error)
		require.NoError(t, tx.Exec("COMMIT AND CHAIN").Error)
		require.NoError(t, tx.Create(&User{Name: "chained b"}).Error)
		require.NoError(t, tx.Commit().Error)
		names = userNames(t, db)
		assert.True(t, strings.HasPrefix(strings.Join(names, ","), "before COMMIT,chained a,chained b"), "%v", names)
		assertOneEventPerUser(t, db)
	})
}
