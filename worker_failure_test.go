package outboxplugin_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A *PublishError that names no message of the batch — empty, wrapped, or naming only ids the batch
// does not have — is a failure of the whole batch: nothing is marked published.
func TestPublishErrorNamingNoMessageIsAWholeFailure(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		answers := map[string]error{
			"empty":         &outboxplugin.PublishError{},
			"empty wrapped": fmt.Errorf("down: %w", &outboxplugin.PublishError{}),
			"empty map":     &outboxplugin.PublishError{Failed: map[string]error{}},
			"strangers":     &outboxplugin.PublishError{Failed: map[string]error{"not-in-the-batch": errors.New("x")}},
		}
		for name, answer := range answers {
			t.Run(name, func(t *testing.T) {
				resetTables(t, db, captureModels...)
				require.NoError(t, db.Create(&[]User{{Name: "a"}, {Name: "b"}, {Name: "c"}}).Error)
				var seen []outboxplugin.BatchResult
				obs := &batchObserver{onBatch: func(r outboxplugin.BatchResult) { seen = append(seen, r) }}
				w := newWorker(t, db, outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error { return answer }),
					outboxplugin.WithObserver(obs))
				n, err := w.ProcessOnce(context.Background())
				require.NoError(t, err)
				assert.Zero(t, n, "nothing published")
				for _, e := range loadEvents(t, db) {
					assert.False(t, e.Processed, "not marked published")
					assert.Empty(t, e.LeaseOwner())
					assert.Zero(t, e.Attempts, "a failure naming no message spends no attempt")
				}
				require.Len(t, seen, 1)
				assert.Empty(t, seen[0].Published)
				assert.Len(t, seen[0].NotDelivered, 3)
			})
		}
	})
}

// An outage of any length kills no event: with the default options (10 attempts), 200 failed rounds
// — more than 30 minutes of Run's back-off at its 10 s cap — leave every event pending with no
// attempt spent, and they go out on their first attempt once the broker is back.
func TestLongOutageKillsNoEvent(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(make([]User, 25)).Error)
		var up atomic.Bool
		var dead atomic.Int64
		obs := &deadObserver{onDead: func(outboxplugin.Message, error) { dead.Add(1) }}
		rec := newRecorder()
		pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			if !up.Load() {
				return errors.New("dial tcp 127.0.0.1:4222: connect: connection refused")
			}
			return rec.Publish(ctx, msgs)
		})
		w := newWorker(t, db, pub, outboxplugin.WithObserver(obs))
		const rounds = 200 // × the 10 s back-off cap = 33 minutes
		for i := 0; i < rounds; i++ {
			n, err := w.ProcessOnce(context.Background())
			require.NoError(t, err)
			require.Zero(t, n)
			if i%50 == 0 { // new events keep coming during the outage
				require.NoError(t, db.Create(&User{Name: "during"}).Error)
			}
		}
		assert.Zero(t, dead.Load(), "no event died")
		for _, e := range loadEvents(t, db) {
			assert.Zero(t, e.Attempts)
			assert.Nil(t, e.DeadAt)
			assert.Nil(t, e.NextAttemptAt, "due at once when the broker is back")
			require.NotNil(t, e.LastError, "the outage is recorded")
			assert.Contains(t, *e.LastError, "connection refused")
		}
		up.Store(true)
		runUntilDrained(t, db, w)
		assert.Equal(t, 29, rec.distinct())
		for _, m := range rec.published() {
			assert.Equal(t, 1, m.Attempt, "delivered on its first attempt")
		}
	})
}

// Cancelling Run at any moment of a busy drain leaves no row leased once Run has returned: claims in
// flight run to their end and are handed back, publishes cut short hand back what the broker did not
// confirm, and published batches are marked.
func TestRunCancelledAtRandomStrandsNothing(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.CreateInBatches(make([]User, 3000), 500).Error)
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
		t.Logf("cancelling at random points (%s)", d.name)
		slow := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			select { // a broker round trip
			case <-time.After(time.Duration(rand.IntN(3)) * time.Millisecond): // the global source: publishes run on goroutines of their own
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		for i := 0; i < 25; i++ {
			w := newWorker(t, db, slow, outboxplugin.WithBatchSize(50), outboxplugin.WithoutListen())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }()
			time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
			cancel()
			require.NoError(t, <-done)
			require.Zero(t, leasedCount(t, db), "round %d: rows left leased after Run returned", i)
		}
	})
}
