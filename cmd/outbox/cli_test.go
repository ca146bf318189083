package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/gorm-outbox/outboxplugin"
)

func TestMigrate(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		hasTable := func() bool { return d.db.Migrator().HasTable(outboxplugin.DefaultTableName) }

		r := ok(t, "migrate", "--db", d.dsn, "--dry-run")
		if !strings.Contains(r.stdout, "CREATE TABLE") || !strings.Contains(r.stdout, "idx_outbox_events_claim") {
			t.Errorf("dry run of a new table prints no CREATE TABLE and claim index:\n%s", r.stdout)
		}
		// The whole migration, down to what follows the CREATE TABLE: the storage settings on
		// PostgreSQL, the dead index where partial indexes exist.
		if d.name == "postgres" && !strings.Contains(r.stdout, "SET (fillfactor = 50") {
			t.Errorf("dry run of a new PostgreSQL table prints no storage settings:\n%s", r.stdout)
		}
		if d.name != "mysql" && !strings.Contains(r.stdout, "idx_outbox_events_dead") {
			t.Errorf("dry run of a new table prints no dead index:\n%s", r.stdout)
		}
		var dry struct {
			DryRun     bool     `json:"dry_run"`
			Statements []string `json:"statements"`
		}
		decode(t, ok(t, "migrate", "--db", d.dsn, "--dry-run", "--json"), &dry)
		if !dry.DryRun || len(dry.Statements) == 0 {
			t.Errorf("dry run JSON: %+v", dry)
		}
		if hasTable() {
			t.Fatal("the dry run created the table")
		}

		r = ok(t, "migrate", "--db", d.dsn)
		if !strings.Contains(r.stdout, "migrated outbox_events") {
			t.Errorf("migrate printed %q", r.stdout)
		}
		if !hasTable() || !d.db.Migrator().HasIndex(outboxplugin.DefaultTableName, "idx_outbox_events_claim") {
			t.Fatal("migrate did not create the table with its claim index")
		}
		// An up-to-date table: nothing to run, not even the re-typing GORM's migrator did.
		r = ok(t, "migrate", "--db", d.dsn, "--dry-run")
		if strings.TrimSpace(r.stdout) != "-- outbox_events is up to date: nothing to run" {
			t.Errorf("dry run of a migrated table:\n%s", r.stdout)
		}
		ok(t, "migrate", "--db", d.dsn) // again: nothing to do

		// Another table, by --table.
		ok(t, "migrate", "--db", d.dsn, "--table", "events_b")
		if !d.db.Migrator().HasTable("events_b") {
			t.Error("migrate --table events_b did not create events_b")
		}
		// A name that is not a plain identifier is a usage error, and nothing is created.
		if r := cli(t, nil, nil, "migrate", "--db", d.dsn, "--table", "events; DROP TABLE x"); r.code != exitUsage {
			t.Errorf("migrate --table with SQL in it: exit %d, want %d\n%s", r.code, exitUsage, r.stderr)
		}
		// On PostgreSQL, a table in a schema of its own: created there, not in the search path.
		if d.name == "postgres" {
			if err := d.db.Exec(`CREATE SCHEMA audit`).Error; err != nil {
				t.Fatal(err)
			}
			ok(t, "migrate", "--db", d.dsn, "--table", "audit.events")
			var n int64
			if err := d.db.Raw(`SELECT COUNT(*) FROM pg_indexes WHERE schemaname = 'audit' AND tablename = 'events' AND indexname = 'idx_events_claim'`).Scan(&n).Error; err != nil || n != 1 {
				t.Errorf("migrate --table audit.events: claim index in schema audit: %d (%v)", n, err)
			}
			ok(t, "status", "--db", d.dsn, "--table", "audit.events")
		}
	})
}

// Without a database, --dry-run --dialect prints the current schema, or the migration files of the
// tools, with --table's name in them; --output writes the files.
func TestMigrateDryRunWithoutADatabase(t *testing.T) {
	r := ok(t, "migrate", "--dry-run", "--dialect", "postgres", "--table", "audit.events", "--key-ordering-index")
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "audit"."events"`, `SET (fillfactor = 50`, `"idx_events_claim"`,
		`"idx_audit_events_dead"`, `"idx_audit_events_key_pending"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--dialect postgres: no %s in:\n%s", want, r.stdout)
		}
	}
	r = ok(t, "migrate", "--dry-run", "--dialect", "postgres", "--format", "goose")
	if n := strings.Count(r.stdout, "-- ==> "); n != 9 {
		t.Errorf("--format goose printed %d files:\n%s", n, r.stdout)
	}
	if n := strings.Count(r.stdout, "-- +goose NO TRANSACTION"); n != 3 {
		t.Errorf("--format goose: %d files marked NO TRANSACTION, want the 3 with CONCURRENTLY", n)
	}
	dir := filepath.Join(t.TempDir(), "migrations")
	r = ok(t, "migrate", "--dry-run", "--dialect", "mariadb", "--format", "golang-migrate", "--table", "events", "--output", dir)
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 18 {
		t.Fatalf("--output wrote %d files (%v), want 18:\n%s", len(entries), err, r.stdout)
	}
	b, err := os.ReadFile(filepath.Join(dir, "000003_claim_index.up.sql"))
	if err != nil || !strings.Contains(string(b), "ALTER TABLE `events` ADD INDEX `idx_events_claim`") {
		t.Errorf("000003_claim_index.up.sql: %v\n%s", err, b)
	}
	b, err = os.ReadFile(filepath.Join(dir, "000009_mysql_lease_defaults.up.sql"))
	if err != nil || !strings.Contains(string(b), "ALTER TABLE `events` ALTER COLUMN locked_by SET DEFAULT '"+outboxplugin.NoLeaseOwner+"'") {
		t.Errorf("000009_mysql_lease_defaults.up.sql: %v\n%s", err, b)
	}
	r = ok(t, "migrate", "--dry-run", "--dialect", "postgres", "--partitions", "24h")
	for _, want := range []string{`PRIMARY KEY (id, created_at)`, `PARTITION BY RANGE (created_at)`, `"outbox_events_default" PARTITION OF "outbox_events" DEFAULT`,
		`"outbox_events_p` + time.Now().UTC().Format("20060102") + `" PARTITION OF "outbox_events" FOR VALUES FROM`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--partitions 24h: no %s in:\n%s", want, r.stdout)
		}
	}
	// The migration files of a new partitioned table: one version, with the index asked for.
	r = ok(t, "migrate", "--dry-run", "--dialect", "mysql", "--format", "goose", "--partitions", "24h", "--key-ordering-index")
	for _, want := range []string{"-- ==> 00009_create_partitioned_table.sql <==", "PARTITION BY RANGE COLUMNS(created_at)",
		"INDEX `idx_outbox_events_key_pending`", "-- +goose Down\nDROP TABLE `outbox_events`;"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--format goose --partitions 24h: no %s in:\n%s", want, r.stdout)
		}
	}
	if strings.Count(r.stdout, "-- ==> ") != 1 {
		t.Errorf("--format goose --partitions 24h: want one file:\n%s", r.stdout)
	}
	for _, args := range [][]string{
		{"migrate", "--dry-run", "--dialect", "sqlite", "--format", "goose", "--partitions", "24h"},
		{"migrate", "--dry-run", "--dialect", "sqlite", "--partitions", "24h"},    // SQLite has none
		{"migrate", "--dry-run", "--dialect", "postgres", "--partitions", "90m"},  // not whole hours
		{"migrate", "--dry-run", "--dialect", "postgres", "--partitions", "-24h"}, // negative
		{"migrate", "--dialect", "postgres"},                                      // not a dry run
		{"migrate", "--dry-run", "--dialect", "oracle"},                           // unknown database
		{"migrate", "--dry-run", "--dialect", "postgres", "--format", "flyway"},   // unknown format
		{"migrate", "--dry-run", "--format", "goose"},                             // no --dialect
		{"migrate", "--dry-run", "--dialect", "postgres", "--output", dir},        // --output with --format sql
		{"migrate", "--dry-run", "--dialect", "postgres", "--format", "goose", "--key-ordering-index"},
		{"migrate", "--dry-run", "--dialect", "postgres", "--table", "a b"},
	} {
		if r := cli(t, nil, nil, args...); r.code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", args, r.code, exitUsage, r.stderr)
		}
	}
}

func TestStatus(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		addFixture(t, d)
		r := ok(t, "status", "--db", d.dsn)
		for _, line := range []string{`pending\s+2`, `due\s+1`, `waiting\s+1`, `leased\s+0`, `dead\s+2`, `processed\s+2`,
			`scheduled\s+0`, `OrderPlaced\s+1\s+0\s+1`, `OrderShipped\s+1\s+0\s+1`} {
			if !regexp.MustCompile(`(?m)^\s*` + line + `\s*$`).MatchString(r.stdout) {
				t.Errorf("status has no line %q:\n%s", line, r.stdout)
			}
		}
		if strings.Contains(r.stdout, "approximate") {
			t.Errorf("an exact count is shown as approximate:\n%s", r.stdout)
		}

		var st statsJSON
		decode(t, ok(t, "status", "--db", d.dsn, "--json"), &st)
		want := statsJSON{Table: "outbox_events", Pending: 2, Due: 1, Waiting: 1, Dead: 2, Processed: 2,
			ByType: []typeStatsJSON{{"OrderPlaced", 1, 0, 1}, {"OrderShipped", 1, 0, 1}}}
		if st.OldestPending == nil || st.OldestPendingSeconds < 0 {
			t.Errorf("oldest pending %v, age %v s", st.OldestPending, st.OldestPendingSeconds)
		}
		st.At, st.OldestPending, st.OldestPendingSeconds = want.At, nil, 0
		if !slices.Equal(st.ByType, want.ByType) {
			t.Errorf("by type %+v, want %+v", st.ByType, want.ByType)
		}
		st.ByType = want.ByType
		if st.Table != want.Table || st.Pending != want.Pending || st.Due != want.Due || st.Waiting != want.Waiting ||
			st.Leased != 0 || st.Dead != want.Dead || st.Processed != want.Processed || st.ProcessedApproximate {
			t.Errorf("status JSON %+v, want %+v", st, want)
		}
	})
}

// A table made by GORM's own db.AutoMigrate: status warns (text on stderr, table_warnings in JSON) of
// what it lacks on each database, with the cost and the fix, and still exits 0; after outbox migrate
// nothing is left to warn about. A table of an earlier version keeps the pending index it had, on every
// database, until outbox migrate drops it.
func TestStatusTableWarnings(t *testing.T) {
	want := map[string][]string{
		"postgres": {"storage_settings", "reference_index", "dead_index"},
		"sqlite":   {"reference_index", "dead_index"},
		"mysql":    {"lease_defaults"},
	}
	forEachDB(t, func(t *testing.T, d *testDB) {
		if err := d.db.AutoMigrate(&outboxplugin.OutboxEvent{}); err != nil {
			t.Fatal(err)
		}
		check := func(step string, codes []string) {
			t.Helper()
			r := ok(t, "status", "--db", d.dsn)
			warnings := regexp.MustCompile(`(?m)^WARNING: .*$`).FindAllString(r.stderr, -1)
			if len(warnings) != len(codes) {
				t.Errorf("%s: status prints %d warnings, want %d (%v):\n%s", step, len(warnings), len(codes), codes, r.stderr)
			}
			if strings.Contains(r.stdout, "WARNING") {
				t.Errorf("%s: warnings on stdout:\n%s", step, r.stdout)
			}
			var st statsJSON
			decode(t, ok(t, "status", "--db", d.dsn, "--json"), &st)
			got := []string{}
			for i, w := range st.TableWarnings {
				got = append(got, w.Code)
				if !strings.Contains(w.Fix, "outbox migrate") || w.Cost == "" || !strings.Contains(w.What, "outbox_events") {
					t.Errorf("%s: warning %+v: want the table, a cost and the fix", step, w)
				}
				if w.Text != w.What+": "+w.Cost+". Fix: "+w.Fix {
					t.Errorf("%s: text %q is not what, cost and fix", step, w.Text)
				}
				if i < len(warnings) && warnings[i] != "WARNING: "+w.Text {
					t.Errorf("%s: text output %q, JSON %q", step, warnings[i], w.Text)
				}
			}
			if st.TableWarnings == nil || !slices.Equal(got, codes) {
				t.Errorf("%s: table_warnings %v, want %v", step, got, codes)
			}
		}
		check("db.AutoMigrate", want[d.name])
		if d.name == "postgres" {
			r := ok(t, "status", "--db", d.dsn)
			if !strings.Contains(r.stderr, "fillfactor = 50") || !strings.Contains(r.stderr, "a relay drains it at") {
				t.Errorf("the storage settings warning names neither the settings nor the measured cost:\n%s", r.stderr)
			}
		}
		ok(t, "migrate", "--db", d.dsn)
		check("outbox migrate", []string{})

		if err := d.db.Exec(`CREATE INDEX idx_outbox_events_pending ON outbox_events (created_at, id)`).Error; err != nil {
			t.Fatal(err)
		}
		check("pending index of an earlier version", []string{"pending_index"})
		ok(t, "migrate", "--db", d.dsn)
		check("outbox migrate again", []string{})
	})
}

// listIDs runs events list --json with args and returns the message ids and the next cursor.
func listIDs(t *testing.T, d *testDB, args ...string) ([]string, string) {
	t.Helper()
	var page struct {
		Events     []eventJSON `json:"events"`
		NextCursor string      `json:"next_cursor"`
	}
	decode(t, ok(t, append([]string{"events", "list", "--db", d.dsn, "--json"}, args...)...), &page)
	ids := []string{}
	for _, e := range page.Events {
		ids = append(ids, e.MessageID)
	}
	return ids, page.NextCursor
}

func TestEventsList(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		for _, c := range []struct {
			name string
			args []string
			want []string // newest first
		}{
			{"all", nil, []string{f.newProcessed, f.waiting, f.dead2, f.dead1, f.due, f.oldProcessed}},
			{"dead", []string{"--state", "dead"}, []string{f.dead2, f.dead1}},
			{"pending", []string{"--state", "pending"}, []string{f.waiting, f.due}},
			{"type", []string{"--type", "OrderShipped"}, []string{f.waiting, f.dead2}},
			{"aggregate", []string{"--aggregate-type", "order", "--aggregate-id", "1"}, []string{f.dead2, f.due}},
			{"message id", []string{"--message-id", f.dead1}, []string{f.dead1}},
			{"since", []string{"--since", "1d", "--state", "processed"}, []string{f.newProcessed}},
			{"until", []string{"--until", "2d"}, []string{f.oldProcessed}},
			{"oldest", []string{"--oldest", "--state", "dead"}, []string{f.dead1, f.dead2}},
		} {
			if got, next := listIDs(t, d, c.args...); !slices.Equal(got, c.want) || next != "" {
				t.Errorf("%s: events %v (next %q), want %v", c.name, got, next, c.want)
			}
		}

		// Paging by cursor, oldest first, two at a time, reads every event once in order.
		var all []string
		cursor := ""
		for range 5 {
			ids, next := listIDs(t, d, "--oldest", "--limit", "2", "--cursor", cursor)
			all = append(all, ids...)
			if cursor = next; cursor == "" {
				break
			}
		}
		if want := []string{f.oldProcessed, f.due, f.dead1, f.dead2, f.waiting, f.newProcessed}; !slices.Equal(all, want) {
			t.Errorf("pages: %v, want %v", all, want)
		}

		r := ok(t, "events", "list", "--db", d.dsn, "--limit", "2")
		if !strings.Contains(r.stdout, "MESSAGE ID") || !strings.Contains(r.stdout, f.newProcessed) || strings.Contains(r.stdout, f.dead2) {
			t.Errorf("text page of 2:\n%s", r.stdout)
		}
		if !strings.Contains(r.stderr, "--cursor ") {
			t.Errorf("text page does not give the next cursor: stderr %q", r.stderr)
		}

		for _, args := range [][]string{
			{"--state", "bogus"}, {"--cursor", "not-a-cursor"}, {"--limit", "5000"}, {"--aggregate-type", "order"},
			{"--since", "yesterday"}, {"--since", "1h", "--until", "2h"},
		} {
			wantCode(t, exitUsage, append([]string{"events", "list", "--db", d.dsn}, args...)...)
		}
	})
}

func TestEventsShow(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		r := ok(t, "events", "show", "--db", d.dsn, f.dead1)
		for _, want := range []string{f.dead1, "OrderPlaced", "order/2", "dead", "broker down", "trace: abc", "\n  \"order_id\": 2"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show lacks %q:\n%s", want, r.stdout)
			}
		}
		var e struct {
			eventJSON
			Payload map[string]any `json:"payload"`
		}
		decode(t, ok(t, "events", "show", "--db", d.dsn, f.dead1, "--json"), &e)
		if e.MessageID != f.dead1 || e.State != "dead" || e.Attempts != 5 || e.LastError != "broker down" ||
			e.DeadAt == nil || e.Headers["trace"] != "abc" || e.Payload["order_id"] != float64(2) {
			t.Errorf("show --json: %+v", e)
		}
		decode(t, ok(t, "events", "show", "--db", d.dsn, f.newProcessed, "--json"), &e)
		if e.State != "processed" || e.ProcessedAt == nil {
			t.Errorf("show --json of a processed event: %+v", e)
		}

		if !strings.Contains(r.stdout, "history (last failed attempts, oldest first):\n  -\n") {
			t.Errorf("show of an event without a failed attempt lacks an empty history:\n%s", r.stdout)
		}

		// A worker's refusal of the due event: its history has the attempt, as the worker wrote it.
		owner := refuseOnce(t, d, "schema registry: 409\nsubject incompatible")
		r = ok(t, "events", "show", "--db", d.dsn, f.due)
		if !regexp.MustCompile(`(?m)^  attempt +at +worker +took +error\n  1 +\d{4}-\d\d-\d\dT\S+Z +` + regexp.QuoteMeta(owner) +
			` +\S+s +schema registry: 409 subject incompatible$`).MatchString(r.stdout) {
			t.Errorf("show lacks the history's attempt (one line, worker %s):\n%s", owner, r.stdout)
		}
		var h eventJSON
		decode(t, ok(t, "events", "show", "--db", d.dsn, f.due, "--json"), &h)
		if len(h.History) != 1 {
			t.Fatalf("show --json: history %+v, want one attempt", h.History)
		}
		if a := h.History[0]; a.Attempt != 1 || a.Worker != owner || a.Error != "schema registry: 409\nsubject incompatible" ||
			a.DurationMS == nil || a.Unfinished || time.Since(a.At) > time.Minute || a.At.After(time.Now()) {
			t.Errorf("show --json: attempt %+v", a)
		}

		r = wantCode(t, exitNotFound, "events", "show", "--db", d.dsn, "0194c7a2-5f1e-7d3a-9b1c-2a4e6f8d0b12")
		if !strings.Contains(r.stderr, "not found") {
			t.Errorf("not found: stderr %q", r.stderr)
		}
		wantCode(t, exitUsage, "events", "show", "--db", d.dsn)
	})
}

// refuseOnce runs a worker over d's due events once, with a publisher that refuses each of them with
// text, and returns the worker's owner id.
func refuseOnce(t *testing.T, d *testDB, text string) string {
	t.Helper()
	pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
		failed := map[string]error{}
		for _, m := range msgs {
			failed[m.ID] = errors.New(text)
		}
		return outboxplugin.FailedMessages(failed)
	})
	w, err := outboxplugin.NewWorker(d.db, pub, outboxplugin.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.ProcessOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	return w.Owner()
}

// stateOf returns the state events show gives the message id, or "" when it is not found.
func stateOf(t *testing.T, d *testDB, id string) string {
	t.Helper()
	r := cli(t, nil, nil, "events", "show", "--db", d.dsn, "--json", id)
	if r.code == exitNotFound {
		return ""
	}
	var e eventJSON
	decode(t, r, &e)
	return e.State
}

func TestDeadRequeue(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		r := ok(t, "dead", "requeue", "--db", d.dsn, f.dead1)
		if r.stdout != "requeued 1 events\n" {
			t.Errorf("requeue by id printed %q", r.stdout)
		}
		if st := stateOf(t, d, f.dead1); st != "due" {
			t.Errorf("requeued event is %s, want due", st)
		}
		r = ok(t, "dead", "requeue", "--db", d.dsn, f.due)
		if r.stdout != "requeued 0 events\n" || !strings.Contains(r.stderr, "1 of the 1 message ids matched no") {
			t.Errorf("requeue of a due event: stdout %q stderr %q", r.stdout, r.stderr)
		}

		// A filter run asks for confirmation, which stdin (not a terminal) cannot give.
		r = wantCode(t, exitRefused, "dead", "requeue", "--db", d.dsn, "--all", "--type", "OrderShipped")
		if !strings.Contains(r.stderr, "--yes") {
			t.Errorf("refusal does not say --yes: %q", r.stderr)
		}
		if st := stateOf(t, d, f.dead2); st != "dead" {
			t.Errorf("refused requeue changed an event to %s", st)
		}

		var out struct {
			Action   string `json:"action"`
			Affected int64  `json:"affected"`
		}
		decode(t, ok(t, "dead", "requeue", "--db", d.dsn, "--all", "--yes", "--state", "dead", "--type", "OrderShipped", "--json"), &out)
		if out.Action != "requeue" || out.Affected != 1 || stateOf(t, d, f.dead2) != "due" || stateOf(t, d, f.waiting) != "waiting" {
			t.Errorf("requeue --state dead: %+v, dead2 %s, waiting %s", out, stateOf(t, d, f.dead2), stateOf(t, d, f.waiting))
		}
		decode(t, ok(t, "dead", "requeue", "--db", d.dsn, "--all", "--yes", "--since", "1h", "--json"), &out)
		if out.Affected != 1 || stateOf(t, d, f.waiting) != "due" {
			t.Errorf("requeue --all of the waiting event: %+v", out)
		}

		for _, args := range [][]string{
			{},                       // neither ids nor --all
			{f.dead1, "--all"},       // both
			{f.dead1, "--type", "x"}, // a filter with ids
			{"--all", "--state", "processed", "--yes"},
		} {
			wantCode(t, exitUsage, append([]string{"dead", "requeue", "--db", d.dsn}, args...)...)
		}
	})
}

func TestDeadDiscard(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		if r := ok(t, "dead", "discard", "--db", d.dsn, f.due, f.waiting); r.stdout != "discarded 0 events\n" {
			t.Errorf("discard of live events printed %q", r.stdout)
		}
		if r := ok(t, "dead", "discard", "--db", d.dsn, f.dead1); r.stdout != "discarded 1 events\n" {
			t.Errorf("discard by id printed %q", r.stdout)
		}
		if st := stateOf(t, d, f.dead1); st != "" {
			t.Errorf("discarded event is still there, %s", st)
		}
		wantCode(t, exitRefused, "dead", "discard", "--db", d.dsn, "--all")
		var out struct {
			Affected int64 `json:"affected"`
		}
		decode(t, ok(t, "dead", "discard", "--db", d.dsn, "--all", "--yes", "--json"), &out)
		if out.Affected != 1 || stateOf(t, d, f.dead2) != "" || stateOf(t, d, f.due) != "due" || stateOf(t, d, f.waiting) != "waiting" {
			t.Errorf("discard --all: %+v", out)
		}
		wantCode(t, exitUsage, "dead", "discard", "--db", d.dsn, "--all", "--state", "dead") // no --state
	})
}

func TestCleanup(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		if r := ok(t, "cleanup", "--db", d.dsn, "--older-than", "7d"); !strings.HasPrefix(r.stdout, "deleted 1 processed events") {
			t.Errorf("cleanup printed %q", r.stdout)
		}
		if stateOf(t, d, f.oldProcessed) != "" || stateOf(t, d, f.newProcessed) != "processed" {
			t.Error("cleanup --older-than 7d did not delete exactly the processed event ten days old")
		}
		for _, age := range []string{"-1h", "7x", "-2d"} {
			wantCode(t, exitUsage, "cleanup", "--db", d.dsn, "--older-than", age)
		}
		wantCode(t, exitUsage, "cleanup", "--db", d.dsn)
		var out struct {
			Deleted int64 `json:"deleted"`
		}
		decode(t, ok(t, "cleanup", "--db", d.dsn, "--older-than", "0s", "--json"), &out)
		if out.Deleted != 1 || stateOf(t, d, f.due) != "due" || stateOf(t, d, f.dead1) != "dead" {
			t.Errorf("cleanup --older-than 0s: %+v", out)
		}
	})
}

func TestVersion(t *testing.T) {
	r := ok(t, "version")
	if !strings.HasPrefix(r.stdout, "outbox ") || !strings.Contains(r.stdout, runtime.Version()) {
		t.Errorf("version printed %q", r.stdout)
	}
	var v struct{ Version, Outboxplugin, Go string }
	decode(t, ok(t, "version", "--json"), &v)
	if v.Version == "" || v.Outboxplugin == "" || v.Go != runtime.Version() {
		t.Errorf("version --json: %+v", v)
	}
}

func TestEnvironmentAndDBFile(t *testing.T) {
	d := newSQLiteDB(t)
	addFixture(t, d)
	env := func(kv ...string) []string { return kv }

	r := cli(t, env("OUTBOX_DB="+d.dsn, "OUTBOX_JSON=true"), nil, "status")
	var st statsJSON
	decode(t, r, &st)
	if st.Dead != 2 {
		t.Errorf("status from OUTBOX_DB, OUTBOX_JSON: %+v", st)
	}
	// A flag wins over its variable.
	r = cli(t, env("OUTBOX_DB=/nonexistent/dir/x.db", "OUTBOX_TABLE=no_such_table"), nil, "status", "--db", d.dsn, "--table", "outbox_events")
	if r.code != 0 || !strings.Contains(r.stdout, "dead") {
		t.Errorf("flags over env: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = cli(t, env("OUTBOX_DB="+d.dsn, "OUTBOX_TABLE=no_such_table"), nil, "status"); r.code != exitFailed {
		t.Errorf("OUTBOX_TABLE of a missing table: exit %d", r.code)
	}
	if r = cli(t, env("OUTBOX_DB="+d.dsn, "OUTBOX_JSON=maybe"), nil, "status"); r.code != exitUsage || !strings.Contains(r.stderr, "OUTBOX_JSON") {
		t.Errorf("OUTBOX_JSON=maybe: exit %d, stderr %q", r.code, r.stderr)
	}
	if r = cli(t, env("OUTBOX_DB="+d.dsn, "OUTBOX_OLDER_THAN=7d"), nil, "cleanup"); r.code != 0 || !strings.HasPrefix(r.stdout, "deleted 1 ") {
		t.Errorf("OUTBOX_OLDER_THAN=7d: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}

	file := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(file, []byte("  "+d.dsn+"\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok(t, "status", "--db-file", file)
	if r = cli(t, env("OUTBOX_DB_FILE="+file), nil, "status", "--json"); r.code != 0 {
		t.Errorf("OUTBOX_DB_FILE: exit %d %s", r.code, r.stderr)
	}
	wantCode(t, exitUsage, "status", "--db-file", filepath.Join(t.TempDir(), "missing"))
	wantCode(t, exitUsage, "status", "--db-file", file, "--db", d.dsn)
}

func TestUsageErrors(t *testing.T) {
	db := filepath.Join(t.TempDir(), "never-opened.db")
	for _, args := range [][]string{
		{"bogus"},
		{"status", "--bogus"},
		{"status"}, // no database
		{"status", "--db", "nonsense"},
		{"status", "--db", db, "extra"},
		{"events", "list", "--db", db, "--limit", "abc"},
		{"events", "show", "--db", db, "a", "b"},
		{"cleanup", "--db", db},
		{"dead", "requeue", "--db", db},
		{"dead", "discard", "--db", db, "--all", "--since", "tomorrow"},
	} {
		r := wantCode(t, exitUsage, args...)
		if !strings.HasPrefix(r.stderr, "outbox: ") || !strings.Contains(r.stderr, "--help") {
			t.Errorf("%v: stderr %q", args, r.stderr)
		}
	}
	if _, err := os.Stat(db); err == nil {
		t.Error("a usage error opened (and created) the SQLite database")
	}
	wantCode(t, exitUsage, "status", "--db", filepath.Join(t.TempDir(), "x.db"), "--table", "bad table")
	if r := ok(t, "--help"); !strings.Contains(r.stdout, "Exit codes:") || !strings.Contains(r.stdout, "OUTBOX_DB") {
		t.Errorf("--help does not document exit codes and environment:\n%s", r.stdout)
	}
}

func TestPasswordNeverPrinted(t *testing.T) {
	const password = "S3cretPassw0rd"
	type dsnCase struct {
		dsn  string
		code int
	}
	dsns := map[string]dsnCase{
		"postgres URL":       {"postgres://app:" + password + "@127.0.0.1:1/shop?sslmode=disable", exitFailed},
		"postgres key=value": {"host=127.0.0.1 port=1 user=app password=" + password + " dbname=shop sslmode=disable", exitFailed},
		"postgres quoted":    {"host=127.0.0.1 port=1 user=app password='" + password + " x' dbname=shop", exitFailed},
		"mysql DSN":          {"app:" + password + "@tcp(127.0.0.1:1)/shop", exitFailed},
		"mysql URL":          {"mysql://app:" + password + "@127.0.0.1:1/shop", exitFailed},
		// Errors that quote the DSN.
		"postgres URL, bad port":       {"postgres://app:" + password + "@127.0.0.1:badport/shop", exitFailed},
		"postgres key=value, bad port": {"host=127.0.0.1 port=bad password=" + password, exitFailed},
		"mysql DSN, bad parameter":     {"app:" + password + "@tcp(127.0.0.1:1)/shop?timeout=forever", exitUsage},
	}
	if servers[1].ping() == nil {
		// A reachable server that refuses the password.
		cfg, err := mysql.ParseDSN(mysqlServerDSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.Passwd = password
		dsns["mysql wrong password"] = dsnCase{cfg.FormatDSN(), exitFailed}
	}
	file := filepath.Join(t.TempDir(), "dsn")
	for name, c := range dsns {
		dsn := c.dsn
		for _, args := range [][]string{
			{"status", "--db", dsn},
			{"events", "list", "--db", dsn, "--json"},
			{"migrate", "--dry-run", "--db", dsn},
			{"status", "--db-file", file},
		} {
			if err := os.WriteFile(file, []byte(dsn), 0o600); err != nil {
				t.Fatal(err)
			}
			r := cli(t, nil, nil, args...)
			if r.code != c.code {
				t.Errorf("%s: %v: exit %d, want %d: %s", name, args[0], r.code, c.code, r.stderr)
			}
			if strings.Contains(r.stdout+r.stderr, password) || strings.Contains(r.stdout+r.stderr, "S3cret") {
				t.Errorf("%s: %v printed the password:\nstdout: %s\nstderr: %s", name, args[0], r.stdout, r.stderr)
			}
		}
		r := cli(t, []string{"OUTBOX_DB=" + dsn}, nil, "status", "--help")
		if r.code != 0 || strings.Contains(r.stdout+r.stderr, password) {
			t.Errorf("%s: status --help with OUTBOX_DB: exit %d, printed the password: %v", name, r.code, strings.Contains(r.stdout, password))
		}
	}
}
