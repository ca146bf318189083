package outboxplugin_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// Per-key ordering under concurrent writers and several relays: writers commit, all at once,
// transactions that each write two events of one of 50 keys, while two relays with WithKeyOrdering
// publish. No key is ever in flight twice — in one batch or in two relays' batches at once — and each
// transaction's two events are published in the order they were written, every event once.
func TestKeyOrderingUnderConcurrentWriters(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()))
		const writers, perWriter, keys = 4, 150, 50
		pub := &orderingPublisher{inFlight: map[string]bool{}, byKey: map[string][]string{}}
		stop := runWorkers(t, 2, func() *outboxplugin.Worker {
			return newWorker(t, db, pub, outboxplugin.WithKeyOrdering(), outboxplugin.WithBatchSize(20),
				outboxplugin.WithPollInterval(5*time.Millisecond))
		})

		var (
			wg        sync.WaitGroup
			fails     atomic.Int64
			failFirst atomic.Value
		)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perWriter; i++ {
					key := fmt.Sprint("acct-", rand.IntN(keys))
					txID := fmt.Sprintf("w%d-%d", w, i)
					err := db.Transaction(func(tx *gorm.DB) error {
						for n := 1; n <= 2; n++ {
							if err := outboxplugin.Emit(tx, "AccountChanged", map[string]any{"tx": txID, "n": n}, outboxplugin.WithAggregate("Account", key)); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						fails.Add(1)
						failFirst.CompareAndSwap(nil, err.Error())
					}
				}
			}()
		}
		wg.Wait()
		var evs []outboxplugin.OutboxEvent
		require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Order("id").Find(&evs).Error)
		type pair struct{ key, first, second string }
		byTx := map[string]*pair{}
		for _, e := range evs {
			var body struct {
				Tx string
				N  int
			}
			require.NoError(t, json.Unmarshal(e.Payload, &body))
			p := byTx[body.Tx]
			if p == nil {
				p = &pair{key: "Account:" + e.AggregateID}
				byTx[body.Tx] = p
			}
			if body.N == 1 {
				p.first = e.MessageID
			} else {
				p.second = e.MessageID
			}
		}
		require.Eventually(t, func() bool { return pub.total() >= len(evs) }, 120*time.Second, 20*time.Millisecond, "every event published")
		stop()
		t.Logf("%d events of %d transactions (%d failed to commit; the first: %v)", len(evs), writers*perWriter, fails.Load(), failFirst.Load())
		assert.Zero(t, fails.Load(), "no application transaction fails because of the relays")

		assert.Equal(t, len(evs), pub.total(), "every event once")
		pub.mu.Lock()
		defer pub.mu.Unlock()
		assert.Empty(t, pub.violations, "a key in flight twice")
		position := map[string]int{}
		for _, ids := range pub.byKey {
			for i, id := range ids {
				position[id] = i
			}
		}
		for _, p := range byTx {
			assert.Less(t, position[p.first], position[p.second], "key %s: a transaction's events in the order written", p.key)
		}
	})
}
