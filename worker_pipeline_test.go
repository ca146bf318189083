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
	require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("locked_by <> ? AND processed = ?", outboxplugin.NoLeaseOwner, false).Count(&n).Error)
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
			assert.Empty(t, e.LeaseOwner())
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
			assert.Empty(t, e.LeaseOwner(), "handed back")
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

// overlapShare is the share of a claim's time that publishing must take for Run to claim ahead
// (relay.md, "Pipelining": at least an eighth, judged by the batch before).
const overlapShare = 8

// judgedFast reports whether a worker that measured r takes its publisher for one that returns at
// once: the batch took less than an eighth of its claim's time to publish.
func judgedFast(r outboxplugin.BatchResult) bool {
	return r.PublishDuration*overlapShare < r.ClaimDuration
}

// paceRecorder is an Observer that keeps what the worker measured of each batch, by the id of the
// batch's first message.
type paceRecorder struct {
	outboxplugin.NopObserver
	mu      sync.Mutex
	batches map[string]outboxplugin.BatchResult
}

// BatchDone records r.
func (p *paceRecorder) BatchDone(_ context.Context, r outboxplugin.BatchResult) {
	if len(r.Published) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.batches[r.Published[0].ID] = r
}

// result returns what the worker measured of the batch whose first message is firstID, once it is
// done.
func (p *paceRecorder) result(firstID string) (outboxplugin.BatchResult, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.batches[firstID]
	return r, ok
}

// Run claims ahead only while publishing takes long enough for the overlap to pay: behind a publisher
// that returns at once it claims one batch at a time (a batch claimed ahead would only be more leased
// rows for other workers' claims to step over), and it claims ahead again once publishing slows down.
//
// Fast and slow are the worker's own measures (BatchResult's ClaimDuration and PublishDuration), and
// load stretches them: a publish that returns at once can be descheduled long enough to count as slow.
// So the test judges each batch as the worker does, from the durations the observer reports, and
// checks the worker's choice against that judgement, whatever the machine's load. It publishes in
// rounds of three batches — one that returns at once; a probe that waits for a batch claimed beside
// its own, which must not come, and so takes time; then one that waits for the claim ahead that must
// come — until it has seen each case once.
func TestWorkerClaimsAheadOnlyWhilePublishingTakesTime(t *testing.T) {
	const (
		batchSize = 10
		maxRounds = 8 // one is enough unless load makes a publish pass for what it is not
		// probeWait is how long the probe waits for a claim ahead: the time the claim, were it
		// made, would take to show, and what makes the probe slow.
		probeWait = 300 * time.Millisecond
	)
	type round struct {
		fast, probe string // the first message id of the batch that returned at once, and of the probe
		// probeSawAhead: a batch was claimed beside the probe's; afterSawAhead: beside the one after.
		probeSawAhead, afterSawAhead bool
	}
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		// A batch to spare after the last round, so that the claim ahead it waits for finds rows.
		require.NoError(t, db.Create(make([]User, (3*maxRounds+1)*batchSize)).Error)
		pace := &paceRecorder{batches: map[string]outboxplugin.BatchResult{}}

		var (
			mu     sync.Mutex
			got    []string
			rounds []round
			cur    round
			step   int // of the round: 0 fast, 1 probe, 2 after; 3 once both cases have been seen
		)
		// claimedBeside reports whether rows besides the batch being published are leased: the batch
		// claimed ahead, or the batch before, still carried to the claim ahead that marks it.
		claimedBeside := func(msgs []outboxplugin.Message) bool { return leasedCount(t, db) > int64(len(msgs)) }
		seenBoth := func() bool {
			var fast, slow bool
			for _, r := range rounds {
				if res, ok := pace.result(r.fast); ok && judgedFast(res) {
					fast = true
				}
				if res, ok := pace.result(r.probe); ok && !judgedFast(res) {
					slow = true
				}
			}
			return fast && slow
		}
		pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range msgs {
				got = append(got, m.ID)
			}
			switch step {
			case 0: // returns at once
				cur = round{fast: msgs[0].ID}
				step = 1
			case 1:
				cur.probe = msgs[0].ID
				for deadline := time.Now().Add(probeWait); !cur.probeSawAhead && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					cur.probeSawAhead = claimedBeside(msgs)
				}
				step = 2
			case 2:
				// The claim ahead comes at once if the worker judged the probe slow. Judged fast
				// (only if the probe's claim took eight times its wait), the probe is reported
				// done before this publish starts, and no claim ahead is to come. The deadline
				// only keeps a broken worker from hanging the test.
				for deadline := time.Now().Add(10 * time.Second); !cur.afterSawAhead && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					if res, ok := pace.result(cur.probe); ok && judgedFast(res) {
						break
					}
					cur.afterSawAhead = claimedBeside(msgs)
				}
				rounds = append(rounds, cur)
				step = 0
				if seenBoth() || len(rounds) == maxRounds {
					step = 3
				}
			}
			return nil
		})
		w := newWorker(t, db, pub, outboxplugin.WithBatchSize(batchSize), outboxplugin.WithPollInterval(10*time.Millisecond),
			outboxplugin.WithObserver(pace))
		runUntilDrained(t, db, w)

		mu.Lock()
		defer mu.Unlock()
		var fast, slow int
		for i, r := range rounds {
			res, ok := pace.result(r.fast)
			require.True(t, ok, "round %d: the batch that returned at once was never reported done", i)
			if judgedFast(res) {
				fast++
				assert.False(t, r.probeSawAhead, "round %d: claimed ahead behind a publisher that returned at once (claim %v, publish %v)",
					i, res.ClaimDuration, res.PublishDuration)
			}
			res, ok = pace.result(r.probe)
			require.True(t, ok, "round %d: the probe's batch was never reported done", i)
			if !judgedFast(res) {
				slow++
				assert.True(t, r.afterSawAhead, "round %d: did not claim ahead once publishing took time (claim %v, publish %v)",
					i, res.ClaimDuration, res.PublishDuration)
			}
		}
		assert.NotZero(t, fast, "in %d rounds, no publish that returns at once was measured as one", len(rounds))
		assert.NotZero(t, slow, "in %d rounds, no probe was measured as slow", len(rounds))
		var want []string
		for _, e := range loadEvents(t, db) {
			want = append(want, e.MessageID)
			assert.Empty(t, e.LeaseOwner())
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
			assert.Empty(t, e.LeaseOwner())
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
		assert.Empty(t, row.LeaseOwner())
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
