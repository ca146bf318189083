package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The claim reads the claim index from its head and sorts nothing: a change that loses the plan (an
// ORDER BY the index does not serve, a predicate the partial index does not match) would have a claim
// read and sort every pending row, and fails here. On a table of every kind of row — processed, dead,
// waiting, due retries and fresh ones — analysed, as a long-running outbox is.
func TestClaimPlanReadsTheClaimIndex(t *testing.T) {
	forEachDB(t, func(t *testing.T, f *fixture) {
		if f.name == "sqlite" {
			t.Skip("SQLite's claim takes the database's write lock; its plan is not the claim's cost")
		}
		ctx := context.Background()
		const n = 4000
		series := fmt.Sprintf("generate_series(1, %d) AS s(g)", n)
		seq, past, future := "s.g", "now() - interval '1 hour'", "now() + interval '1 hour'"
		if f.name != "postgres" {
			series, seq = fmt.Sprintf("seq_1_to_%d s", n), "s.seq"
			past, future = "NOW(6) - INTERVAL 1 HOUR", "NOW(6) + INTERVAL 1 HOUR"
		}
		kinds := []struct{ name, cols, values string }{
			{"processed", "processed, processed_at", "true, " + past},
			{"dead", "dead_at, attempts", past + ", 5"},
			{"waiting", "next_attempt_at, attempts", future + ", 1"},
			{"due", "next_attempt_at, attempts", past + ", 1"},
			{"fresh", "attempts", "0"},
		}
		for _, k := range kinds {
			times := 1
			if k.name == "processed" {
				times = 5 // most of a long-running table
			}
			for range times {
				require.NoError(t, f.db.Exec(`INSERT INTO `+table+` (message_id, event_type, aggregate_type, aggregate_id, payload, created_at, `+k.cols+`) `+
					`SELECT CONCAT('`+k.name+`-', `+seq+`, '-', `+fmt.Sprint(time.Now().UnixNano())+`), 'E', 'A', CONCAT('', `+seq+`), '{}', `+past+`, `+k.values+` FROM `+series).Error)
			}
		}
		analyze := "ANALYZE " + table
		if f.name != "postgres" {
			analyze = "ANALYZE TABLE " + table
		}
		require.NoError(t, f.db.Exec(analyze).Error)

		s := f.newStore(t, 100)
		reads, err := s.ClaimReads(ctx, "planner", time.Now())
		require.NoError(t, err)
		require.NotEmpty(t, reads)
		for _, r := range reads {
			if f.name == "postgres" {
				var lines []string
				require.NoError(t, f.db.Raw("EXPLAIN "+r.SQL, r.Args...).Pluck("QUERY PLAN", &lines).Error)
				plan := strings.Join(lines, "\n")
				if f.partitioned {
					// Each partition's own claim index (named after its partition), merged in order:
					// the rows are in the default partition, the others are empty (which the planner
					// reads whole, for nothing).
					require.Regexp(t, `Index (Only )?Scan using \S+_processed_dead_at_next_attempt_at_\S+ on `+table+`_default`, plan, "the claim reads the default partition's claim index:\n%s", plan)
					require.Contains(t, plan, "Merge Append", "the partitions' runs merged in the index's order:\n%s", plan)
					require.NotRegexp(t, `->\s+(Incremental )?Sort `, plan, "the claim sorts nothing:\n%s", plan)
					require.NotContains(t, plan, "Seq Scan on "+table+"_default", "the claim scans no table:\n%s", plan)
					continue
				}
				{
					require.Contains(t, plan, "idx_"+table+"_claim", "the claim reads the claim index:\n%s", plan)
				}
				require.NotContains(t, plan, "Sort", "the claim sorts nothing:\n%s", plan)
				require.NotContains(t, plan, "Seq Scan on "+table, "the claim scans no table:\n%s", plan)
				continue
			}
			rows, err := f.sqlDB.QueryContext(ctx, "EXPLAIN "+r.SQL, r.Args...)
			require.NoError(t, err)
			cols, err := rows.Columns()
			require.NoError(t, err)
			seen := 0
			for rows.Next() {
				vals := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				require.NoError(t, rows.Scan(ptrs...))
				row := map[string]string{}
				for i, c := range cols {
					if b, ok := vals[i].([]byte); ok {
						row[c] = string(b)
					} else if vals[i] != nil {
						row[c] = fmt.Sprint(vals[i])
					}
				}
				if !strings.HasPrefix(row["table"], "c") { // MariaDB names a partitioned table's in "partitions"
					continue // the union's result
				}
				seen++
				require.Equal(t, "idx_"+table+"_claim", row["key"], "each run reads the claim index: %v", row)
				require.NotContains(t, row["Extra"], "filesort", "no run sorts its rows: %v", row)
			}
			require.NoError(t, rows.Err())
			require.NoError(t, rows.Close())
			require.Equal(t, 2, seen, "the due run and the fresh run")
		}
	})
}
