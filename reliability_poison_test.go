package outboxplugin_test

// Reliability suite, poison events in one process (docs/reliability.md): one event that always fails
// does not hold the others back — in per-key ordering mode, only the later events of its own key —
// becomes dead after exactly the maximum number of attempts, is reported once, and comes back with
// RequeueDead. worker_test.go (TestWorkerRetriesWithBackoffThenDead, TestWorkerPartlyFailedBatch) and
// worker_order_test.go (TestKeyOrderingWithPoisonKey) cover a lone failing event, a partly failed
// batch, and a poison key whose head is made dead by a second worker; these tests run the poison
// through Run among many events, to its natural death, and requeue it by id.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

var errPoison = errors.New("poison: rejected by the broker")

// poisonPublisher fails the messages poisoned says are poison (reporting them in a *PublishError, as
// the publishers in publishers/ do for messages the broker rejects) and records the others, and the
// attempt numbers each poison delivery carried.
type poisonPublisher struct {
	mu             sync.Mutex
	poisoned       func(m outboxplugin.Message) bool
	cured          bool
	published      map[string]int // message id -> deliveries accepted
	order          map[string][]string
	poisonAttempts []int
}

func newPoisonPublisher(poisoned func(outboxplugin.Message) bool) *poisonPublisher {
	return &poisonPublisher{poisoned: poisoned, published: map[string]int{}, order: map[string][]string{}}
}

func (p *poisonPublisher) Publish(_ context.Context, msgs []outboxplugin.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	failed := map[string]error{}
	for _, m := range msgs {
		if p.poisoned(m) {
			p.poisonAttempts = append(p.poisonAttempts, m.Attempt)
			if !p.cured {
				failed[m.ID] = errPoison
				continue
			}
		}
		p.published[m.ID]++
		p.order[m.Key] = append(p.order[m.Key], m.ID)
	}
	return outboxplugin.FailedMessages(failed)
}

func (p *poisonPublisher) cure() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cured = true
}

func (p *poisonPublisher) distinct() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.published)
}

func (p *poisonPublisher) snapshot() (published map[string]int, order map[string][]string, attempts []int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	published = make(map[string]int, len(p.published))
	for k, v := range p.published {
		published[k] = v
	}
	order = make(map[string][]string, len(p.order))
	for k, v := range p.order {
		order[k] = append([]string(nil), v...)
	}
	return published, order, append([]int(nil), p.poisonAttempts...)
}

// deadRecorder records the Observer's Dead calls.
type deadRecorder struct {
	outboxplugin.NopObserver
	mu   sync.Mutex
	dead []string
	errs []error
}

func (o *deadRecorder) Dead(_ context.Context, m outboxplugin.Message, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dead = append(o.dead, m.ID)
	o.errs = append(o.errs, err)
}

func (o *deadRecorder) snapshot() ([]string, []error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.dead...), append([]error(nil), o.errs...)
}

// fastRetry makes a poison event reach its last attempt within a fraction of a second.
var fastRetry = outboxplugin.ExponentialBackoff{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond}

// requireDeadAfter waits until the event is dead, and checks its row.
func requireDeadAfter(t *testing.T, db *gorm.DB, messageID string, attempts int) {
	t.Helper()
	require.Eventually(t, func() bool { return outboxRow(t, db, messageID).DeadAt != nil }, 20*time.Second, 10*time.Millisecond,
		"the poison event becomes dead")
	row := outboxRow(t, db, messageID)
	assert.Equal(t, attempts, row.Attempts, "dead after exactly the maximum number of attempts")
	assert.False(t, row.Processed)
	assert.Empty(t, row.LeaseOwner(), "a dead event holds no lease")
	require.NotNil(t, row.LastError)
	assert.Equal(t, errPoison.Error(), *row.LastError, "the last error is kept")
}

// One poison event among 120, in the default mode, with Run: the other 119 are each published exactly
// once while it is retried; it is dead after exactly the maximum number of attempts (each delivery
// numbered), reported once to the Observer and logged once at error level; RequeueDead by its id
// brings it back with its attempts reset, and it is published.
func TestPoisonEventAmongManyDefaultMode(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		users := make([]User, 120)
		for i := range users {
			users[i] = User{Name: fmt.Sprint("u", i)}
		}
		require.NoError(t, db.Create(&users).Error)
		poisonKey := fmt.Sprintf("User:%d", users[5].ID)
		var poisonID string
		for _, e := range loadEvents(t, db) {
			if e.AggregateID == fmt.Sprint(users[5].ID) {
				poisonID = e.MessageID
			}
		}
		const maxAttempts = 4
		pub := newPoisonPublisher(func(m outboxplugin.Message) bool { return m.Key == poisonKey })
		obs := &deadRecorder{}
		logs := &countingHandler{counts: map[slog.Level]int{}}
		stop := runWorkers(t, 1, func() *outboxplugin.Worker {
			w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithBatchSize(10), outboxplugin.WithPollInterval(10*time.Millisecond),
				outboxplugin.WithMaxAttempts(maxAttempts), outboxplugin.WithRetryPolicy(fastRetry),
				outboxplugin.WithObserver(obs), outboxplugin.WithLogger(slog.New(logs)))
			require.NoError(t, err)
			return w
		})
		requireDeadAfter(t, db, poisonID, maxAttempts)
		require.Eventually(t, func() bool { return pub.distinct() == len(users)-1 }, 20*time.Second, 10*time.Millisecond,
			"every other event is published")
		time.Sleep(100 * time.Millisecond) // a dead event must stay dead under a running worker
		stop()

		published, _, attempts := pub.snapshot()
		for id, n := range published {
			assert.Equal(t, 1, n, "event %s published once", id)
		}
		assert.NotContains(t, published, poisonID)
		assert.Equal(t, []int{1, 2, 3, 4}, attempts, "one delivery per attempt, numbered")
		dead, errs := obs.snapshot()
		assert.Equal(t, []string{poisonID}, dead, "reported dead once")
		require.Len(t, errs, 1)
		assert.ErrorIs(t, errs[0], errPoison)
		logs.mu.Lock()
		assert.Equal(t, 1, logs.counts[slog.LevelError], "one error line: the death")
		logs.mu.Unlock()

		ctx := context.Background()
		w := newWorker(t, db, pub)
		n, err := w.RequeueDead(ctx, "01900000-0000-7000-8000-000000000000")
		require.NoError(t, err)
		assert.Zero(t, n, "an unknown id requeues nothing")
		n, err = w.RequeueDead(ctx, loadEvents(t, db)[0].MessageID)
		require.NoError(t, err)
		assert.Zero(t, n, "a processed event is not requeued")
		n, err = w.RequeueDead(ctx, poisonID)
		require.NoError(t, err)
		assert.EqualValues(t, 1, n)
		row := outboxRow(t, db, poisonID)
		assert.Nil(t, row.DeadAt)
		assert.Zero(t, row.Attempts, "attempts start again")
		assert.Nil(t, row.NextAttemptAt, "due at once")

		pub.cure()
		published1, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, published1)
		assert.True(t, outboxRow(t, db, poisonID).Processed)
		_, _, attempts = pub.snapshot()
		assert.Equal(t, 1, attempts[len(attempts)-1], "the requeued delivery is its first again")
	})
}

// Per-key ordering with Run: the head of one key always fails. The other keys drain in commit order;
// the poison key's later events wait; the head dies after exactly the maximum number of attempts —
// no second worker needed — and keeps its key blocked while dead; requeued by id and cured, the
// whole key is published in commit order.
func TestPoisonKeyDiesAndRequeuesInOrder(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		const keys, perKey = 6, 5
		want := map[string][]string{} // key -> message ids in commit order
		for i := 0; i < perKey; i++ {
			for k := 0; k < keys; k++ {
				key := fmt.Sprint("acct-", k)
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					return outboxplugin.Emit(tx, "AccountChanged", map[string]int{"seq": i}, outboxplugin.WithAggregate("Account", key))
				}))
				evs := loadEvents(t, db)
				want["Account:"+key] = append(want["Account:"+key], evs[len(evs)-1].MessageID)
			}
		}
		const poisonKey = "Account:acct-2"
		head := want[poisonKey][0]
		const maxAttempts = 3
		pub := newPoisonPublisher(func(m outboxplugin.Message) bool { return m.ID == head })
		obs := &deadRecorder{}
		require.NoError(t, outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()))
		newKeyed := func() *outboxplugin.Worker {
			return newWorker(t, db, pub, outboxplugin.WithKeyOrdering(), outboxplugin.WithBatchSize(4),
				outboxplugin.WithPollInterval(10*time.Millisecond), outboxplugin.WithMaxAttempts(maxAttempts),
				outboxplugin.WithRetryPolicy(fastRetry), outboxplugin.WithObserver(obs))
		}
		stop := runWorkers(t, 1, newKeyed)
		requireDeadAfter(t, db, head, maxAttempts)
		require.Eventually(t, func() bool { return pub.distinct() == (keys-1)*perKey }, 20*time.Second, 10*time.Millisecond,
			"every other key drains")
		time.Sleep(100 * time.Millisecond) // the dead head must keep its key blocked
		stop()

		_, order, attempts := pub.snapshot()
		for key, ids := range want {
			if key == poisonKey {
				assert.Empty(t, order[key], "the poison key's later events wait behind its dead head")
				continue
			}
			assert.Equal(t, ids, order[key], "key %s in commit order", key)
		}
		assert.Equal(t, []int{1, 2, 3}, attempts)
		dead, _ := obs.snapshot()
		assert.Equal(t, []string{head}, dead)
		for _, id := range want[poisonKey][1:] {
			row := outboxRow(t, db, id)
			assert.Zero(t, row.Attempts, "a later event of the blocked key was never claimed")
			assert.Nil(t, row.DeadAt)
		}

		pub.cure()
		n, err := newKeyed().RequeueDead(context.Background(), head)
		require.NoError(t, err)
		assert.EqualValues(t, 1, n)
		stop = runWorkers(t, 1, newKeyed)
		require.Eventually(t, func() bool { return pub.distinct() == keys*perKey }, 20*time.Second, 10*time.Millisecond,
			"the requeued key drains")
		stop()
		_, order, _ = pub.snapshot()
		assert.Equal(t, want[poisonKey], order[poisonKey], "in commit order, the requeued head first")
	})
}
