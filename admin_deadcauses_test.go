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

// DeadCauses groups the dead events by error text alone: one cause over several event types is one
// group, and one RequeueWhere by its error requeues all of it, and nothing beside it.
func TestAdminDeadCauses(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newAdminFixture(t, d) // dead: a User create and a Billed, both "broker said no"; waiting: one, "refused"
		ctx := context.Background()
		const noStream = "outboxnats: nats: no response from stream"
		emitDead := func(eventType, text string) {
			t.Helper()
			require.NoError(t, f.db.Transaction(func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, eventType, map[string]int{"n": 1})
			}))
			evs := loadEvents(t, f.db)
			require.NoError(t, f.db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", evs[len(evs)-1].ID).
				Updates(map[string]any{"dead_at": time.Now().UTC(), "attempts": 8, "last_error": text}).Error)
		}
		for _, typ := range []string{"OrderPlaced", "OrderShipped", "InvoiceSent"} {
			emitDead(typ, noStream)
			emitDead(typ, noStream)
		}
		// A waiting event with the same error: a requeue of the dead cause leaves it to its retry.
		require.NoError(t, f.db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", f.evs[3].ID).
			Update("last_error", noStream).Error)

		causes, more, err := f.admin.DeadCauses(ctx, 0)
		require.NoError(t, err)
		assert.False(t, more)
		require.Len(t, causes, 2)
		assert.Equal(t, outboxplugin.DeadGroup{LastError: noStream, Count: 6, EventTypes: 3},
			outboxplugin.DeadGroup{EventType: causes[0].EventType, LastError: causes[0].LastError, Count: causes[0].Count, EventTypes: causes[0].EventTypes},
			"one group for the cause, the largest first")
		assert.Equal(t, outboxplugin.DeadGroup{LastError: "broker said no", Count: 2, EventTypes: 2},
			outboxplugin.DeadGroup{EventType: causes[1].EventType, LastError: causes[1].LastError, Count: causes[1].Count, EventTypes: causes[1].EventTypes})
		assert.False(t, causes[0].FirstDead.After(causes[0].LastDead))
		groups, _, err := f.admin.DeadGroups(ctx, 0)
		require.NoError(t, err)
		assert.Len(t, groups, 5, "by type and error: three groups for the one cause")
		for _, g := range groups {
			assert.Equal(t, int64(1), g.EventTypes, "a group of DeadGroups spans one type")
		}

		top, more, err := f.admin.DeadCauses(ctx, 1)
		require.NoError(t, err)
		assert.True(t, more)
		assert.Len(t, top, 1)
		for _, bad := range []int{-1, outboxplugin.MaxDeadGroups + 1} {
			_, _, err = f.admin.DeadCauses(ctx, bad)
			assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter)
		}

		cause := outboxplugin.EventFilter{State: outboxplugin.StateDead, LastError: noStream}
		page, err := f.admin.ListEvents(ctx, cause)
		require.NoError(t, err)
		assert.Len(t, page.Events, 6)
		n, err := f.admin.RequeueWhere(ctx, cause)
		require.NoError(t, err)
		assert.Equal(t, int64(6), n, "one requeue for the whole cause")
		causes, _, err = f.admin.DeadCauses(ctx, 0)
		require.NoError(t, err)
		require.Len(t, causes, 1)
		assert.Equal(t, "broker said no", causes[0].LastError, "the other cause stays dead")
		st, err := f.admin.Stats(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(2), st.Dead)
		assert.Equal(t, int64(1), st.Waiting, "the waiting event of the same error keeps its retry time")
	})
}
