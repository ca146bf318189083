package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// addScheduled writes two Reminder events delayed by a day beside the fixture's, and returns their
// message ids.
func addScheduled(t *testing.T, d *testDB) []string {
	t.Helper()
	var ids []string
	for i := range 2 {
		err := d.db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Reminder", map[string]int{"n": i}, outboxplugin.DeliverAfter(24*time.Hour))
		})
		if err != nil {
			t.Fatal(err)
		}
		var id string
		if err := d.db.Raw(`SELECT message_id FROM outbox_events ORDER BY id DESC LIMIT 1`).Scan(&id).Error; err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// nextAttemptOf returns the next_attempt_at events show gives the message id.
func nextAttemptOf(t *testing.T, d *testDB, id string) *time.Time {
	t.Helper()
	var e eventJSON
	decode(t, ok(t, "events", "show", "--db", d.dsn, "--json", id), &e)
	return e.NextAttemptAt
}

// Delayed events whose time has not come are scheduled in status, events list and events show; no
// requeue moves them (by id it says so); events deliver-now does, and nothing else.
func TestScheduledEvents(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		sched := addScheduled(t, d)
		at := nextAttemptOf(t, d, sched[0])
		if at == nil || at.Before(time.Now().Add(23*time.Hour)) {
			t.Fatalf("the delayed event's time is %v", at)
		}

		r := ok(t, "status", "--db", d.dsn)
		for _, line := range []string{`pending\s+2`, `waiting\s+1`, `scheduled\s+2`, `Reminder\s+0\s+2\s+0`, `OrderShipped\s+1\s+0\s+1`} {
			if !regexp.MustCompile(`(?m)^\s*` + line + `\s*$`).MatchString(r.stdout) {
				t.Errorf("status has no line %q:\n%s", line, r.stdout)
			}
		}
		var st statsJSON
		decode(t, ok(t, "status", "--db", d.dsn, "--json"), &st)
		if st.Scheduled != 2 || st.Waiting != 1 || st.Pending != 2 || !slices.Contains(st.ByType, typeStatsJSON{EventType: "Reminder", Scheduled: 2}) {
			t.Errorf("status JSON %+v", st)
		}

		if ids, _ := listIDs(t, d, "--state", "scheduled", "--oldest"); !slices.Equal(ids, sched) {
			t.Errorf("--state scheduled lists %v, want %v", ids, sched)
		}
		if ids, _ := listIDs(t, d, "--state", "waiting"); !slices.Equal(ids, []string{f.waiting}) {
			t.Errorf("--state waiting lists %v, want %v", ids, []string{f.waiting})
		}
		if st := stateOf(t, d, sched[0]); st != "scheduled" {
			t.Errorf("events show: state %s", st)
		}
		if r := ok(t, "events", "show", "--db", d.dsn, sched[0]); !regexp.MustCompile(`(?m)^scheduled for\s+\d{4}-`).MatchString(r.stdout) {
			t.Errorf("events show has no scheduled time:\n%s", r.stdout)
		}

		// Requeue by id: left alone, and said so.
		r = ok(t, "dead", "requeue", "--db", d.dsn, sched[0])
		if r.stdout != "requeued 0 events\n" || !strings.Contains(r.stderr, sched[0]+" is scheduled for ") ||
			!strings.Contains(r.stderr, "outbox events deliver-now "+sched[0]) {
			t.Errorf("requeue of a scheduled event: stdout %q stderr %q", r.stdout, r.stderr)
		}
		var out struct {
			Action        string   `json:"action"`
			Affected      int64    `json:"affected"`
			LeftScheduled []string `json:"left_scheduled"`
		}
		decode(t, ok(t, "dead", "requeue", "--db", d.dsn, "--json", sched[0], f.dead1), &out)
		if out.Affected != 1 || !slices.Equal(out.LeftScheduled, []string{sched[0]}) {
			t.Errorf("requeue --json of a scheduled and a dead event: %+v", out)
		}
		// Requeue --all, the poison runbook's advice: the failed events only.
		decode(t, ok(t, "dead", "requeue", "--db", d.dsn, "--all", "--yes", "--json"), &out)
		if out.Affected != 2 || stateOf(t, d, f.waiting) != "due" || stateOf(t, d, f.dead2) != "due" {
			t.Errorf("requeue --all: %+v", out)
		}
		for _, id := range sched {
			if st := stateOf(t, d, id); st != "scheduled" {
				t.Errorf("requeue moved scheduled event %s: %s", id, st)
			}
		}
		if next := nextAttemptOf(t, d, sched[0]); next == nil || !next.Equal(*at) {
			t.Errorf("the scheduled event's time moved from %v to %v", at, next)
		}
		wantCode(t, exitUsage, "dead", "requeue", "--db", d.dsn, "--all", "--yes", "--state", "scheduled")

		// Deliver now: the scheduled events only.
		r = ok(t, "events", "deliver-now", "--db", d.dsn, sched[0], f.due)
		if r.stdout != "made due now: 1 events\n" || stateOf(t, d, sched[0]) != "due" || nextAttemptOf(t, d, sched[0]) != nil {
			t.Errorf("deliver-now by id: stdout %q stderr %q, state %s", r.stdout, r.stderr, stateOf(t, d, sched[0]))
		}
		wantCode(t, exitRefused, "events", "deliver-now", "--db", d.dsn, "--all")
		decode(t, ok(t, "events", "deliver-now", "--db", d.dsn, "--all", "--yes", "--json"), &out)
		if out.Action != "deliver-now" || out.Affected != 1 || stateOf(t, d, sched[1]) != "due" {
			t.Errorf("deliver-now --all: %+v, %s", out, stateOf(t, d, sched[1]))
		}
	})
}
