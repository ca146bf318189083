package outboxplugin_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// orderingPublisher checks the per-key guarantees while it publishes: no key is in flight twice at
// once (across relays and within a batch), and it records each key's messages in publication order.
// Messages of the poison key fail while poisoned is set.
type orderingPublisher struct {
	mu         sync.Mutex
	inFlight   map[string]bool
	byKey      map[string][]string // key -> message ids in publication order
	violations []string
	poisonKey  string
	poisoned   bool
}

func (p *orderingPublisher) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	p.mu.Lock()
	for _, m := range msgs {
		if p.inFlight[m.Key] {
			p.violations = append(p.violations, "key "+m.Key+" published by two at once")
		}
		p.inFlight[m.Key] = true
	}
	p.mu.Unlock()

	time.Sleep(2 * time.Millisecond) // widen the window in which a second relay could interfere

	p.mu.Lock()
	defer p.mu.Unlock()
	failed := map[string]error{}
	for _, m := range msgs {
		delete(p.inFlight, m.Key)
		if p.poisoned && m.Key == p.poisonKey {
			failed[m.ID] = errors.New("poison")
			continue
		}
		p.byKey[m.Key] = append(p.byKey[m.Key], m.ID)
	}
	return outboxplugin.FailedMessages(failed)
}

func (p *orderingPublisher) publishedOf(key string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.byKey[key]...)
}

func (p *orderingPublisher) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, ids := range p.byKey {
		n += len(ids)
	}
	return n
}

// runWorkers starts n workers and returns a function that stops them and checks they returned nil.
func runWorkers(t *testing.T, n int, newW func() *outboxplugin.Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		w := newW()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- w.Run(ctx)
		}()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			close(errs)
			for err := range errs {
				assert.NoError(t, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Three relays with strict per-key ordering, 20 keys of 10 events each and one poison key whose
// first event keeps failing: every key is published in order and never by two relays at once; the
// poison key holds back only its own later events, also once its head is dead, until it is requeued.
func TestKeyOrderingWithPoisonKey(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()))
		const keys, perKey = 20, 10
		want := map[string][]string{} // key -> message ids in commit order
		emit := func(key string) {
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "AccountChanged", map[string]string{"key": key}, outboxplugin.WithAggregate("Account", key))
			}))
			evs := loadEvents(t, db)
			want["Account:"+key] = append(want["Account:"+key], evs[len(evs)-1].MessageID)
		}
		for i := 0; i < perKey; i++ {
			for k := 0; k < keys; k++ {
				emit(fmt.Sprint("acct-", k))
			}
			if i < 5 {
				emit("poison")
			}
		}
		pub := &orderingPublisher{inFlight: map[string]bool{}, byKey: map[string][]string{}, poisonKey: "Account:poison", poisoned: true}
		fast := outboxplugin.ExponentialBackoff{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond}
		stop := runWorkers(t, 3, func() *outboxplugin.Worker {
			return newWorker(t, db, pub, outboxplugin.WithKeyOrdering(), outboxplugin.WithBatchSize(7),
				outboxplugin.WithPollInterval(10*time.Millisecond), outboxplugin.WithMaxAttempts(1000), outboxplugin.WithRetryPolicy(fast))
		})
		require.Eventually(t, func() bool { return pub.total() == keys*perKey }, 60*time.Second, 20*time.Millisecond,
			"every key but the poison one drains")
		time.Sleep(100 * time.Millisecond) // give the relays a chance to get the poison key wrong
		stop()

		pub.mu.Lock()
		assert.Empty(t, pub.violations)
		pub.mu.Unlock()
		for key, ids := range want {
			if key == pub.poisonKey {
				assert.Empty(t, pub.publishedOf(key), "the poison key's later events wait behind its head")
				continue
			}
			assert.Equal(t, ids, pub.publishedOf(key), "key %s in commit order", key)
		}
		head := outboxRow(t, db, want[pub.poisonKey][0])
		assert.Greater(t, head.Attempts, 1, "the head was retried")

		// The head dies (a worker allowing fewer attempts than it has had): its key stays blocked.
		w := newWorker(t, db, pub, outboxplugin.WithKeyOrdering(), outboxplugin.WithMaxAttempts(1))
		require.Eventually(t, func() bool { // once its backoff has passed
			_, err := w.ProcessOnce(context.Background())
			require.NoError(t, err)
			return outboxRow(t, db, want[pub.poisonKey][0]).DeadAt != nil
		}, 5*time.Second, 10*time.Millisecond)
		for i := 0; i < 3; i++ {
			n, err := w.ProcessOnce(context.Background())
			require.NoError(t, err)
			require.Zero(t, n, "a dead head blocks its key")
		}

		// Requeued and no longer failing: the key drains, in order.
		pub.mu.Lock()
		pub.poisoned = false
		pub.mu.Unlock()
		_, err := w.RequeueAllDead(context.Background())
		require.NoError(t, err)
		drain := newWorker(t, db, pub, outboxplugin.WithKeyOrdering())
		for i := 0; i < 10 && len(pub.publishedOf(pub.poisonKey)) < 5; i++ {
			_, err := drain.ProcessOnce(context.Background())
			require.NoError(t, err)
		}
		assert.Equal(t, want[pub.poisonKey], pub.publishedOf(pub.poisonKey))
	})
}

// Without key ordering, a failing event does not hold anything back.
func TestDefaultOrderingDoesNotBlock(t *testing.T) {
	db := setup(t, dialects[0], nil)
	for i := 0; i < 3; i++ {
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "E", map[string]int{"i": i}, outboxplugin.WithAggregate("A", "same"))
		}))
	}
	first := loadEvents(t, db)[0].MessageID
	rec := newRecorder()
	rec.fail = func(m outboxplugin.Message) error {
		if m.ID == first {
			return errors.New("no")
		}
		return nil
	}
	n, err := newWorker(t, db, rec).ProcessOnce(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, n)
}

// timingPublisher reports the time each message reaches it.
func timingPublisher() (<-chan time.Time, outboxplugin.Publisher) {
	received := make(chan time.Time, 100)
	return received, outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
		for range msgs {
			received <- time.Now()
		}
		return nil
	})
}

// On PostgreSQL the capture side notifies and the worker LISTENs: with a 5 s poll interval, an event
// is published within milliseconds of its commit.
func TestWakeUpOnPostgres(t *testing.T) {
	d := dialects[1]
	db := setup(t, d, nil)
	received, pub := timingPublisher()
	stop := runWorkers(t, 1, func() *outboxplugin.Worker {
		return newWorker(t, db, pub, outboxplugin.WithPollInterval(5*time.Second))
	})
	defer stop()
	time.Sleep(300 * time.Millisecond) // let the worker settle into its wait, with LISTEN in place

	var latencies []time.Duration
	for i := 0; i < 21; i++ {
		require.NoError(t, db.Create(&User{Name: fmt.Sprint("w", i)}).Error)
		committed := time.Now()
		select {
		case at := <-received:
			latencies = append(latencies, at.Sub(committed))
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d not published", i)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	median := latencies[len(latencies)/2]
	t.Logf("commit to publish: median %v, max %v", median, latencies[len(latencies)-1])
	assert.Less(t, median, 50*time.Millisecond)
}

// Without the notification (WithoutNotify), a worker of another process (here: another pool) finds
// events by polling.
func TestWithoutNotifyPolls(t *testing.T) {
	d := dialects[1]
	db := setup(t, d, nil, outboxplugin.WithoutNotify())
	other := openDB(t, d, nil) // no plugin, its own pool: commits of db do not wake its workers
	received, pub := timingPublisher()
	stop := runWorkers(t, 1, func() *outboxplugin.Worker {
		return newWorker(t, other, pub, outboxplugin.WithPollInterval(700*time.Millisecond))
	})
	defer stop()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, db.Create(&User{Name: "quiet"}).Error)
	committed := time.Now()
	select {
	case at := <-received:
		assert.Greater(t, at.Sub(committed), 100*time.Millisecond, "no notification: found by the next poll")
	case <-time.After(5 * time.Second):
		t.Fatal("not published by polling")
	}
}

// The capture side notifies once per transaction, however many statements wrote events in it, and
// not at all for a transaction that rolls back.
func TestOneNotificationPerTransaction(t *testing.T) {
	d := dialects[1]
	db := setup(t, d, nil)
	// LISTEN on the server itself: behind a transaction pooler the NOTIFYs pass, a LISTEN would not.
	conn, err := pgx.Connect(context.Background(), replaceDSNField(postgresDirectDSN(), "dbname", testDatabase))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), `LISTEN "outbox_events"`)
	require.NoError(t, err)

	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		for i := 0; i < 3; i++ {
			if err := tx.Create(&User{Name: fmt.Sprint("n", i)}).Error; err != nil {
				return err
			}
		}
		return outboxplugin.Emit(tx, "Also", nil)
	}))
	_ = db.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, tx.Create(&User{Name: "rolled back"}).Error)
		return errors.New("roll back")
	})

	wait := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := conn.WaitForNotification(ctx)
		return err
	}
	require.NoError(t, wait(5*time.Second), "one notification for the committed transaction")
	assert.ErrorIs(t, wait(300*time.Millisecond), context.DeadlineExceeded, "and no other")
}

// The worker runs no DDL: with per-key ordering and no index for it, it fails at once, saying what to
// run, instead of building the index at run time; AutoMigrate with WithKeyOrderingIndex builds it, and
// on PostgreSQL replaces an INVALID index that a failed CREATE INDEX CONCURRENTLY left behind.
func TestKeyOrderingNeedsItsIndex(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&User{Name: "a"}).Error)
		w := newWorker(t, db, newRecorder(), outboxplugin.WithKeyOrdering())
		_, err := w.ProcessOnce(context.Background())
		require.Error(t, err)
		assert.ErrorContains(t, err, "idx_outbox_events_key_pending")
		assert.ErrorContains(t, err, "outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex())")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.Error(t, w.Run(ctx), "Run fails at once")
		require.NoError(t, ctx.Err())

		if d.name == "postgres" {
			// A unique build over duplicate keys fails and leaves an INVALID index of that name.
			require.NoError(t, db.Create(&User{Name: "b"}).Error)
			err := db.Exec(`CREATE UNIQUE INDEX CONCURRENTLY idx_outbox_events_key_pending ON outbox_events (aggregate_type)`).Error
			require.Error(t, err)
			_, err = newWorker(t, db, newRecorder(), outboxplugin.WithKeyOrdering()).ProcessOnce(context.Background())
			assert.ErrorContains(t, err, "invalid")
		}
		require.NoError(t, outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()))
		require.NoError(t, outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()), "again: nothing to do")
		n, err := newWorker(t, db, newRecorder(), outboxplugin.WithKeyOrdering()).ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Positive(t, n)
	})
}
