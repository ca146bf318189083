package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
	"github.com/gorm-outbox/outboxplugin/internal/testdb"
)

// The store's conformance suite: the same cases, through the store's own API, on SQLite, PostgreSQL and
// MariaDB, each in a database of its own with the table outboxplugin.AutoMigrate makes. The root
// package's black-box suites test the relay built on it; these pin what each statement does to the
// rows, whatever the database.

var prefix = testdb.Prefix("store")

func TestMain(m *testing.M) { testdb.Main(m, prefix) }

const table = outboxplugin.DefaultTableName

// fixture is one database's outbox table and a store on it.
type fixture struct {
	db    *gorm.DB
	sqlDB *sql.DB
	name  string
	// partitioned: the table is partitioned (WithPartitions).
	partitioned bool
	ids         map[string]int64 // row id by message id
}

// forEachDB runs fn on each database with an empty outbox table.
//
// On PostgreSQL and MariaDB each case also runs on a table partitioned by hour (WithPartitions):
// the hour of the test's start and the next two have partitions, and anything older lands in the
// default partition, so that a case's rows lie in several partitions.
func forEachDB(t *testing.T, fn func(t *testing.T, f *fixture)) {
	for _, tg := range testdb.Databases() {
		for _, partitioned := range []bool{false, true} {
			name := tg.Name
			var opts []outboxplugin.MigrateOption
			if partitioned {
				if tg.Server == nil {
					continue // SQLite has no partitions
				}
				name += "_partitioned"
				opts = append(opts, outboxplugin.WithPartitions(time.Hour))
			}
			t.Run(name, func(t *testing.T) {
				db := tg.OpenDB(t, tg.NewDatabase(t, prefix))
				require.NoError(t, outboxplugin.AutoMigrate(db, opts...))
				sqlDB, err := db.DB()
				require.NoError(t, err)
				fn(t, &fixture{db: db, sqlDB: sqlDB, name: tg.Name, partitioned: partitioned, ids: map[string]int64{}})
			})
		}
	}
}

// newStore is a store on f's table: batches of batch, a history of 5, leases of a minute.
func (f *fixture) newStore(t *testing.T, batch int) *store.Store {
	t.Helper()
	s, err := store.New(f.db, table, false, batch, 5, time.Minute)
	require.NoError(t, err)
	t.Cleanup(s.ReleaseConn)
	return s
}

// insert writes events m<first>..m<first+n-1>, one microsecond apart in creation order, created at
// base plus their number, each of aggregate Order:<number>.
func (f *fixture) insert(t *testing.T, first, n int, base time.Time) {
	t.Helper()
	for i := first; i < first+n; i++ {
		id := fmt.Sprintf("m%d", i)
		require.NoError(t, f.db.Exec(`INSERT INTO `+table+` (message_id, event_type, aggregate_type, aggregate_id, payload, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			id, "OrderPlaced", "Order", fmt.Sprint(i), fmt.Sprintf(`{"n":%d}`, i), base.Add(time.Duration(i)*time.Microsecond)).Error)
		var row struct{ ID int64 }
		require.NoError(t, f.db.Raw(`SELECT id FROM `+table+` WHERE message_id = ?`, id).Scan(&row).Error)
		f.ids[id] = row.ID
	}
}

// row is an outbox row as the tests read it back.
type row struct {
	MessageID     string
	Processed     bool
	Attempts      int
	NextAttemptAt *time.Time
	LastError     *string
	DeadAt        *time.Time
	LockedBy      *string
	LockedUntil   *time.Time
	History       *string
}

// history is the row's attempt history, decoded.
func (r row) history(t *testing.T) []map[string]any {
	t.Helper()
	if r.History == nil {
		return nil
	}
	var out []map[string]any
	require.NoError(t, json.Unmarshal([]byte(*r.History), &out), *r.History)
	return out
}

func (f *fixture) row(t *testing.T, messageID string) row {
	t.Helper()
	var r row
	require.NoError(t, f.db.Raw(`SELECT message_id, processed, attempts, next_attempt_at, last_error, dead_at, locked_by, locked_until, `+
		`attempt_history AS history FROM `+table+` WHERE message_id = ?`, messageID).Scan(&r).Error)
	return r
}

// owner is the row's lease owner, "" when none (NULL, or MySQL's placeholder).
func (r row) owner() string {
	if r.LockedBy == nil || *r.LockedBy == store.NoLeaseOwner {
		return ""
	}
	return *r.LockedBy
}

func messageIDs(rows []store.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Msg.ID
	}
	return out
}

// entry is a history entry a failure appends.
type entry string

func (e entry) Entry(worker string) string {
	return fmt.Sprintf(`{"at":"2026-12-03T18:00:00Z","attempt":1,"worker":%q,"error":%q}`, worker, string(e))
}

// A claim takes the fresh rows in creation order, up to the batch, and leases them to its owner with
// one more attempt; another owner's claim skips them while the lease lasts and takes the rest.
func TestClaimLeasesFreshRowsInOrder(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		base := time.Now().UTC().Add(-time.Minute)
		f.insert(t, 1, 5, base)
		s := f.newStore(t, 3)
		rows, marked, err := s.Claim(ctx, "owner-a", time.Now(), nil, false)
		require.NoError(t, err)
		assert.Zero(t, marked)
		require.Equal(t, []string{"m1", "m2", "m3"}, messageIDs(rows))
		for i, r := range rows {
			assert.Equal(t, f.ids[r.Msg.ID], r.ID)
			assert.Equal(t, 1, r.Msg.Attempt)
			assert.Equal(t, fmt.Sprintf("Order:%d", i+1), r.Msg.Key)
			assert.Equal(t, "OrderPlaced", r.Msg.EventType)
			assert.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i+1), string(r.Msg.Payload))
			assert.WithinDuration(t, base.Add(time.Duration(i+1)*time.Microsecond), r.Msg.CreatedAt, time.Microsecond)
			assert.False(t, r.Unfinished)
			assert.NoError(t, r.Undecodable)
			got := f.row(t, r.Msg.ID)
			assert.Equal(t, "owner-a", got.owner())
			assert.Equal(t, 1, got.Attempts)
			require.NotNil(t, got.LockedUntil)
			assert.True(t, got.LockedUntil.After(time.Now().Add(30*time.Second)), "leased for the lease: %v", got.LockedUntil)
		}
		other := f.newStore(t, 3)
		rows, _, err = other.Claim(ctx, "owner-b", time.Now(), nil, false)
		require.NoError(t, err)
		assert.Equal(t, []string{"m4", "m5"}, messageIDs(rows))
		rows, _, err = other.Claim(ctx, "owner-c", time.Now(), nil, false)
		require.NoError(t, err)
		assert.Empty(t, rows, "every row is leased")
	})
}

// A published batch is marked by the next claim, which says how many of its rows it marked; a mark
// by another owner marks nothing.
func TestClaimCarriesTheMarkOfThePreviousBatch(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		f.insert(t, 1, 4, time.Now().UTC().Add(-time.Minute))
		s := f.newStore(t, 2)
		first, _, err := s.Claim(ctx, "owner-a", time.Now(), nil, false)
		require.NoError(t, err)
		require.Len(t, first, 2)
		done := store.Done{IDs: store.RowIDs(first), Ctids: store.RowCtids(first), Now: time.Now()}
		n, err := s.MarkDone(ctx, f.sqlDB, "owner-b", done, false)
		require.NoError(t, err)
		assert.Zero(t, n, "not the owner's rows")
		second, marked, err := s.Claim(ctx, "owner-a", time.Now(), &done, false)
		require.NoError(t, err)
		assert.EqualValues(t, 2, marked)
		assert.Equal(t, []string{"m3", "m4"}, messageIDs(second))
		for _, id := range []string{"m1", "m2"} {
			r := f.row(t, id)
			assert.True(t, r.Processed, id)
			assert.Empty(t, r.owner(), id)
			assert.Nil(t, r.NextAttemptAt, id)
		}
		n, err = s.MarkDone(ctx, f.sqlDB, "owner-a", store.Done{IDs: store.RowIDs(second), Ctids: store.RowCtids(second), Now: time.Now()}, true)
		require.NoError(t, err)
		assert.EqualValues(t, 2, n)
		var left int64
		require.NoError(t, f.db.Raw(`SELECT COUNT(*) FROM `+table).Scan(&left).Error)
		assert.EqualValues(t, 2, left, "deleted on publish")
	})
}

// The failure statements: a retry waits for its time with its error and history entry, a dead row is
// never claimed again, a released row is fresh again with its attempt given back, and a buried row is
// dead with its attempt given back and no history entry.
func TestFailuresAndHandBacks(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		f.insert(t, 1, 4, time.Now().UTC().Add(-time.Minute))
		s := f.newStore(t, 4)
		rows, _, err := s.Claim(ctx, "owner-a", time.Now(), nil, false)
		require.NoError(t, err)
		require.Len(t, rows, 4)
		id := func(i int) []int64 { return []int64{rows[i].ID} }
		require.NoError(t, s.MarkRetry(ctx, f.sqlDB, "owner-a", id(0), "refused", time.Now(), time.Hour, entry("refused")))
		require.NoError(t, s.MarkDead(ctx, f.sqlDB, "owner-a", id(1), "poison", time.Now(), entry("poison")))
		require.NoError(t, s.Release(ctx, f.sqlDB, "owner-a", id(2), ""))
		require.NoError(t, s.Bury(ctx, f.sqlDB, "owner-a", id(3), "undecodable", time.Now()))

		retried := f.row(t, "m1")
		assert.Equal(t, "refused", *retried.LastError)
		require.NotNil(t, retried.NextAttemptAt)
		assert.True(t, retried.NextAttemptAt.After(time.Now().Add(50*time.Minute)), "an hour from the database's now: %v", retried.NextAttemptAt)
		require.Len(t, retried.history(t), 1)
		assert.Equal(t, "owner-a", retried.history(t)[0]["worker"])
		assert.Empty(t, retried.owner())
		assert.Equal(t, 1, retried.Attempts)

		dead := f.row(t, "m2")
		assert.NotNil(t, dead.DeadAt)
		require.Len(t, dead.history(t), 1)
		assert.Equal(t, "poison", dead.history(t)[0]["error"])
		assert.Equal(t, 1, dead.Attempts)

		released := f.row(t, "m3")
		assert.Zero(t, released.Attempts, "the attempt is given back")
		assert.Empty(t, released.owner())
		assert.Nil(t, released.LastError)

		buried := f.row(t, "m4")
		assert.NotNil(t, buried.DeadAt)
		assert.Zero(t, buried.Attempts)
		assert.Empty(t, buried.history(t))

		again, _, err := s.Claim(ctx, "owner-b", time.Now(), nil, false)
		require.NoError(t, err)
		assert.Equal(t, []string{"m3"}, messageIDs(again), "neither the waiting retry nor the dead rows")
		assert.Equal(t, 1, again[0].Msg.Attempt)

		n, err := s.Requeue(ctx, []string{"m2"})
		require.NoError(t, err)
		assert.EqualValues(t, 1, n)
		requeued := f.row(t, "m2")
		assert.Nil(t, requeued.DeadAt)
		assert.Zero(t, requeued.Attempts)
		assert.Equal(t, dead.history(t), requeued.history(t), "the history stays")
		n, err = s.Requeue(ctx, nil)
		require.NoError(t, err)
		assert.EqualValues(t, 1, n, "the buried row, the last dead one")
	})
}

// A row whose lease ran out is taken over by the next claim as a delivery that did not finish: marked
// so, its attempt counted again, and its history given an entry naming the owner that lost it. Rows
// that never had a lease (NULL, or MySQL's placeholders) are not.
func TestExpiredLeaseIsAnUnfinishedDelivery(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		f.insert(t, 1, 3, time.Now().UTC().Add(-time.Minute))
		require.NoError(t, f.db.Exec(`UPDATE `+table+` SET locked_by = NULL, locked_until = NULL WHERE message_id = ?`, "m3").Error)
		s := f.newStore(t, 1)
		rows, _, err := s.Claim(ctx, "owner-a", time.Now(), nil, false)
		require.NoError(t, err)
		require.Equal(t, []string{"m1"}, messageIDs(rows))
		require.NoError(t, f.db.Exec(`UPDATE `+table+` SET locked_until = ? WHERE message_id = ?`, time.Now().UTC().Add(-time.Hour), "m1").Error)

		s3 := f.newStore(t, 3)
		rows, _, err = s3.Claim(ctx, "owner-b", time.Now(), nil, false)
		require.NoError(t, err)
		require.Equal(t, []string{"m1", "m2", "m3"}, messageIDs(rows))
		assert.True(t, rows[0].Unfinished)
		assert.Equal(t, 2, rows[0].Msg.Attempt)
		assert.False(t, rows[1].Unfinished, "a fresh row with the table's defaults")
		assert.False(t, rows[2].Unfinished, "a fresh row with NULL lease columns")
		taken := f.row(t, "m1")
		assert.Equal(t, "owner-b", taken.owner())
		h := taken.history(t)
		require.Len(t, h, 1)
		assert.Equal(t, "owner-a", h[0]["worker"])
		assert.Equal(t, store.UnfinishedDelivery, h[0]["error"])
		assert.Equal(t, store.UnfinishedDelivery, *taken.LastError)
		assert.Empty(t, f.row(t, "m2").history(t))
		assert.Empty(t, f.row(t, "m3").history(t))
	})
}

// A renewal extends the leases of the owner's rows only, and says how many.
func TestRenewExtendsTheOwnersLeases(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		f.insert(t, 1, 2, time.Now().UTC().Add(-time.Minute))
		s := f.newStore(t, 2)
		rows, _, err := s.Claim(ctx, "owner-a", time.Now(), nil, false)
		require.NoError(t, err)
		require.NoError(t, f.db.Exec(`UPDATE `+table+` SET locked_until = ?`, time.Now().UTC().Add(time.Second)).Error)
		_, n, err := s.Renew(ctx, "owner-b", store.RowIDs(rows), time.Now())
		require.NoError(t, err)
		assert.Zero(t, n)
		moved, n, err := s.Renew(ctx, "owner-a", store.RowIDs(rows), time.Now())
		require.NoError(t, err)
		assert.EqualValues(t, 2, n)
		if f.name == "postgres" {
			assert.Len(t, moved, 2, "where each row is now")
		}
		for _, id := range []string{"m1", "m2"} {
			assert.True(t, f.row(t, id).LockedUntil.After(time.Now().Add(30*time.Second)), id)
		}
	})
}

// Cleanup deletes processed rows created before the cutoff, a chunk at a time, and nothing else.
func TestCleanupChunkDeletesOldProcessedRows(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		old := time.Now().UTC().Add(-48 * time.Hour)
		f.insert(t, 1, 4, old)              // m1..m3 processed below, m4 stays pending
		f.insert(t, 5, 1, time.Now().UTC()) // processed, but recent
		require.NoError(t, f.db.Exec(`UPDATE `+table+` SET processed = true, processed_at = created_at WHERE message_id IN ?`,
			[]string{"m1", "m2", "m3", "m5"}).Error)
		s := f.newStore(t, 10)
		cutoff := time.Now().UTC().Add(-24 * time.Hour)
		var chunks []int64
		for range 4 {
			n, err := s.CleanupChunk(ctx, f.sqlDB, cutoff, 2)
			require.NoError(t, err)
			chunks = append(chunks, n)
		}
		assert.Equal(t, []int64{2, 1, 0, 0}, chunks)
		var left []string
		require.NoError(t, f.db.Raw(`SELECT message_id FROM `+table+` ORDER BY id`).Scan(&left).Error)
		assert.Equal(t, []string{"m4", "m5"}, left)
	})
}

// A chunk under the cleanup lock deletes nothing while another holds the lock, and deletes once it is
// free; the lock lasts no longer than the chunk: afterwards the database holds no advisory lock
// (PostgreSQL: transaction-scoped, which a transaction pooler keeps with the transaction), so that
// another connection — another relay — takes it at once.
func TestCleanupChunkLockedTakesTurns(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		f.insert(t, 1, 3, time.Now().UTC().Add(-48*time.Hour))
		require.NoError(t, f.db.Exec(`UPDATE `+table+` SET processed = true, processed_at = created_at`).Error)
		s := f.newStore(t, 10)
		cutoff := time.Now().UTC().Add(-24 * time.Hour)
		conn := func() *sql.Conn {
			c, err := f.sqlDB.Conn(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		holder, cleaner := conn(), conn()

		release, got, err := s.TryCleanupLock(ctx, holder)
		require.NoError(t, err)
		require.True(t, got)
		if f.name == "postgres" {
			var states []string
			require.NoError(t, f.db.Raw(`SELECT a.state FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'`+
				` AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&states).Error)
			assert.Equal(t, []string{"idle in transaction"}, states, "the lock is the holder's transaction's")
		}
		if f.name != "sqlite" { // SQLite serialises writers anyway: no lock
			n, got, err := s.CleanupChunkLocked(ctx, cleaner, cutoff, 2)
			require.NoError(t, err)
			assert.False(t, got, "another holds the lock")
			assert.Zero(t, n)
		}
		release()

		var chunks []int64
		for range 2 {
			n, got, err := s.CleanupChunkLocked(ctx, cleaner, cutoff, 2)
			require.NoError(t, err)
			require.True(t, got)
			chunks = append(chunks, n)
		}
		assert.Equal(t, []int64{2, 1}, chunks)
		if f.name == "postgres" {
			var locks int
			require.NoError(t, f.db.Raw(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).
				Scan(&locks).Error)
			assert.Zero(t, locks, "no advisory lock outlives its chunk")
		}
		release, got, err = s.TryCleanupLock(ctx, holder)
		require.NoError(t, err)
		assert.True(t, got, "free again for another connection")
		if got {
			release()
		}
	})
}
