package outboxplugin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// On PostgreSQL the wake-up is sent after commit, from the plugin's own connection, for every way a
// transaction commits: exactly one committed transaction at a time gives one notification, a rolled
// back one none. A session made before the plugin was registered is still announced once, after
// commit or, where the plugin cannot see its commit, inside its transaction.
func TestWakeUpAfterCommitForEveryKindOfTransaction(t *testing.T) {
	d := dialects[1]
	// A session from before db.Use keeps the pool it was made with.
	early := openDB(t, d, nil)
	resetTables(t, early, captureModels...)
	before := early.Session(&gorm.Session{})
	require.NoError(t, early.Use(outboxplugin.New()))
	db := early

	// LISTEN on the server itself: behind a transaction pooler the NOTIFYs pass, a LISTEN would not.
	conn, err := pgx.Connect(context.Background(), replaceDSNField(postgresDirectDSN(), "dbname", testDatabase))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), `LISTEN "outbox_events"`)
	require.NoError(t, err)
	wait := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := conn.WaitForNotification(ctx)
		return err
	}

	forms := []struct {
		name        string
		write       func() error
		afterCommit bool // announced by the plugin's own NOTIFY after commit (false: either way)
	}{
		{"GORM's transaction per statement", func() error { return db.Create(&User{Name: "a"}).Error }, true},
		{"db.Transaction", func() error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&User{Name: "b"}).Error; err != nil {
					return err
				}
				return outboxplugin.Emit(tx, "Also", nil)
			})
		}, true},
		{"Begin and Commit by hand", func() error {
			tx := db.Begin()
			if err := tx.Create(&User{Name: "c"}).Error; err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit().Error
		}, true},
		{"nested transactions", func() error {
			return db.Transaction(func(tx *gorm.DB) error {
				return tx.Transaction(func(inner *gorm.DB) error { return inner.Create(&User{Name: "d"}).Error })
			})
		}, true},
		{"SkipDefaultTransaction", func() error {
			return db.Session(&gorm.Session{SkipDefaultTransaction: true}).Create(&User{Name: "e"}).Error
		}, true},
		{"PrepareStmt", func() error { return db.Session(&gorm.Session{PrepareStmt: true}).Create(&User{Name: "f"}).Error }, true},
		{"a session from before db.Use", func() error { return before.Create(&User{Name: "g"}).Error }, false},
	}
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			if f.name == "PrepareStmt" {
				skipPrepareStmtBehindPooler(t)
			}
			sent := outboxplugin.NotifiesSent(db)
			require.NoError(t, f.write())
			require.NoError(t, wait(5*time.Second), "announced")
			if f.afterCommit {
				require.Eventually(t, func() bool { return outboxplugin.NotifiesSent(db) == sent+1 }, 5*time.Second, time.Millisecond,
					"by the plugin's NOTIFY after commit")
			}
			assert.ErrorIs(t, wait(100*time.Millisecond), context.DeadlineExceeded, "once")
		})
	}
	t.Run("rollback", func(t *testing.T) {
		sent := outboxplugin.NotifiesSent(db)
		_ = db.Transaction(func(tx *gorm.DB) error {
			require.NoError(t, tx.Create(&User{Name: "rolled back"}).Error)
			return errors.New("roll back")
		})
		tx := db.Begin()
		require.NoError(t, tx.Create(&User{Name: "rolled back by hand"}).Error)
		require.NoError(t, tx.Rollback().Error)
		assert.ErrorIs(t, wait(300*time.Millisecond), context.DeadlineExceeded, "nothing to announce")
		assert.Equal(t, sent, outboxplugin.NotifiesSent(db))
	})
	t.Run("db.DB and the pool's settings still work", func(t *testing.T) {
		sqlDB, err := db.DB()
		require.NoError(t, err)
		require.NoError(t, sqlDB.Ping())
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			inner, err := tx.DB()
			if err == nil && inner != sqlDB {
				err = errors.New("another *sql.DB inside the transaction")
			}
			return err
		}))
	})
}

// A worker on the same *gorm.DB is woken by the commits of its process directly, on every database
// and with the notification off: with a poll of a minute and no LISTEN, a committed event is still
// published at once.
func TestWorkerWokenByCommitsOfItsProcess(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil, outboxplugin.WithoutNotify())
		received, pub := timingPublisher()
		stop := runWorkers(t, 1, func() *outboxplugin.Worker {
			return newWorker(t, db, pub, outboxplugin.WithPollInterval(time.Minute), outboxplugin.WithoutListen())
		})
		defer stop()
		time.Sleep(300 * time.Millisecond) // the worker's first poll has found nothing; it now waits a minute
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return tx.Create(&User{Name: "wake"}).Error }))
		select {
		case <-received:
		case <-time.After(20 * time.Second):
			t.Fatal("not woken by the commit: the event waited for the poll")
		}
	})
}
