package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// On a partitioned MariaDB table the statements that address rows by id (the claim's locks and
// stamp, the mark) name the span of the rows' created_at, so that InnoDB looks each id up in the
// partition that holds it, not in every partition's primary key (id, created_at). Counted with the
// server's own counter of index lookups on the one connection of the store's pool: a claim and a
// mark of a batch of n rows in one partition look up about n keys, where looking in every
// partition takes as many times more as there are partitions (measured: 107 lookups for 100 rows in
// one of 4 partitions; 407 with the span left out).
func TestMySQLPartitionedStatementsReadOnePartition(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *fixture) {
		if f.name == "sqlite" || f.name == "postgres" || !f.partitioned {
			t.Skip("MySQL and MariaDB on a partitioned table: PostgreSQL addresses rows by ctid, per partition")
		}
		ctx := context.Background()
		// The fixture's partitions are hourly, from the hour of its start, and the MAXVALUE one: rows
		// in the hour after, and in the one after that, fill two more partitions besides the batch's.
		start := time.Now().UTC()
		const n = 100
		f.insert(t, 1, n, start.Add(-time.Minute))
		f.insert(t, n+1, n, start.Add(time.Hour).Truncate(time.Hour).Add(time.Minute))
		f.insert(t, 2*n+1, n, start.Add(2*time.Hour).Truncate(time.Hour).Add(time.Minute))
		var parts int
		require.NoError(t, f.db.Raw(`SELECT COUNT(*) FROM information_schema.partitions WHERE table_schema = DATABASE() AND table_name = ? AND partition_name IS NOT NULL`, table).Scan(&parts).Error)
		require.GreaterOrEqual(t, parts, 4)

		// One connection: the store's statements and SHOW SESSION STATUS share its counters.
		f.sqlDB.SetMaxOpenConns(1)
		lookups := func() int64 {
			var name string
			var v int64
			require.NoError(t, f.sqlDB.QueryRowContext(ctx, `SHOW SESSION STATUS LIKE 'Handler_read_key'`).Scan(&name, &v))
			return v
		}
		s := f.newStore(t, n)
		_, _, err := s.Claim(ctx, "warm-up", time.Now(), nil, false) // the time probe, the engine check
		require.NoError(t, err)
		_, err = f.sqlDB.ExecContext(ctx, `UPDATE `+table+` SET locked_by = NULL, locked_until = NULL, attempts = 0`)
		require.NoError(t, err)

		before := lookups()
		rows, _, err := s.Claim(ctx, "owner", time.Now(), nil, false)
		require.NoError(t, err)
		require.Len(t, rows, n)
		from, to := store.RowSpan(rows)
		require.Equal(t, from.Truncate(time.Hour), to.Truncate(time.Hour), "a batch of one partition")
		marked, err := s.MarkDone(ctx, f.sqlDB, "owner", store.NewDone(rows, time.Now()), false)
		require.NoError(t, err)
		require.EqualValues(t, n, marked)
		used := lookups() - before - 1 // less SHOW STATUS's own
		t.Logf("index lookups for the claim and the mark of %d rows, %d partitions: %d", n, parts, used)
		// About n, and a few more for the probe's ranges; about n × parts in every partition.
		require.Less(t, used, int64(2*n), "each id is looked up in its own partition only")
	})
}
