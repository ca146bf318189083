package outboxplugin_test

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// A worker's id is always 32 bytes, the size of the placeholder a new row's locked_by holds on MySQL
// and MariaDB, whatever the host's name: a claim's stamp then rewrites the row in place.
func TestWorkerIDHasTheWidthOfTheLeasePlaceholder(t *testing.T) {
	width := len(outboxplugin.NoLeaseOwner)
	require.Equal(t, strings.Repeat(" ", 32), outboxplugin.NoLeaseOwner)
	require.Equal(t, outboxplugin.NoLeaseOwner, store.NoLeaseOwner, "the relay's statements compare with the same placeholder")
	for _, c := range []struct {
		host   string
		pid    int
		prefix string
	}{
		{"relay-1", 4242, "relay-1-4242-"},
		{"ip-10-0-1-23.ec2.internal", 7, "ip-10-0-1-23-7-"},
		// Cut to leave 8 random hex digits, keeping the end, where a pod's name differs from its
		// siblings'.
		{"orders-relay-7d9f8b6c4-x2k9z", 1, "relay-7d9f8b6c4-x2k9z-1-"},
		{"a-host-name-far-longer-than-the-whole-id-could-hold", 4194304, "e-id-could-hold-4194304-"},
		{"", 99, "worker-99-"},
		{"hôte éphémère", 12, "h__te___ph__m__re-12-"},
	} {
		a, b := outboxplugin.LeaseOwnerID(c.host, c.pid), outboxplugin.LeaseOwnerID(c.host, c.pid)
		assert.Len(t, a, width, "%q: %q", c.host, a)
		assert.True(t, strings.HasPrefix(a, c.prefix), "%q: %q starts with %q", c.host, a, c.prefix)
		assert.Regexp(t, regexp.MustCompile(`^[A-Za-z0-9_-]+-[0-9]+-[0-9a-f]{8,}$`), a)
		assert.NotEqual(t, a, b, "random")
		assert.NotEqual(t, outboxplugin.NoLeaseOwner, a)
	}
}

// On MySQL and MariaDB a row the plugin writes starts with the lease placeholders (locked_by 32
// spaces, locked_until 1970-01-01), on PostgreSQL and SQLite with NULL; either way it has no lease:
// the model, the Admin and the relay read it as such. A claim stamps the worker's id, of the same
// size, and a fresh row claimed is no delivery that did not finish (no error, no history).
func TestNewRowsHaveNoLease(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		ctx := context.Background()
		require.NoError(t, db.Create(&[]User{{Name: "a"}, {Name: "b"}}).Error)
		plain := db.Session(&gorm.Session{NewDB: true})
		type lease struct {
			ID          int64
			LockedBy    *string
			LockedUntil *time.Time
		}
		leases := func() []lease {
			var out []lease
			require.NoError(t, plain.Table(outboxplugin.DefaultTableName).Select("id, locked_by, locked_until").Order("id").Scan(&out).Error)
			return out
		}
		for _, l := range leases() {
			if d.server() == "mysql" {
				require.NotNil(t, l.LockedBy)
				assert.Equal(t, outboxplugin.NoLeaseOwner, *l.LockedBy)
				require.NotNil(t, l.LockedUntil)
				assert.Equal(t, 1970, l.LockedUntil.Year())
			} else {
				assert.Nil(t, l.LockedBy)
				assert.Nil(t, l.LockedUntil)
			}
		}
		for _, e := range loadEvents(t, db) {
			assert.Empty(t, e.LeaseOwner())
		}
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		page, err := admin.ListEvents(ctx, outboxplugin.EventFilter{})
		require.NoError(t, err)
		require.Len(t, page.Events, 2)
		for _, e := range page.Events {
			assert.Empty(t, e.LockedBy)
			assert.Nil(t, e.LockedUntil)
			assert.Equal(t, outboxplugin.StateDue, e.State)
		}
		st, err := admin.Stats(ctx)
		require.NoError(t, err)
		assert.EqualValues(t, 0, st.Leased)
		assert.Empty(t, st.TableWarnings)

		var w *outboxplugin.Worker
		var seen sync.Once
		pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
			seen.Do(func() {
				assert.Len(t, msgs, 2)
				for _, l := range leases() {
					require.NotNil(t, l.LockedBy)
					assert.Equal(t, w.Owner(), *l.LockedBy, "stamped")
					assert.Len(t, *l.LockedBy, len(outboxplugin.NoLeaseOwner), "the size of the placeholder")
				}
				page, err := admin.ListEvents(ctx, outboxplugin.EventFilter{})
				require.NoError(t, err)
				for _, e := range page.Events {
					assert.Equal(t, outboxplugin.StateLeased, e.State)
					assert.Equal(t, w.Owner(), e.LockedBy)
					assert.NotNil(t, e.LockedUntil)
				}
				for _, m := range msgs {
					assert.Equal(t, 1, m.Attempt)
				}
			})
			return nil
		})
		w = newWorker(t, db, pub)
		assert.Len(t, w.Owner(), len(outboxplugin.NoLeaseOwner))
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		for _, e := range loadEvents(t, db) {
			assert.True(t, e.Processed)
			assert.Nil(t, e.LastError, "a fresh row is no delivery that did not finish")
			assert.Nil(t, e.AttemptHistory)
			assert.Empty(t, e.LeaseOwner())
		}
	})
}

// A MySQL or MariaDB table of an earlier version (lease columns without defaults) is a table warning
// until AutoMigrate gives them their defaults, a change of the catalog only. Rows written before
// (NULL), rows written after (the placeholders) and a row whose relay died holding its lease then go
// out together as they should: only the last is a delivery that did not finish, published alone and
// recorded in its history; the others go out in one batch, with no error and no history.
func TestLeaseDefaultsBesideRowsOfEarlierVersions(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() != "mysql" {
			t.Skip("the lease columns have no defaults on PostgreSQL and SQLite")
		}
		db := setup(t, d, nil)
		ctx := context.Background()
		plain := db.Session(&gorm.Session{NewDB: true})
		require.NoError(t, plain.Exec(`ALTER TABLE outbox_events ALTER COLUMN locked_by SET DEFAULT NULL, ALTER COLUMN locked_until SET DEFAULT NULL`).Error)
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		warnings, err := admin.CheckTable(ctx)
		require.NoError(t, err)
		require.Equal(t, []outboxplugin.TableWarningCode{outboxplugin.TableWarningLeaseDefaults}, codesOf(warnings))
		assert.Contains(t, warnings[0].What, "locked_by 32 spaces")
		plan, err := outboxplugin.PlanMigration(plain)
		require.NoError(t, err)
		require.Len(t, plan, 1)
		assert.Regexp(t, `^ALTER TABLE .* ALTER COLUMN locked_by SET DEFAULT '\s{32}', ALTER COLUMN locked_until SET DEFAULT '1970-01-01 00:00:00', ALGORITHM=INSTANT$`, plan[0])

		require.NoError(t, db.Create(&User{Name: "before"}).Error)
		require.NoError(t, db.Create(&User{Name: "crashed"}).Error)
		evs := loadEvents(t, db)
		before, crashed := evs[0].MessageID, evs[1].MessageID
		assert.Nil(t, evs[0].LockedBy, "written before the defaults")
		require.NoError(t, plain.Model(&outboxplugin.OutboxEvent{}).Where("message_id = ?", crashed).
			Updates(map[string]any{"locked_by": "crashed-relay-7", "locked_until": time.Now().UTC().Add(-2 * time.Second), "attempts": 1}).Error)

		require.NoError(t, outboxplugin.AutoMigrate(plain))
		warnings, err = admin.CheckTable(ctx)
		require.NoError(t, err)
		assert.Empty(t, warnings)
		plan, err = outboxplugin.PlanMigration(plain)
		require.NoError(t, err)
		assert.Empty(t, plan, "up to date")
		require.NoError(t, db.Create(&User{Name: "after"}).Error)
		after := loadEvents(t, db)[2]
		require.NotNil(t, after.LockedBy)
		assert.Equal(t, outboxplugin.NoLeaseOwner, *after.LockedBy)

		var batches [][]string
		pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
			var b []string
			for _, m := range msgs {
				b = append(b, m.ID)
			}
			batches = append(batches, b)
			return nil
		})
		w := newWorker(t, db, pub)
		total := 0
		for range 5 {
			n, err := w.ProcessOnce(ctx)
			require.NoError(t, err)
			if total += n; n == 0 {
				break
			}
		}
		require.Equal(t, 3, total)
		assert.Equal(t, [][]string{{crashed}, {before, after.MessageID}}, batches,
			"the delivery that did not finish alone, the rows without a lease together")
		h := history(t, db, crashed)
		require.Len(t, h, 1)
		assert.True(t, h[0].Unfinished())
		assert.Equal(t, "crashed-relay-7", h[0].Worker)
		for _, id := range []string{before, after.MessageID} {
			e := outboxRow(t, db, id)
			assert.True(t, e.Processed)
			assert.Nil(t, e.LastError, id)
			assert.Nil(t, e.AttemptHistory, id)
		}
	})
}
