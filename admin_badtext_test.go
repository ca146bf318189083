package outboxplugin_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gorm-outbox/outboxplugin"
)

// A filter text or message id that is not UTF-8 without NUL bytes is ErrInvalidFilter on every
// database: PostgreSQL cannot compare it with a text column and answered with an error of its own
// (a console's /events/%00 was a 500), the others matched nothing.
func TestAdminRefusesTextThatIsNotText(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		f := newAdminFixture(t, d)
		ctx := context.Background()
		for _, bad := range []string{"\x00", "a\x00b", "\xff", "\xed\xa0\x80"} {
			for name, filter := range map[string]outboxplugin.EventFilter{
				"type": {EventType: bad}, "aggregate": {AggregateType: bad, AggregateID: "1"}, "aggregate id": {AggregateType: "Invoice", AggregateID: bad},
				"message id": {MessageID: bad}, "error": {State: outboxplugin.StateDead, LastError: bad},
			} {
				_, err := f.admin.ListEvents(ctx, filter)
				assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter, "ListEvents by %s %q", name, bad)
				filter.State = ""
				_, err = f.admin.RequeueWhere(ctx, filter)
				assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter, "RequeueWhere by %s %q", name, bad)
				_, err = f.admin.DiscardWhere(ctx, filter)
				assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter, "DiscardWhere by %s %q", name, bad)
				_, err = f.admin.DeliverNowWhere(ctx, filter)
				assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter, "DeliverNowWhere by %s %q", name, bad)
			}
			_, err := f.admin.Event(ctx, bad)
			assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter, "Event %q", bad)
			for name, act := range map[string]func(context.Context, ...string) (int64, error){
				"Requeue": f.admin.Requeue, "Discard": f.admin.Discard, "DeliverNow": f.admin.DeliverNow,
			} {
				n, err := act(ctx, f.evs[2].MessageID, bad)
				assert.ErrorIs(t, err, outboxplugin.ErrInvalidFilter, "%s of %q", name, bad)
				assert.Zero(t, n, "%s of a good and a bad id: a bad id is refused before anything changes", name)
			}
		}
		// The fixture is as it was: nothing was requeued, discarded or moved.
		st, err := f.admin.Stats(ctx)
		if assert.NoError(t, err) {
			assert.Equal(t, int64(2), st.Dead)
			assert.Equal(t, int64(1), st.Waiting)
		}
	})
}
