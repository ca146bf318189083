package reliability

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
)

// The per-key ordering kill scenario's settings: few keys, so that a key has events waiting behind
// its head most of the time; a short lease, so that killed relays' heads are taken over often.
const (
	orderOutbox  = "order_outbox"
	orderKeys    = 24
	orderWriters = 4
	orderRelays  = 3
	orderBatch   = 20
	orderLease   = 2 * time.Second
)

// TestKillKeyOrdering is per-key ordering under relays killed at random, on PostgreSQL, MariaDB and
// SQLite: four writers commit transactions of two events of one of 24 keys (each key written by one
// writer, so that its commit order is its id order), while three relay processes with
// WithKeyOrdering publish to a Redis stream and are killed with SIGKILL at random moments (one kill
// in three between publish and mark) and restarted. Then the relays drain the outbox, and the test
// checks that no batch held two events of one key (each relay says so of its batches), that every
// event is in the stream, and that each key's entries — duplicates included — are in commit order: an
// event of a key never reaches the stream after a later event of that key did, which is what two
// events of one key in flight at once would do when their relay is killed (the batch published
// again, after its later event).
func TestKillKeyOrdering(t *testing.T) {
	phase := chaosDuration(t, 10*time.Second, len(chaosDialects))
	for _, dialect := range chaosDialects {
		t.Run(dialect, func(t *testing.T) { killOrderScenario(t, dialect, phase) })
	}
}

func killOrderScenario(t *testing.T, dialect string, phase time.Duration) {
	d := chaosDialectFor(t, dialect)
	stream := chaosName("order", dialect)
	rdb := chaosRedis(t, stream)
	db := chaosOpen(t, d, orderOutbox)
	if err := db.Migrator().DropTable(orderOutbox); err != nil {
		t.Fatal(err)
	}
	if err := outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), phase+3*time.Minute)
	defer cancel()
	consumeCtx, stopConsumer := context.WithCancel(ctx)
	ledger, consumerDone := chaosConsume(consumeCtx, rdb, stream)
	defer func() { stopConsumer(); consumerDone() }()

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	env := []string{
		chaosEnvDialect + "=" + d.name, chaosEnvDSN + "=" + d.dsn, chaosEnvTable + "=" + orderOutbox,
		chaosEnvDeadline + "=" + strconv.FormatInt(time.Now().Add(phase+3*time.Minute).UnixMilli(), 10),
		chaosEnvRedis + "=" + chaosRedisAddr(), chaosEnvStream + "=" + stream,
		chaosEnvKeyOrdering + "=1", chaosEnvBatch + "=" + strconv.Itoa(orderBatch), chaosEnvPoll + "=50ms",
		chaosEnvLease + "=" + orderLease.String(),
	}
	// A relay announces each batch that holds a key twice.
	var keyTwice atomic.Int64
	onRelay := func(_ *chaosProc, kind string, _ []string) {
		if kind == "KEYTWICE" {
			keyTwice.Add(1)
		}
	}
	relays := make([]*chaosProc, orderRelays)
	for i := range relays {
		relays[i] = chaosStart(t, "relay", env, onRelay)
	}
	for _, r := range relays {
		if err := r.waitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}

	// The writers, in this process: each key belongs to one writer, which commits its transactions
	// one after another.
	writeCtx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var committed atomic.Int64
	var writeErr atomic.Pointer[error]
	for w := 0; w < orderWriters; w++ {
		wrng := rand.New(rand.NewPCG(seed, uint64(w)+2))
		wg.Go(func() {
			for step := 0; writeCtx.Err() == nil; step++ {
				key := strconv.Itoa(w + orderWriters*wrng.IntN(orderKeys/orderWriters))
				err := db.WithContext(writeCtx).Transaction(func(tx *gorm.DB) error {
					for i := 0; i < 2; i++ {
						if err := outboxplugin.Emit(tx, "Ordered", map[string]int{"step": step, "i": i},
							outboxplugin.WithAggregate("OrderKey", key)); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					if writeCtx.Err() == nil {
						writeErr.Store(&err)
					}
					return
				}
				committed.Add(1)
				// About 200 events/s in all: a backlog the relays work off, not one that outgrows them
				// (per-key ordering on MySQL slows with deep backlogs of few keys; docs/relay.md).
				time.Sleep(time.Duration(20+wrng.IntN(40)) * time.Millisecond)
			}
		})
	}

	// The chaos phase: a relay killed every 0.3–1.2 s, one kill in three between publish and mark.
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }
	var kills, windowKills int
	end := time.Now().Add(phase)
	for time.Now().Before(end) {
		time.Sleep(between(300*time.Millisecond, 1200*time.Millisecond))
		for _, r := range relays {
			if msg := r.unexpectedExit(); msg != "" {
				stopWriters()
				wg.Wait()
				t.Fatal(msg)
			}
		}
		i := rng.IntN(orderRelays)
		r := relays[i]
		if kills%3 == 1 {
			r.hold()
			select {
			case <-r.held:
				windowKills++
			case <-time.After(2 * time.Second):
			case <-r.done:
			}
		}
		r.kill()
		kills++
		time.Sleep(between(0, 300*time.Millisecond))
		relays[i] = chaosStart(t, "relay", env, onRelay)
	}
	stopWriters()
	wg.Wait()
	if p := writeErr.Load(); p != nil {
		t.Fatalf("a writer failed: %v", *p)
	}

	// The relays, no longer killed, drain the outbox.
	var total, pending int64
	err := chaosWaitFor(orderLease+60*time.Second, 50*time.Millisecond, "drain", func() (bool, error) {
		if err := db.Table(orderOutbox).Count(&total).Error; err != nil {
			return false, err
		}
		if err := db.Table(orderOutbox).Where("processed = ?", false).Count(&pending).Error; err != nil {
			return false, err
		}
		return pending == 0 && int64(ledger.distinct()) >= total, nil
	})
	if err != nil {
		t.Errorf("%v: %d events written, %d pending, %d distinct in the stream", err, total, pending, ledger.distinct())
	}
	chaosWindDown(ctx, t, relays, rdb, stream, ledger)
	stopConsumer()
	consumerDone()

	var rows []outboxplugin.OutboxEvent
	if err := db.Table(orderOutbox).Order("id").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	rowID := make(map[string]int64, len(rows))
	for _, r := range rows {
		rowID[r.MessageID] = r.ID
	}
	count, order := ledger.snapshot()
	var lost, duplicates, violations int
	for _, r := range rows {
		switch n := count[r.MessageID]; {
		case n == 0:
			lost++
		case n > 1:
			duplicates += n - 1
		}
	}
	latest := map[string]int64{} // key → the latest event of it in the stream so far
	for _, e := range order {
		id, ok := rowID[e.id]
		if !ok {
			t.Errorf("stream entry %s is no event of the outbox", e.id)
			continue
		}
		if id < latest[e.key] {
			if violations < 5 {
				t.Errorf("key %s: event %d reached the stream after its later event %d", e.key, id, latest[e.key])
			}
			violations++
			continue
		}
		latest[e.key] = id
	}
	t.Logf("FIGURES killorder/%s chaos=%v transactions=%d events=%d relay_kills=%d window_kills=%d lost=%d duplicates=%d out_of_order=%d key_twice_in_a_batch=%d",
		dialect, phase, committed.Load(), len(rows), kills, windowKills, lost, duplicates, violations, keyTwice.Load())
	if n := keyTwice.Load(); n > 0 {
		t.Errorf("%d times a batch held two events of one key", n)
	}
	if lost > 0 {
		t.Errorf("%d events never reached the stream", lost)
	}
	if windowKills == 0 || committed.Load() < 100 {
		t.Errorf("%d transactions and %d kills between publish and mark: the scenario exercised too little", committed.Load(), windowKills)
	}
	if !t.Failed() {
		if err := db.Migrator().DropTable(orderOutbox); err != nil {
			t.Error(err)
		}
	}
}
