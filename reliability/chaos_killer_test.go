package reliability

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
)

// The killer scenario's settings: a short lease so that each crash costs a second, and few attempts.
const (
	killerOutbox      = "killer_outbox"
	killerEvents      = 30
	killerIndex       = 4 // the killer event is the fifth
	killerRelays      = 2
	killerMaxAttempts = 3
)

// TestChaosProcessKillingEvent is an event whose publish kills the relay process (SIGKILL, as an
// out-of-memory kill or a crash in a cgo client would), on PostgreSQL, MariaDB and SQLite. Relay
// processes that die are restarted. The test checks that the event dies after its maximum of
// deliveries that never finished — it is not claimed again for ever, taking its batch-mates down after
// every lease — with the reason as its last error; and that every other event is delivered.
func TestChaosProcessKillingEvent(t *testing.T) {
	for _, dialect := range chaosDialects {
		t.Run(dialect, func(t *testing.T) { killerScenario(t, dialect) })
	}
}

func killerScenario(t *testing.T, dialect string) {
	d := chaosDialectFor(t, dialect)
	stream := chaosName("killer", dialect)
	rdb := chaosRedis(t, stream)
	db := chaosOpen(t, d, killerOutbox)
	if err := db.Migrator().DropTable(killerOutbox); err != nil {
		t.Fatal(err)
	}
	if err := outboxplugin.AutoMigrate(db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Migrator().DropTable(killerOutbox); err != nil {
			t.Errorf("drop table: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 0; i < killerEvents; i++ {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Killer_step", map[string]int{"i": i}, outboxplugin.WithAggregate("Killer", strconv.Itoa(i)))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var rows []outboxplugin.OutboxEvent
	if err := db.Table(killerOutbox).Order("id").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	killerID := rows[killerIndex].MessageID

	consumeCtx, stopConsumer := context.WithCancel(ctx)
	ledger, consumerDone := chaosConsume(consumeCtx, rdb, stream)
	defer func() { stopConsumer(); consumerDone() }()

	env := []string{
		chaosEnvDialect + "=" + d.name, chaosEnvDSN + "=" + d.dsn, chaosEnvTable + "=" + killerOutbox,
		chaosEnvDeadline + "=" + strconv.FormatInt(time.Now().Add(2*time.Minute).UnixMilli(), 10),
		chaosEnvRedis + "=" + chaosRedisAddr(), chaosEnvStream + "=" + stream,
		chaosEnvMaxAttempts + "=" + strconv.Itoa(killerMaxAttempts), chaosEnvBatch + "=10", chaosEnvPoll + "=50ms",
		chaosEnvLease + "=" + outboxplugin.MinLease.String(), chaosEnvKillerID + "=" + killerID,
	}
	relays := make([]*chaosProc, killerRelays)
	crashes := 0
	for i := range relays {
		relays[i] = chaosStart(t, "relay", env, nil)
	}
	var killer outboxplugin.OutboxEvent
	err := chaosWaitFor(90*time.Second, 20*time.Millisecond, "the killer event dead and every other event delivered", func() (bool, error) {
		for i, r := range relays {
			if r.exited() {
				crashes++
				if crashes > 3*killerMaxAttempts {
					return false, errors.New("the relays keep dying: the killer event is claimed again and again")
				}
				relays[i] = chaosStart(t, "relay", env, nil)
			}
		}
		if err := db.Table(killerOutbox).Where("message_id = ?", killerID).Take(&killer).Error; err != nil {
			return false, err
		}
		return killer.DeadAt != nil && ledger.distinct() >= killerEvents-1, nil
	})
	if err != nil {
		t.Fatalf("%v: %d of %d delivered after %d crashes, killer event %+v", err, ledger.distinct(), killerEvents-1, crashes, killer)
	}
	if crashes < killerMaxAttempts {
		t.Errorf("%d crashes, want at least %d: each delivery of the killer event kills a relay", crashes, killerMaxAttempts)
	}
	if killer.Attempts != killerMaxAttempts {
		t.Errorf("killer event: %d attempts, want %d (the claim that gave up delivers nothing)", killer.Attempts, killerMaxAttempts)
	}
	if killer.LastError == nil || !strings.Contains(*killer.LastError, "deliveries that did not finish") {
		t.Errorf("killer event: last error %v, want the reason it was given up", killer.LastError)
	}
	count, _ := ledger.snapshot()
	if count[killerID] != 0 {
		t.Errorf("the killer event was delivered %d times", count[killerID])
	}
	for i, r := range rows {
		if i != killerIndex && count[r.MessageID] == 0 {
			t.Errorf("event %d (%s) not delivered", i, r.MessageID)
		}
	}
	chaosWindDown(ctx, t, relays, rdb, stream, ledger)
	t.Logf("FIGURES killer/%s crashes=%d attempts=%d delivered=%d", dialect, crashes, killer.Attempts, ledger.distinct())
}
