package outboxplugin_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// A claim takes the retries that are due before fresh events, however much younger they are, and
// never a dead event or one whose retry is not due yet.
func TestClaimTakesDueRetriesFirstAndNeverDeadOrWaitingRows(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		users := make([]User, 10)
		require.NoError(t, db.Create(&users).Error)
		evs := loadEvents(t, db)
		rows := func() *gorm.DB { return db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}) }
		past, later := time.Now().Add(-time.Minute).UTC(), time.Now().Add(time.Hour).UTC()
		// The two youngest events failed once and are due again; the two oldest are dead (one with
		// a retry time in the past, as markRetry leaves it), the next two wait for a retry in an hour.
		require.NoError(t, rows().Where("id IN ?", []int64{evs[8].ID, evs[9].ID}).
			Updates(map[string]any{"attempts": 1, "next_attempt_at": past, "last_error": "refused"}).Error)
		require.NoError(t, rows().Where("id = ?", evs[0].ID).Updates(map[string]any{"attempts": 3, "dead_at": past}).Error)
		require.NoError(t, rows().Where("id = ?", evs[1].ID).Updates(map[string]any{"attempts": 3, "dead_at": past, "next_attempt_at": past}).Error)
		require.NoError(t, rows().Where("id IN ?", []int64{evs[2].ID, evs[3].ID}).
			Updates(map[string]any{"attempts": 1, "next_attempt_at": later, "last_error": "refused"}).Error)

		var (
			mu      sync.Mutex
			batches [][]string
		)
		pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			defer mu.Unlock()
			var b []string
			for _, m := range msgs {
				b = append(b, m.ID)
			}
			batches = append(batches, b)
			return nil
		})
		w := newWorker(t, db, pub, outboxplugin.WithBatchSize(3))
		total := 0
		for range 5 {
			n, err := w.ProcessOnce(context.Background())
			require.NoError(t, err)
			total += n
		}
		assert.Equal(t, 6, total, "four fresh events and two due retries; no dead one, no waiting one")
		require.Len(t, batches, 2)
		assert.Equal(t, []string{evs[4].MessageID, evs[8].MessageID, evs[9].MessageID}, batches[0],
			"the due retries first, filled up with the oldest fresh event (a batch is in creation order)")
		assert.Equal(t, []string{evs[5].MessageID, evs[6].MessageID, evs[7].MessageID}, batches[1])

		for _, e := range loadEvents(t, db) {
			switch e.ID {
			case evs[0].ID, evs[1].ID:
				assert.NotNil(t, e.DeadAt, "dead stays dead")
				assert.False(t, e.Processed)
				assert.Equal(t, 3, e.Attempts)
			case evs[2].ID, evs[3].ID:
				assert.False(t, e.Processed, "not due yet")
				assert.Equal(t, 1, e.Attempts)
			default:
				assert.True(t, e.Processed, "event %d", e.ID)
			}
		}
	})
}

// A table made by an earlier version has the pending index (created_at, id) and no claim index: the
// worker refuses it at once, naming the command to run, and AutoMigrate adds the claim index and drops
// the pending one (on PostgreSQL it also replaces an INVALID claim index that a failed build left).
func TestAutoMigrateUpgradesATableOfAnEarlierVersion(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		plain := db.Session(&gorm.Session{NewDB: true})
		require.NoError(t, plain.Migrator().DropIndex(&outboxplugin.OutboxEvent{}, "idx_outbox_events_claim"))
		legacy := `CREATE INDEX idx_outbox_events_pending ON outbox_events (created_at, id) WHERE processed = false`
		if d.name == "mysql" {
			legacy = `CREATE INDEX idx_outbox_events_pending ON outbox_events (created_at, id)`
		}
		require.NoError(t, plain.Exec(legacy).Error)
		require.NoError(t, db.Create(&User{Name: "a"}).Error)

		_, err := newWorker(t, db, newRecorder()).ProcessOnce(context.Background())
		require.Error(t, err)
		assert.ErrorContains(t, err, "idx_outbox_events_claim")
		assert.ErrorContains(t, err, "outboxplugin.AutoMigrate(db)")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.Error(t, newWorker(t, db, newRecorder()).Run(ctx), "Run fails at once")
		require.NoError(t, ctx.Err())

		if d.name == "postgres" {
			// A unique build over duplicate values fails and leaves an INVALID index of that name.
			require.NoError(t, db.Create(&User{Name: "b"}).Error)
			err := plain.Exec(`CREATE UNIQUE INDEX CONCURRENTLY idx_outbox_events_claim ON outbox_events (processed)`).Error
			require.Error(t, err)
			_, err = newWorker(t, db, newRecorder()).ProcessOnce(context.Background())
			assert.ErrorContains(t, err, "invalid")
		}

		require.NoError(t, outboxplugin.AutoMigrate(db))
		assert.True(t, plain.Migrator().HasIndex(&outboxplugin.OutboxEvent{}, "idx_outbox_events_claim"))
		assert.False(t, plain.Migrator().HasIndex(&outboxplugin.OutboxEvent{}, "idx_outbox_events_pending"), "the pending index is dropped")
		require.NoError(t, outboxplugin.AutoMigrate(db), "again: nothing to do")

		rec := newRecorder()
		n, err := newWorker(t, db, rec).ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, len(loadEvents(t, db)), n)
		assert.Equal(t, n, rec.distinct())
	})
}

// Rows a worker published but could no longer mark done — another worker took their lease over — are
// reported as BatchResult.LeaseLost, both when the worker marks a batch on its own (ProcessOnce) and
// when Run marks it together with the next claim (on PostgreSQL in the claim's statement).
func TestLeaseLostIsReported(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		for _, mode := range []string{"ProcessOnce", "Run"} {
			t.Run(mode, func(t *testing.T) {
				db := setup(t, d, nil)
				users := make([]User, 10)
				require.NoError(t, db.Create(&users).Error)

				var (
					mu       sync.Mutex
					results  []outboxplugin.BatchResult
					stoleOne bool
				)
				pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
					mu.Lock()
					steal := !stoleOne
					stoleOne = true
					mu.Unlock()
					if steal {
						// Another relay takes the batch over while it is being published.
						ids := make([]string, len(msgs))
						for i, m := range msgs {
							ids[i] = m.ID
						}
						return db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("message_id IN ?", ids).
							Updates(map[string]any{"locked_by": "another-relay", "locked_until": time.Now().Add(time.Hour).UTC()}).Error
					}
					return nil
				})
				obs := &batchObserver{onBatch: func(r outboxplugin.BatchResult) {
					mu.Lock()
					defer mu.Unlock()
					results = append(results, r)
				}}
				w := newWorker(t, db, pub, outboxplugin.WithBatchSize(5), outboxplugin.WithObserver(obs),
					outboxplugin.WithPollInterval(10*time.Millisecond))
				totals := func() (lost, published int) {
					mu.Lock()
					defer mu.Unlock()
					for _, r := range results {
						lost += r.LeaseLost
						published += len(r.Published)
					}
					return lost, published
				}
				if mode == "ProcessOnce" {
					for range 3 {
						_, err := w.ProcessOnce(context.Background())
						require.NoError(t, err)
					}
				} else {
					ctx, cancel := context.WithCancel(context.Background())
					done := make(chan error, 1)
					go func() { done <- w.Run(ctx) }()
					require.Eventually(t, func() bool { lost, published := totals(); return lost == 5 && published == 10 },
						20*time.Second, 10*time.Millisecond)
					cancel()
					require.NoError(t, <-done)
				}
				lost, _ := totals()
				assert.Equal(t, 5, lost, "the stolen batch")
				var mine, theirs int64
				require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", true).Count(&mine).Error)
				require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("locked_by = ?", "another-relay").Count(&theirs).Error)
				assert.Equal(t, int64(5), mine, "the worker marked only the rows it still held")
				assert.Equal(t, int64(5), theirs, "and left the others to the relay that took them")
			})
		}
	})
}

// A claim that MariaDB or PostgreSQL rolls back as a deadlock's victim is run again at once; other
// errors are not. The deadlock here is a real one, between two transactions that lock two rows in
// opposite orders, so that the check holds for the error the driver really returns.
func TestClaimRetriesADeadlockVictim(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		w := newWorker(t, db, newRecorder())
		assert.False(t, outboxplugin.ClaimRetryable(w, errors.New("Error 1064 (42000): You have an error in your SQL syntax")))
		if d.name == "sqlite" {
			assert.False(t, outboxplugin.ClaimRetryable(w, errors.New("Error 1213 (40001): Deadlock found")), "SQLite's claims do not deadlock")
			return
		}
		if d.name == "postgres" {
			assert.False(t, outboxplugin.ClaimRetryable(w, errors.New("ERROR: deadlock detected (SQLSTATE 40P01)")), "a text is not the server's error")
			var syntax error = db.Exec(`SELEC 1`).Error
			require.Error(t, syntax)
			assert.False(t, outboxplugin.ClaimRetryable(w, syntax), "%v", syntax)
		}
		require.NoError(t, db.Create(&[]User{{Name: "a"}, {Name: "b"}}).Error)
		evs := loadEvents(t, db)
		plain := db.Session(&gorm.Session{NewDB: true})
		lock := func(tx *gorm.DB, id int64) error {
			var got []int64
			return tx.Raw(`SELECT id FROM outbox_events WHERE id = ? FOR UPDATE`, id).Scan(&got).Error
		}
		tx1, tx2 := plain.Begin(), plain.Begin()
		defer tx1.Rollback()
		defer tx2.Rollback()
		require.NoError(t, lock(tx1, evs[0].ID))
		require.NoError(t, lock(tx2, evs[1].ID))
		errs := make(chan error, 2)
		// Whichever request comes first waits for the other transaction's row; the second closes the
		// cycle.
		go func() { errs <- lock(tx1, evs[1].ID) }()
		go func() { errs <- lock(tx2, evs[0].ID) }()
		var victim error
		for range 2 {
			if err := <-errs; err != nil {
				victim = err // its rollback let the other through
			}
		}
		require.Error(t, victim, "one of the two is the deadlock's victim")
		assert.True(t, outboxplugin.ClaimRetryable(w, fmt.Errorf("outboxplugin: claim: %w", victim)), "%v", victim)
	})
}

// Without WithBatchSize a batch is DefaultMySQLBatchSize events on MySQL/MariaDB and DefaultBatchSize
// on PostgreSQL and SQLite; an explicit size wins on every database.
func TestDefaultBatchSizeIsTheDatabases(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		const pending = outboxplugin.DefaultMySQLBatchSize + 200
		fillOutbox(t, db, d, outboxplugin.DefaultTableName, pending, false)
		var (
			mu    sync.Mutex
			sizes []int
		)
		pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(msgs))
			return nil
		})
		want := outboxplugin.DefaultBatchSize
		if d.name == "mysql" {
			want = outboxplugin.DefaultMySQLBatchSize
		}
		n, err := newWorker(t, db, pub).ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, want, n, "a default batch on %s", d.name)

		n, err = newWorker(t, db, pub, outboxplugin.WithBatchSize(150)).ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 150, n, "WithBatchSize(150)")
		assert.Equal(t, []int{want, 150}, sizes, "one publish per batch")
	})
}
