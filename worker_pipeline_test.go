package outboxplugin_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// leasedCount counts the outbox rows leased right now.
func leasedCount(t testing.TB, db *gorm.DB) int64 {
	var n int64
	require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("locked_by IS NOT NULL AND processed = ?", false).Count(&n).Error)
	return n
}

// runUntilDrained runs w until no event is left unprocessed, then stops it.
func runUntilDrained(t *testing.T, db *gorm.DB, w *outboxplugin.Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	require.Eventually(t, func() bool {
		var pending int64
		db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", false).Count(&pending)
		return pending == 0
	}, 20*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// A worker claims its next batch while the publisher works on a full one, then publishes that batch:
// every event once, in creation order.
func TestWorkerClaimsNextBatchWhilePublishing(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		users := make([]User, 25)
		require.NoError(t, db.Create(&users).Error)

		var (
			mu         sync.Mutex
			got        []string
			sawAhead   bool
			firstBatch = true
		)
		pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			first := firstBatch
			firstBatch = false
			mu.Unlock()
			if first {
				// Hold the first batch until the second is leased beside it.
				deadline := time.Now().Add(10 * time.Second)
				for time.Now().Before(deadline) && leasedCount(t, db) < 20 {
					time.Sleep(5 * time.Millisecond)
				}
				mu.Lock()
				sawAhead = leasedCount(t, db) == 20
				mu.Unlock()
			}
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				got = append(got, m.ID)
			}
			return nil
		})
		w := newWorker(t, db, pub, outboxplugin.WithBatchSize(10), outboxplugin.WithPollInterval(10*time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == 25
		}, 20*time.Second, 10*time.Millisecond)
		cancel()
		require.NoError(t, <-done)

		mu.Lock()
		defer mu.Unlock()
		assert.True(t, sawAhead, "the next batch was not claimed while the first was being published")
		var want []string
		for _, e := range loadEvents(t, db) {
			want = append(want, e.MessageID)
			assert.True(t, e.Processed)
			assert.Nil(t, e.LockedBy)
		}
		assert.Equal(t, want, got, "creation order, each once")
	})
}

// When Run stops while a batch is being published and the next one has been claimed ahead, both are
// handed back: not processed, not leased, no attempt counted.
func TestWorkerShutdownHandsBackBatchClaimedAhead(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		users := make([]User, 20)
		require.NoError(t, db.Create(&users).Error)

		bothLeased := make(chan struct{})
		pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			for leasedCount(t, db) < 20 && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
			select {
			case <-bothLeased:
			default:
				close(bothLeased)
			}
			<-ctx.Done()
			return ctx.Err()
		})
		w := newWorker(t, db, pub, outboxplugin.WithBatchSize(10), outboxplugin.WithPollInterval(10*time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		select {
		case <-bothLeased:
		case <-time.After(10 * time.Second):
			t.Fatal("the second batch was never claimed ahead")
		}
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
		for _, e := range loadEvents(t, db) {
			assert.False(t, e.Processed)
			assert.Nil(t, e.LockedBy, "handed back")
			assert.Zero(t, e.Attempts, "no delivery counted")
		}
		require.Eventually(t, func() bool { return workerGoroutines() == 0 }, 5*time.Second, 10*time.Millisecond,
			"goroutines of the worker left behind")
	})
}

// A publish that outlasts the lease keeps its rows: the worker renews the lease while it holds them,
// the batch claimed ahead included, so another worker claims none of them meanwhile and nothing is
// published twice.
func TestWorkerRenewsTheLeaseWhilePublishing(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(make([]User, 20)).Error)

		var mu sync.Mutex
		seen := map[string]int{}
		slow := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			for _, m := range msgs {
				seen[m.ID]++
			}
			mu.Unlock()
			select { // three leases and a half
			case <-time.After(3500 * time.Millisecond):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		lease := outboxplugin.MinLease
		w := newWorker(t, db, slow, outboxplugin.WithBatchSize(10), outboxplugin.WithLease(lease), outboxplugin.WithoutListen())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		require.Eventually(t, func() bool { return leasedCount(t, db) == 20 }, 10*time.Second, 10*time.Millisecond,
			"a batch publishing and one claimed ahead")

		other := newWorker(t, db, newRecorder(), outboxplugin.WithoutListen())
		for i := 0; i < 3; i++ { // the first lease is long over after the first second
			time.Sleep(lease)
			n, err := other.ProcessOnce(context.Background())
			require.NoError(t, err)
			assert.Zero(t, n, "another worker takes none of the rows held")
		}
		require.Eventually(t, func() bool {
			var n int64
			require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", true).Count(&n).Error)
			return n == 20
		}, 30*time.Second, 20*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
		mu.Lock()
		defer mu.Unlock()
		assert.Len(t, seen, 20)
		for id, n := range seen {
			assert.Equal(t, 1, n, "event %s published once", id)
		}
	})
}

// Run claims ahead only while publishing takes long enough for the overlap to pay: behind a publisher
// that returns at once it claims one batch at a time (a batch claimed ahead would only be more leased
// rows for other workers' claims to step over), and it claims ahead again once publishing slows down.
func TestWorkerClaimsAheadOnlyWhilePublishingTakesTime(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(make([]User, 70)).Error)

		var (
			mu               sync.Mutex
			calls            int
			got              []string
			aheadWhileFast   = true
			aheadWhileSlowed bool
		)
		pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			calls++
			call := calls
			mu.Unlock()
			// Calls 1 to 3 return at once. Call 4 waits 300 ms for a batch claimed beside its own,
			// which must not come: the calls before it were fast. Having been slow, call 5 waits for
			// the claim ahead that must come.
			wait := map[int]time.Duration{4: 300 * time.Millisecond, 5: 10 * time.Second}[call]
			deadline := time.Now().Add(wait)
			for time.Now().Before(deadline) && leasedCount(t, db) < 20 {
				time.Sleep(5 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			switch call {
			case 4:
				aheadWhileFast = leasedCount(t, db) > int64(len(msgs))
			case 5:
				aheadWhileSlowed = leasedCount(t, db) == 20
			}
			for _, m := range msgs {
				got = append(got, m.ID)
			}
			return nil
		})
		w := newWorker(t, db, pub, outboxplugin.WithBatchSize(10), outboxplugin.WithPollInterval(10*time.Millisecond))
		runUntilDrained(t, db, w)

		mu.Lock()
		defer mu.Unlock()
		assert.False(t, aheadWhileFast, "claimed ahead behind a publisher that returns at once")
		assert.True(t, aheadWhileSlowed, "did not claim ahead once publishing took time")
		var want []string
		for _, e := range loadEvents(t, db) {
			want = append(want, e.MessageID)
			assert.Nil(t, e.LockedBy)
		}
		assert.Equal(t, want, got, "creation order, each once")
	})
}

// On PostgreSQL the relay's claims and marks commit asynchronously, and that stays within their own
// transactions: the application's transactions on the same connection still commit synchronously.
func TestPostgresAsyncCommitStaysInTheRelaysTransactions(t *testing.T) {
	d := dialects[1]
	require.Equal(t, "postgres", d.name)
	if _, err := d.pool(); err != nil {
		if requireDBs() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	// One connection, shared by the application and the worker.
	one, err := sql.Open("pgx", replaceDSNField(postgresServerDSN(), "dbname", testDatabase))
	require.NoError(t, err)
	defer one.Close()
	one.SetMaxOpenConns(1)
	db, err := d.open(one, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	resetTables(t, db, captureModels...)
	require.NoError(t, db.Use(outboxplugin.New()))

	require.NoError(t, db.Create(make([]User, 150)).Error)
	w := newWorker(t, db, outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error { return nil }),
		outboxplugin.WithoutListen())
	runUntilDrained(t, db, w) // a full batch, a carried mark with the next claim, a short one

	var setting string
	require.NoError(t, db.Raw("SHOW synchronous_commit").Scan(&setting).Error)
	assert.Equal(t, "on", setting, "the session's setting after the worker's statements")
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		return tx.Raw("SHOW synchronous_commit").Scan(&setting).Error
	}))
	assert.Equal(t, "on", setting, "an application transaction's setting")
}

// While the broker is down, Run backs off: neither new events nor wake-ups (a notification per commit
// on PostgreSQL) make it try more often than its growing pause — and the outage spends no attempt.
func TestWorkerBacksOffWhileTheBrokerIsDown(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		var calls, rounds atomic.Int64
		down := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error {
			calls.Add(1)
			return errors.New("broker down")
		})
		obs := &batchObserver{onBatch: func(r outboxplugin.BatchResult) {
			if len(r.NotDelivered) > 0 {
				rounds.Add(1)
			}
		}}
		w := newWorker(t, db, down, outboxplugin.WithPollInterval(20*time.Millisecond), outboxplugin.WithoutListen(),
			outboxplugin.WithObserver(obs))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()

		// An application committing every 5 ms, each commit waking the worker, for 1.2 s.
		deadline := time.Now().Add(1200 * time.Millisecond)
		for time.Now().Before(deadline) {
			require.NoError(t, db.Create(&User{Name: "x"}).Error)
			w.Wake()
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		require.NoError(t, <-done)
		// Pauses of 40, 80, 160, 320, 640 ms: about 6 tries in 1.2 s; without the back-off, one per
		// commit (more than 100).
		assert.LessOrEqual(t, rounds.Load(), int64(10), "batches tried while the broker was down")
		assert.GreaterOrEqual(t, rounds.Load(), int64(2))
		// Each try is the batch, then halves and quarters of it looking for a message at fault: at
		// most splitBudget (7) calls, all failing fast.
		assert.LessOrEqual(t, calls.Load(), 7*rounds.Load(), "calls per batch tried")
		for _, e := range loadEvents(t, db) {
			assert.Zero(t, e.Attempts, "an outage spends no attempt")
			assert.Nil(t, e.LockedBy)
			assert.Nil(t, e.DeadAt)
		}
	})
}

// A row written by hand with raw SQL whose headers the relay cannot read is marked dead, with the
// reason; it does not fail the claim, and the events around it are published.
func TestWorkerBuriesUnreadableRow(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&User{Name: "before"}).Error)
		require.NoError(t, db.Exec(`INSERT INTO outbox_events (message_id, event_type, aggregate_type, aggregate_id, payload, headers, created_at, processed, attempts)
			VALUES ('bad-headers', 'Hand_written', '', '', '{}', '{"retries": 3}', ?, false, 0)`, time.Now().UTC()).Error)
		require.NoError(t, db.Create(&User{Name: "after"}).Error)

		var dead []string
		obs := &deadObserver{onDead: func(m outboxplugin.Message, err error) { dead = append(dead, m.ID) }}
		rec := newRecorder()
		w := newWorker(t, db, rec, outboxplugin.WithObserver(obs))
		n, err := w.ProcessOnce(context.Background())
		require.NoError(t, err, "one unreadable row must not fail the claim")
		assert.Equal(t, 2, n)
		assert.Equal(t, 2, rec.distinct())
		assert.Equal(t, []string{"bad-headers"}, dead)

		row := outboxRow(t, db, "bad-headers")
		assert.NotNil(t, row.DeadAt)
		assert.False(t, row.Processed)
		assert.Nil(t, row.LockedBy)
		require.NotNil(t, row.LastError)
		assert.Contains(t, *row.LastError, "headers")

		n, err = w.ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Zero(t, n, "a dead row is not claimed again")
	})
}

// A publisher that fails (or panics on) its whole batch because of one event: on the retry, events
// that failed before go to the publisher one by one, so only that event dies; its batch-mates are
// published.
func TestWorkerIsolatesAnEventThatFailsItsWholeBatch(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		for _, mode := range []string{"error", "panic"} {
			t.Run(mode, func(t *testing.T) {
				db := setup(t, d, nil)
				users := make([]User, 30)
				require.NoError(t, db.Create(&users).Error)
				poison := loadEvents(t, db)[3].MessageID

				rec := newRecorder()
				pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
					for _, m := range msgs {
						if m.ID == poison {
							if mode == "panic" {
								panic("cannot publish " + m.ID)
							}
							return errors.New("the batch was refused")
						}
					}
					return rec.Publish(ctx, msgs)
				})
				w := newWorker(t, db, pub, outboxplugin.WithBatchSize(10), outboxplugin.WithMaxAttempts(3),
					outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: time.Millisecond, Max: time.Millisecond}))
				deadline := time.Now().Add(20 * time.Second)
				for time.Now().Before(deadline) {
					_, err := w.ProcessOnce(context.Background())
					require.NoError(t, err)
					var open int64
					require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ? AND dead_at IS NULL", false).Count(&open).Error)
					if open == 0 {
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
				var dead []string
				for _, e := range loadEvents(t, db) {
					if e.DeadAt != nil {
						dead = append(dead, e.MessageID)
					} else {
						assert.True(t, e.Processed, "event %s", e.MessageID)
					}
				}
				assert.Equal(t, []string{poison}, dead, "only the poison event dies")
				assert.Equal(t, 29, rec.distinct())
			})
		}
	})
}
