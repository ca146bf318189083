package main

import (
	"encoding/json"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
)

// statsJSON is the JSON outbox status --json prints, spelled out field by field: the form scripts
// read, which the tests pin. The command prints outboxplugin.Stats's own JSON form.
type statsJSON struct {
	Table                string             `json:"table"`
	At                   time.Time          `json:"at"`
	Pending              int64              `json:"pending"`
	Due                  int64              `json:"due"`
	Leased               int64              `json:"leased"`
	Waiting              int64              `json:"waiting"`
	Scheduled            int64              `json:"scheduled"`
	Dead                 int64              `json:"dead"`
	Processed            int64              `json:"processed"`
	ProcessedApproximate bool               `json:"processed_approximate"`
	OldestPending        *time.Time         `json:"oldest_pending"`
	OldestPendingSeconds float64            `json:"oldest_pending_age_seconds"`
	ByType               []typeStatsJSON    `json:"by_type"`
	TableWarnings        []tableWarningJSON `json:"table_warnings"`
}

type typeStatsJSON struct {
	EventType string `json:"event_type"`
	Pending   int64  `json:"pending"`
	Scheduled int64  `json:"scheduled"`
	Dead      int64  `json:"dead"`
}

type tableWarningJSON struct {
	Code string `json:"code"`
	What string `json:"what"`
	Cost string `json:"cost"`
	Fix  string `json:"fix"`
	Text string `json:"text"`
}

// status --json is Stats's JSON form: every key it prints is one of the form above, with the age in
// seconds, and it decodes back into an outboxplugin.Stats with the same counts and age.
func TestStatusJSONIsStats(t *testing.T) {
	d := newSQLiteDB(t)
	addFixture(t, d)
	r := ok(t, "status", "--db", d.dsn, "--json")
	var keys map[string]json.RawMessage
	decode(t, r, &keys)
	want := []string{"at", "by_type", "dead", "due", "health", "leased", "oldest_pending", "oldest_pending_age_seconds", "pending",
		"processed", "processed_approximate", "scheduled", "table", "table_warnings", "waiting"}
	got := make([]string, 0, len(keys))
	for k := range keys {
		got = append(got, k)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("status --json keys %v, want %v", got, want)
	}
	var st outboxplugin.Stats
	decode(t, r, &st)
	var wire statsJSON
	decode(t, r, &wire)
	if st.Table != "outbox_events" || st.Dead != 2 || st.Pending != 2 || len(st.ByType) != 2 || st.OldestPending.IsZero() ||
		st.OldestPendingAge <= 0 || math.Abs(st.OldestPendingAge.Seconds()-wire.OldestPendingSeconds) > 1e-6 || wire.OldestPendingSeconds > 3600 {
		t.Errorf("status --json into Stats: %+v (oldest_pending_age_seconds %v)", st, wire.OldestPendingSeconds)
	}
}
