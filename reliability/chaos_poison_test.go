package reliability

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
)

// The poison scenario's settings.
const (
	poisonOutbox      = "poison_outbox"
	poisonRelays      = 3
	poisonKeys        = 8 // aggregates PoisonKey:1 .. PoisonKey:8
	poisonSteps       = 5 // events per key, written one transaction each, round by round
	poisonKey         = 3 // the key of the poison event...
	poisonStep        = 2 // ...and its place among the key's events
	poisonMaxAttempts = 3
)

// TestChaosPoison is the poison-event scenario across processes, on PostgreSQL, MariaDB and SQLite:
// three relay processes in per-key ordering mode publish 40 events of 8 keys to a Redis stream
// through a publisher that refuses one event (the second of key PoisonKey:3) until a gate file
// exists. It checks that every other key is delivered in full and in order while the poison event
// fails; that the poison key's later events are held back (never claimed) behind it; that the poison
// event is dead after exactly WithMaxAttempts deliveries; and that once the gate opens, RequeueDead
// brings it back and the key drains in order, each event once.
func TestChaosPoison(t *testing.T) {
	for _, dialect := range chaosDialects {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel() // light, and each dialect has its own database and stream
			poisonScenario(t, dialect)
		})
	}
}

func poisonScenario(t *testing.T, dialect string) {
	d := chaosDialectFor(t, dialect)
	stream := chaosName("poison", dialect)
	rdb := chaosRedis(t, stream)
	db := chaosOpen(t, d, poisonOutbox)
	if err := db.Migrator().DropTable(poisonOutbox); err != nil {
		t.Fatal(err)
	}
	if err := outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The events, one transaction each, so that each key's events commit in step order.
	for step := 1; step <= poisonSteps; step++ {
		for key := 1; key <= poisonKeys; key++ {
			err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Poison_step", map[string]int{"key": key, "step": step},
					outboxplugin.WithAggregate("PoisonKey", strconv.Itoa(key)))
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	var rows []outboxplugin.OutboxEvent
	if err := db.Table(poisonOutbox).Order("id").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	byKey := map[string][]string{} // key → message ids in commit order
	for _, r := range rows {
		k := r.AggregateType + ":" + r.AggregateID
		byKey[k] = append(byKey[k], r.MessageID)
	}
	poisoned := "PoisonKey:" + strconv.Itoa(poisonKey)
	if len(rows) != poisonKeys*poisonSteps || len(byKey[poisoned]) != poisonSteps {
		t.Fatalf("wrote %d events, %d of %s; want %d and %d", len(rows), len(byKey[poisoned]), poisoned, poisonKeys*poisonSteps, poisonSteps)
	}
	poisonID := byKey[poisoned][poisonStep-1]
	gate := filepath.Join(t.TempDir(), "poison-gate")

	consumeCtx, stopConsumer := context.WithCancel(ctx)
	ledger, consumerDone := chaosConsume(consumeCtx, rdb, stream)
	defer func() { stopConsumer(); consumerDone() }()

	env := []string{
		chaosEnvDialect + "=" + d.name, chaosEnvDSN + "=" + d.dsn, chaosEnvTable + "=" + poisonOutbox,
		chaosEnvDeadline + "=" + strconv.FormatInt(time.Now().Add(2*time.Minute).UnixMilli(), 10),
		chaosEnvRedis + "=" + chaosRedisAddr(), chaosEnvStream + "=" + stream,
		chaosEnvKeyOrdering + "=1", chaosEnvMaxAttempts + "=" + strconv.Itoa(poisonMaxAttempts),
		chaosEnvRetryBase + "=100ms", chaosEnvBatch + "=4", chaosEnvPoll + "=50ms",
		chaosEnvLease + "=2s", chaosEnvPublishTimeout + "=500ms",
		chaosEnvPoisonID + "=" + poisonID, chaosEnvPoisonGate + "=" + gate,
	}
	start := time.Now()
	relays := make([]*chaosProc, poisonRelays)
	for i := range relays {
		relays[i] = chaosStart(t, "relay", env, nil)
	}
	for _, r := range relays {
		if err := r.waitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}

	// Every other key flows while the poison event fails, until it is dead.
	others := len(rows) - poisonSteps + poisonStep - 1 // the poison key's events before the poison one count too
	var poison outboxplugin.OutboxEvent
	err := chaosWaitFor(30*time.Second, 20*time.Millisecond, "poison event dead and every other event delivered", func() (bool, error) {
		for _, r := range relays {
			if msg := r.unexpectedExit(); msg != "" {
				return false, errors.New(msg)
			}
		}
		if err := db.Table(poisonOutbox).Where("message_id = ?", poisonID).Take(&poison).Error; err != nil {
			return false, err
		}
		return poison.DeadAt != nil && ledger.distinct() >= others, nil
	})
	if err != nil {
		t.Fatalf("%v: %d of %d delivered, poison event %+v", err, ledger.distinct(), others, poison)
	}
	deadAfter := time.Since(start)
	time.Sleep(time.Second) // the relays keep polling: nothing more of the poison key may go out
	count, order := ledger.snapshot()
	held := byKey[poisoned][poisonStep:]
	for key, ids := range byKey {
		want := ids
		if key == poisoned {
			want = ids[:poisonStep-1]
		}
		if got := poisonKeyOrder(order, key); !slices.Equal(got, want) {
			t.Errorf("%s before the requeue: delivered %v, want %v (in commit order, once each)", key, got, want)
		}
	}
	if len(count) != others {
		t.Errorf("%d messages delivered before the requeue, want %d", len(count), others)
	}
	lastError := "<none>"
	if poison.LastError != nil {
		lastError = *poison.LastError
	}
	if poison.Attempts != poisonMaxAttempts || !strings.Contains(lastError, errChaosPoison.Error()) {
		t.Errorf("poison event dead after %d attempts with error %q; want %d attempts and %q",
			poison.Attempts, lastError, poisonMaxAttempts, errChaosPoison)
	}
	var heldRows []outboxplugin.OutboxEvent
	if err := db.Table(poisonOutbox).Where("message_id IN ?", held).Find(&heldRows).Error; err != nil {
		t.Fatal(err)
	}
	for _, r := range heldRows {
		if r.Processed || r.Attempts != 0 || r.DeadAt != nil {
			t.Errorf("held-back event %s of %s: processed=%v attempts=%d dead=%v; want untouched behind the dead poison event",
				r.MessageID, poisoned, r.Processed, r.Attempts, r.DeadAt != nil)
		}
	}

	// The gate opens, the poison event is requeued, and its key drains in order.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	admin, err := outboxplugin.NewWorker(db, outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error {
		return errors.New("the test's worker only requeues")
	}), outboxplugin.WithTable(poisonOutbox))
	if err != nil {
		t.Fatal(err)
	}
	requeuedAt := time.Now()
	n, err := admin.RequeueDead(ctx, poisonID)
	if err != nil || n != 1 {
		t.Fatalf("RequeueDead(%s) = %d, %v; want 1, nil", poisonID, n, err)
	}
	err = chaosWaitFor(30*time.Second, 20*time.Millisecond, "the poison key drained after the requeue", func() (bool, error) {
		return ledger.distinct() == len(rows), nil
	})
	drain := time.Since(requeuedAt)
	if err != nil {
		t.Errorf("%v: %d of %d delivered", err, ledger.distinct(), len(rows))
	}
	chaosWindDown(ctx, t, relays, rdb, stream, ledger)
	stopConsumer()
	consumerDone()
	count, order = ledger.snapshot()
	if got := poisonKeyOrder(order, poisoned); !slices.Equal(got, byKey[poisoned]) {
		t.Errorf("%s after the requeue: delivered %v, want %v (in commit order, once each)", poisoned, got, byKey[poisoned])
	}
	var unfinished int64
	if err := db.Table(poisonOutbox).Where("processed = ? OR dead_at IS NOT NULL OR locked_by <> ?", false, outboxplugin.NoLeaseOwner).Count(&unfinished).Error; err != nil {
		t.Fatal(err)
	}
	if unfinished != 0 {
		t.Errorf("%d events not processed, dead or leased after the drain", unfinished)
	}
	duplicates := len(order) - len(count)
	if duplicates != 0 {
		t.Errorf("%d duplicates with no relay killed", duplicates)
	}
	if t.Failed() {
		for i, r := range relays {
			t.Logf("relay %d (%s) stderr:\n%s", i, r.ownerID(), r.stderr)
		}
	}
	t.Logf("FIGURES poison/%s relays=%d keys=%d events=%d max_attempts=%d poison_attempts=%d dead_after=%v "+
		"delivered_while_poisoned=%d held_back=%d requeued=%d drain_after_requeue=%v duplicates=%d",
		dialect, poisonRelays, poisonKeys, len(rows), poisonMaxAttempts, poison.Attempts, deadAfter.Round(time.Millisecond),
		others, len(held), n, drain.Round(time.Millisecond), duplicates)
	if !t.Failed() {
		if err := db.Migrator().DropTable(poisonOutbox); err != nil {
			t.Error(err)
		}
	}
}

// poisonKeyOrder returns the message ids of key in the order the stream holds them.
func poisonKeyOrder(order []chaosEntry, key string) []string {
	var ids []string
	for _, e := range order {
		if e.key == key {
			ids = append(ids, e.id)
		}
	}
	return ids
}
