package outboxplugin_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// Reminder delays its own events: each is due at the reminder's DueAt.
type Reminder struct {
	ID    int64
	DueAt time.Time
}

func (r *Reminder) CustomizeOutboxEvent(_ *outboxplugin.Changeset, e *outboxplugin.Event) error {
	e.DeliverAt = r.DueAt
	return nil
}

// makeDue moves the delayed events of the message ids into the past, as time passing would.
func makeDue(t *testing.T, db *gorm.DB, ids ...string) {
	t.Helper()
	require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("message_id IN ?", ids).
		Update("next_attempt_at", time.Now().UTC().Add(-time.Second)).Error)
}

func publishedIDs(rec *recorder) map[string]bool {
	out := map[string]bool{}
	for _, m := range rec.published() {
		out[m.ID] = true
	}
	return out
}

// A delayed event (DeliverAfter, DeliverAt, or a captured event's Event.DeliverAt) is stored with its
// time as next_attempt_at, is not published before it, and is published once it has come; one whose
// time is not in the future is published at once. Events of one transaction keep their order of
// writing whatever their delays.
func TestDelayedEvents(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		resetTables(t, db, &Reminder{})
		ctx := context.Background()
		at := time.Now().UTC().Add(2 * time.Hour).Truncate(time.Microsecond)
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			for _, e := range []struct {
				typ string
				opt outboxplugin.EmitOption
			}{
				{"Later", outboxplugin.DeliverAfter(time.Hour)},
				{"Now", nil},
				{"AtTime", outboxplugin.DeliverAt(at)},
				{"Past", outboxplugin.DeliverAt(time.Now().Add(-time.Hour))},
				{"Zero", outboxplugin.DeliverAfter(0)},
			} {
				if err := outboxplugin.Emit(tx, e.typ, map[string]string{"t": e.typ}, e.opt); err != nil {
					return err
				}
			}
			return tx.Create(&Reminder{DueAt: at}).Error
		}))
		evs := loadEvents(t, db)
		require.Len(t, evs, 6)
		var order []string
		byType := map[string]outboxplugin.OutboxEvent{}
		for _, e := range evs {
			order = append(order, e.EventType)
			byType[e.EventType] = e
		}
		assert.Equal(t, []string{"Later", "Now", "AtTime", "Past", "Zero", "Reminder_create"}, order, "ids in the order of writing")
		require.NotNil(t, byType["Later"].NextAttemptAt)
		assert.WithinDuration(t, time.Now().Add(time.Hour), *byType["Later"].NextAttemptAt, time.Minute)
		for _, typ := range []string{"AtTime", "Reminder_create"} {
			require.NotNil(t, byType[typ].NextAttemptAt, typ)
			assert.True(t, at.Equal(byType[typ].NextAttemptAt.UTC()), "%s: stored %v, want %v", typ, byType[typ].NextAttemptAt, at)
		}
		for _, typ := range []string{"Now", "Past", "Zero"} {
			assert.Nil(t, byType[typ].NextAttemptAt, "%s is due at once", typ)
		}

		rec := newRecorder()
		w := newWorker(t, db, rec)
		_, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		got := publishedIDs(rec)
		assert.Equal(t, map[string]bool{byType["Now"].MessageID: true, byType["Past"].MessageID: true, byType["Zero"].MessageID: true}, got,
			"only the events due now")
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Zero(t, n, "the delayed ones wait")

		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		e, err := admin.Event(ctx, byType["AtTime"].MessageID)
		require.NoError(t, err)
		assert.Equal(t, outboxplugin.StateScheduled, e.State, "a delayed event before its time is scheduled, not waiting")
		assert.Zero(t, e.Attempts, "never attempted")

		makeDue(t, db, byType["Later"].MessageID, byType["AtTime"].MessageID, byType["Reminder_create"].MessageID)
		n, err = w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 3, n, "published once their time has come")
		assert.Equal(t, 6, rec.distinct())
		assert.Len(t, rec.published(), 6, "each once")
	})
}

// Per-key ordering with delays: with WithKeyOrdering a delayed event holds back the later events of
// its key until it is published, and other keys go on; without it, the later events of the key are
// published before it.
func TestDelayedEventsAndKeyOrdering(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		for _, ordered := range []bool{true, false} {
			name := "without key ordering"
			if ordered {
				name = "with key ordering"
			}
			t.Run(name, func(t *testing.T) {
				db := setup(t, d, nil)
				require.NoError(t, outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()))
				ctx := context.Background()
				emit := func(typ, key string, opts ...outboxplugin.EmitOption) string {
					require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
						return outboxplugin.Emit(tx, typ, map[string]int{"n": 1}, append(opts, outboxplugin.WithAggregate("Order", key))...)
					}))
					evs := loadEvents(t, db)
					return evs[len(evs)-1].MessageID
				}
				first := emit("Placed", "1", outboxplugin.DeliverAfter(time.Hour))
				second := emit("Paid", "1")
				other := emit("Placed", "2")
				rec := newRecorder()
				var opts []outboxplugin.WorkerOption
				if ordered {
					opts = append(opts, outboxplugin.WithKeyOrdering())
				}
				w := newWorker(t, db, rec, opts...)
				_, err := w.ProcessOnce(ctx)
				require.NoError(t, err)
				if ordered {
					assert.Equal(t, map[string]bool{other: true}, publishedIDs(rec), "the key waits behind its delayed event; the other key goes on")
				} else {
					assert.Equal(t, map[string]bool{second: true, other: true}, publishedIDs(rec))
				}
				makeDue(t, db, first)
				for range 3 {
					_, err = w.ProcessOnce(ctx)
					require.NoError(t, err)
				}
				msgs := rec.published()
				require.Len(t, msgs, 3)
				if ordered {
					assert.Equal(t, []string{other, first, second}, []string{msgs[0].ID, msgs[1].ID, msgs[2].ID}, "the key in order of writing")
				} else {
					assert.Equal(t, first, msgs[2].ID)
				}
			})
		}
	})
}
