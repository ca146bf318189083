package outboxplugin_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outboxplugin"
)

// Stats's JSON is the one outbox status --json prints: snake_case names, the age in seconds, the
// oldest pending time null when there is none, [] for empty lists, and each warning with its text.
// Table health figures that are unknown are null, partitions' ages in seconds. It reads back into
// the same Stats.
func TestStatsJSON(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w := outboxplugin.TableWarning{Code: outboxplugin.TableWarningDeadIndex, What: "no dead index", Cost: "slow", Fix: "outbox migrate"}
	n := func(v int64) *int64 { return &v }
	vacuumed, from, to := at.Add(-time.Hour), at.Add(-36*time.Hour), at.Add(-12*time.Hour)
	age := 36 * time.Hour
	st := outboxplugin.Stats{
		Table: "outbox_events", At: at, Pending: 3, Due: 1, Leased: 1, Waiting: 1, Scheduled: 4, Dead: 5, Processed: 6,
		OldestPending: at.Add(-90 * time.Second), OldestPendingAge: 90*time.Second + 500*time.Millisecond,
		ByType:        []outboxplugin.TypeStats{{EventType: "OrderPlaced", Pending: 3, Scheduled: 4, Dead: 5}},
		TableWarnings: []outboxplugin.TableWarning{w},
		Health: outboxplugin.TableHealth{
			TotalBytes: n(3000), TableBytes: n(2000), IndexBytes: n(1000), LiveRows: n(10), DeadRows: n(0), LastVacuum: &vacuumed,
			Partitions: []outboxplugin.PartitionHealth{
				{Name: "outbox_events_p20260101", Bound: "FOR VALUES FROM ('2026-01-01 00:00:00+00') TO ('2026-01-02 00:00:00+00')",
					From: &from, To: &to, Age: &age, TotalBytes: n(3000), IndexBytes: n(1000), Rows: n(10), DeadRows: n(0), LastVacuum: &vacuumed},
				{Name: "outbox_events_default", Bound: "DEFAULT", Default: true, Rows: n(0)},
			},
			Alerts: []outboxplugin.HealthAlert{{Code: outboxplugin.HealthAlertDefaultPartition, Text: "rows"}},
			Unread: []string{"pg_stat_user_tables: permission denied"},
		},
	}
	b, err := json.Marshal(st)
	require.NoError(t, err)
	assert.JSONEq(t, `{"table": "outbox_events", "at": "2026-01-02T03:04:05Z", "pending": 3, "due": 1, "leased": 1, "waiting": 1,
		"scheduled": 4, "dead": 5, "processed": 6, "processed_approximate": false,
		"oldest_pending": "2026-01-02T03:02:35Z", "oldest_pending_age_seconds": 90.5,
		"by_type": [{"event_type": "OrderPlaced", "pending": 3, "scheduled": 4, "dead": 5}],
		"table_warnings": [{"code": "dead_index", "what": "no dead index", "cost": "slow", "fix": "outbox migrate",
			"text": "no dead index: slow. Fix: outbox migrate"}],
		"health": {"total_bytes": 3000, "table_bytes": 2000, "index_bytes": 1000, "free_bytes": null, "live_rows": 10, "dead_rows": 0,
			"last_vacuum": "2026-01-02T02:04:05Z", "last_analyze": null, "purge_lag": null,
			"partitions": [
				{"name": "outbox_events_p20260101", "bound": "FOR VALUES FROM ('2026-01-01 00:00:00+00') TO ('2026-01-02 00:00:00+00')",
					"from": "2025-12-31T15:04:05Z", "to": "2026-01-01T15:04:05Z", "default": false, "age_seconds": 129600,
					"total_bytes": 3000, "index_bytes": 1000, "rows": 10, "dead_rows": 0, "last_vacuum": "2026-01-02T02:04:05Z"},
				{"name": "outbox_events_default", "bound": "DEFAULT", "from": null, "to": null, "default": true, "age_seconds": null,
					"total_bytes": null, "index_bytes": null, "rows": 0, "dead_rows": null, "last_vacuum": null}],
			"alerts": [{"code": "default_partition_rows", "text": "rows"}],
			"unread": ["pg_stat_user_tables: permission denied"]}}`, string(b))
	var back outboxplugin.Stats
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, st, back)

	b, err = json.Marshal(outboxplugin.Stats{Table: "t", At: at})
	require.NoError(t, err)
	assert.JSONEq(t, `{"table": "t", "at": "2026-01-02T03:04:05Z", "pending": 0, "due": 0, "leased": 0, "waiting": 0,
		"scheduled": 0, "dead": 0, "processed": 0, "processed_approximate": false, "oldest_pending": null,
		"oldest_pending_age_seconds": 0, "by_type": [], "table_warnings": [],
		"health": {"total_bytes": null, "table_bytes": null, "index_bytes": null, "free_bytes": null, "live_rows": null, "dead_rows": null,
			"last_vacuum": null, "last_analyze": null, "purge_lag": null, "partitions": [], "alerts": [], "unread": []}}`, string(b))
	var p *outboxplugin.Stats = &back
	b, err = json.Marshal(p)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"oldest_pending_age_seconds":90.5`, "a *Stats marshals the same way")
}

// Activity's JSON names its fields in snake_case with its durations in seconds, as Stats's does, and
// reads back into the same Activity.
func TestActivityJSON(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	act := outboxplugin.Activity{At: at, Start: at.Add(-2 * time.Minute), Interval: time.Minute, Published: []int64{3, 4},
		AtLeast: []bool{false, true}, LagSample: 7, LagP50: 1500 * time.Millisecond, LagP90: 2 * time.Second, LagMax: 3 * time.Second}
	b, err := json.Marshal(act)
	require.NoError(t, err)
	assert.JSONEq(t, `{"at": "2026-01-02T03:04:05Z", "start": "2026-01-02T03:02:05Z", "interval_seconds": 60, "published": [3, 4],
		"at_least": [false, true], "lag_sample": 7, "lag_p50_seconds": 1.5, "lag_p90_seconds": 2, "lag_max_seconds": 3}`, string(b))
	var back outboxplugin.Activity
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, act, back)
}
