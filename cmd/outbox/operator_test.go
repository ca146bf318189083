package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// The operator's view of the command: what it says and exits with when an id, a limit, a path or a
// table is not what it should be.

const unknownID = "0194c7a2-5f1e-7d3a-9b1c-2a4e6f8d0b12"

// A message id that is not in the table is named on stderr and exits 3, as events show does, by every
// command that acts on message ids; the known ids of the same run are acted on.
func TestRepairOfUnknownIDs(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		for _, cmd := range [][]string{{"dead", "requeue"}, {"dead", "discard"}, {"events", "deliver-now"}} {
			r := wantCode(t, exitNotFound, append(cmd, "--db", d.dsn, unknownID)...)
			if !strings.Contains(r.stderr, unknownID) || !strings.Contains(r.stderr, "not in the table outbox_events") {
				t.Errorf("%v of an unknown id: stderr %q", cmd, r.stderr)
			}
		}

		// Several ids, one unknown: the known one is requeued, the unknown one named, exit 3.
		var out struct {
			Affected int64    `json:"affected"`
			NotFound []string `json:"not_found"`
		}
		r := cli(t, nil, nil, "dead", "requeue", "--db", d.dsn, "--json", f.dead1, unknownID)
		if r.code != exitNotFound {
			t.Errorf("requeue of a dead and an unknown id: exit %d, want %d\n%s", r.code, exitNotFound, r.stderr)
		}
		decode(t, r, &out)
		if out.Affected != 1 || !slices.Equal(out.NotFound, []string{unknownID}) || stateOf(t, d, f.dead1) != "due" {
			t.Errorf("requeue of a dead and an unknown id: %+v, dead1 %s", out, stateOf(t, d, f.dead1))
		}
		r = cli(t, nil, nil, "dead", "discard", "--db", d.dsn, unknownID, f.dead2)
		if r.code != exitNotFound || r.stdout != "discarded 1 events\n" || !strings.Contains(r.stderr, unknownID) || stateOf(t, d, f.dead2) != "" {
			t.Errorf("discard of an unknown and a dead id: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		}

		// An id whose event is there, in a state the command leaves alone: named with its state, exit 0.
		r = ok(t, "dead", "discard", "--db", d.dsn, f.waiting)
		if !strings.Contains(r.stderr, f.waiting+" is waiting") {
			t.Errorf("discard of a waiting event: stderr %q", r.stderr)
		}
	})
}

// addProcessed writes n processed events of type eventType into d's table in one statement.
func addProcessed(t *testing.T, d *testDB, eventType string, n int) {
	t.Helper()
	if err := d.db.Transaction(func(tx *gorm.DB) error {
		return outboxplugin.Emit(tx, eventType, map[string]any{"n": 0})
	}); err != nil {
		t.Fatal(err)
	}
	err := d.db.Exec(`WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < ?)
		INSERT INTO outbox_events (message_id, event_type, aggregate_type, aggregate_id, payload, headers, created_at, processed, processed_at, attempts)
		SELECT printf('bulk-%d', i), e.event_type, e.aggregate_type, e.aggregate_id, e.payload, e.headers, e.created_at, true, e.created_at, 1
		FROM seq, (SELECT * FROM outbox_events WHERE event_type = ? LIMIT 1) e`, n-1, eventType).Error
	if err != nil {
		t.Fatal(err)
	}
	if err := d.db.Exec(`UPDATE outbox_events SET processed = true, processed_at = created_at WHERE event_type = ?`, eventType).Error; err != nil {
		t.Fatal(err)
	}
}

// A search among processed events that stopped at its bound without finding anything does not say
// "more events": it says that the search stopped, and JSON says partial.
func TestEventsListPartialSearch(t *testing.T) {
	d := newSQLiteDB(t)
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}
	addProcessed(t, d, "Bulk", outboxplugin.MaxProcessedScan+10)

	r := ok(t, "events", "list", "--db", d.dsn, "--type", "NoSuchType")
	if strings.Contains(r.stderr, "more events") || !strings.Contains(r.stderr, "the search stopped after reading 20000 processed events") ||
		!strings.Contains(r.stderr, "--cursor ") {
		t.Errorf("a bounded search that found nothing: stderr %q", r.stderr)
	}
	var page struct {
		Events     []eventJSON `json:"events"`
		NextCursor string      `json:"next_cursor"`
		Partial    *bool       `json:"partial"`
		SearchedTo *time.Time  `json:"searched_to"`
	}
	decode(t, ok(t, "events", "list", "--db", d.dsn, "--type", "NoSuchType", "--json"), &page)
	if len(page.Events) != 0 || page.Partial == nil || !*page.Partial || page.SearchedTo == nil || page.NextCursor == "" {
		t.Fatalf("a bounded search that found nothing, JSON: %+v", page)
	}
	// Its cursor searches on, to the end: the rest of the rows, and no more.
	decode(t, ok(t, "events", "list", "--db", d.dsn, "--type", "NoSuchType", "--json", "--cursor", page.NextCursor), &page)
	if len(page.Events) != 0 || page.Partial == nil || *page.Partial || page.NextCursor != "" {
		t.Errorf("the search's second page: %+v", page)
	}

	// A full page with more after it is "more events", and not partial.
	r = ok(t, "events", "list", "--db", d.dsn, "--limit", "2")
	if !strings.Contains(r.stderr, "more events: add --cursor ") || strings.Contains(r.stderr, "stopped") {
		t.Errorf("a full page: stderr %q", r.stderr)
	}
	decode(t, ok(t, "events", "list", "--db", d.dsn, "--limit", "2", "--json"), &page)
	if len(page.Events) != 2 || page.Partial == nil || *page.Partial || page.NextCursor == "" {
		t.Errorf("a full page, JSON: %+v", page)
	}
}

// --limit 0 and negative limits are usage errors, not the default page.
func TestEventsListLimit(t *testing.T) {
	d := newSQLiteDB(t)
	addFixture(t, d)
	for _, limit := range []string{"0", "-1", "1001"} {
		r := wantCode(t, exitUsage, "events", "list", "--db", d.dsn, "--limit", limit)
		if !strings.Contains(r.stderr, "--limit "+limit+": want 1..1000") {
			t.Errorf("--limit %s: stderr %q", limit, r.stderr)
		}
	}
	if ids, _ := listIDs(t, d, "--limit", "1"); len(ids) != 1 {
		t.Errorf("--limit 1 lists %d events", len(ids))
	}
}

// A command other than migrate refuses a SQLite path that does not exist, naming it, and leaves no
// file behind; migrate creates it.
func TestSQLiteFileNotCreated(t *testing.T) {
	dir := t.TempDir()
	forms := map[string]func(string) string{
		"path":       func(p string) string { return p },
		"sqlite://":  func(p string) string { return "sqlite://" + p },
		"file: URI":  func(p string) string { return "file:" + p + "?_busy_timeout=5000" },
		"with query": func(p string) string { return p + "?_busy_timeout=5000" },
	}
	i := 0
	for _, args := range [][]string{
		{"status"}, {"events", "list"}, {"events", "show", unknownID}, {"dead", "requeue", unknownID},
		{"dead", "discard", "--all", "--yes"}, {"events", "deliver-now", unknownID}, {"cleanup", "--older-than", "1d"},
		{"migrate", "--dry-run"}, {"ui", "--http", "127.0.0.1:0"}, {"relay", "--broker", "redis://127.0.0.1:1/0", "--http", ""},
	} {
		for name, form := range forms {
			i++
			path := filepath.Join(dir, fmt.Sprintf("typo-%d.db", i))
			r := cli(t, nil, nil, append(args, "--db", form(path))...)
			if r.code != exitFailed || !strings.Contains(r.stderr, "no SQLite database at "+path+": the file does not exist") {
				t.Errorf("%v on a missing file (%s): exit %d, stderr %q", args, name, r.code, r.stderr)
			}
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%v on a missing file (%s) created it: %v", args, name, err)
			}
		}
	}
	path := filepath.Join(dir, "new.db")
	ok(t, "migrate", "--db", path)
	if r := ok(t, "status", "--db", path); !strings.Contains(r.stdout, "pending") {
		t.Errorf("status after migrate created the file:\n%s", r.stdout)
	}
}

// A table that does not exist is named, with the command that creates it and the flag that names
// another, on every database.
func TestMissingTableHint(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		addFixture(t, d) // outbox_events exists; the commands below ask for another table
		for _, args := range [][]string{
			{"status"}, {"events", "list"}, {"events", "show", unknownID}, {"dead", "requeue", unknownID},
			{"dead", "discard", "--all", "--yes"}, {"cleanup", "--older-than", "1d"}, {"ui", "--http", "127.0.0.1:0"},
		} {
			r := cli(t, nil, nil, append(args, "--db", d.dsn, "--table", "no_such_outbox")...)
			if r.code != exitFailed || !strings.Contains(r.stderr, "The outbox table no_such_outbox does not exist in this database: "+
				"create it with outbox migrate (with the same --db and --table), or give --table") {
				t.Errorf("%v of a missing table: exit %d, stderr %q", args, r.code, r.stderr)
			}
		}
		if d.name == "postgres" { // a schema that does not exist either
			r := cli(t, nil, nil, "status", "--db", d.dsn, "--table", "nowhere.events")
			if r.code != exitFailed || !strings.Contains(r.stderr, "The outbox table nowhere.events does not exist") {
				t.Errorf("status of a table in a missing schema: exit %d, stderr %q", r.code, r.stderr)
			}
		}
		if r := ok(t, "status", "--db", d.dsn); strings.Contains(r.stderr, "does not exist") {
			t.Errorf("status of the table that is there: stderr %q", r.stderr)
		}
	})
}

// A flag of another broker is refused, naming the flag and its broker, from the command line and from
// its variable; a flag of the broker in use is not.
func TestRelayRefusesAnotherBrokersFlags(t *testing.T) {
	db := filepath.Join(t.TempDir(), "outbox.db")
	_, caPath := selfSignedTLS(t)
	brokerFile := filepath.Join(t.TempDir(), "broker")
	if err := os.WriteFile(brokerFile, []byte("nats://127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"--broker", "redis://127.0.0.1:1/0", "--topic", "orders"}, "--topic (or OUTBOX_TOPIC) is a flag of Kafka, and the broker is redis://"},
		{nil, []string{"--broker", "redis://127.0.0.1:1/0", "--subject-prefix", "shop"}, "--subject-prefix (or OUTBOX_SUBJECT_PREFIX) is a flag of NATS, and the broker is redis://"},
		{nil, []string{"--broker", "nats://127.0.0.1:1", "--exchange", "shop"}, "--exchange (or OUTBOX_EXCHANGE) is a flag of RabbitMQ, and the broker is nats://"},
		{nil, []string{"--broker", "kafka://127.0.0.1:1", "--stream", "ORDERS"}, "--stream (or OUTBOX_STREAM) is a flag of NATS and Redis, and the broker is kafka://"},
		{nil, []string{"--broker", "amqp://127.0.0.1:1/", "--kafka-ca-file", caPath}, "--kafka-ca-file (or OUTBOX_KAFKA_CA_FILE) is a flag of Kafka, and the broker is amqp://"},
		{[]string{"OUTBOX_STREAM=ORDERS"}, []string{"--broker", "amqp://127.0.0.1:1/"}, "--stream (or OUTBOX_STREAM) is a flag of NATS and Redis, and the broker is amqp://"},
		{nil, []string{"--broker-file", brokerFile, "--topic", "orders"}, "is a flag of Kafka, and the broker is nats://"},
	} {
		r := cli(t, c.env, nil, append([]string{"relay", "--db", db, "--http", ""}, c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v %v: exit %d, stderr %q, want %q", c.env, c.args, r.code, r.stderr, c.want)
		}
	}
	// The broker's own flags pass this check: the run goes on to the database, which is not there.
	for _, args := range [][]string{
		{"--broker", "redis://127.0.0.1:1/0", "--stream", "orders"},
		{"--broker", "nats://127.0.0.1:1", "--stream", "ORDERS", "--subject-prefix", "shop"},
		{"--broker", "amqp://127.0.0.1:1/", "--exchange", "shop"},
		{"--broker", "kafka://127.0.0.1:1", "--topic", "orders"},
	} {
		r := cli(t, nil, nil, append([]string{"relay", "--db", db, "--http", ""}, args...)...)
		if r.code != exitFailed || !strings.Contains(r.stderr, "no SQLite database at") {
			t.Errorf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}

// dead groups counts the dead events by error alone (one cause over several types is one group), or
// by type and error; dead requeue --error requeues a whole cause, and nothing else.
func TestDeadGroupsAndCauses(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d) // dead1 OrderPlaced, dead2 OrderShipped: "broker down"; waiting: "timeout"
		sched := addScheduled(t, d)
		var other string
		if err := d.db.Transaction(func(tx *gorm.DB) error { return outboxplugin.Emit(tx, "OrderPaid", map[string]int{"n": 1}) }); err != nil {
			t.Fatal(err)
		}
		if err := d.db.Raw(`SELECT message_id FROM outbox_events ORDER BY id DESC LIMIT 1`).Scan(&other).Error; err != nil {
			t.Fatal(err)
		}
		if err := d.db.Table(outboxplugin.DefaultTableName).Where("message_id = ?", other).
			Updates(map[string]any{"dead_at": time.Now().UTC(), "attempts": 5, "last_error": "no stream"}).Error; err != nil {
			t.Fatal(err)
		}

		type group struct {
			EventType  string `json:"event_type"`
			LastError  string `json:"last_error"`
			Count      int64  `json:"count"`
			EventTypes int64  `json:"event_types"`
		}
		var out struct {
			By     string  `json:"by"`
			Groups []group `json:"groups"`
			More   bool    `json:"more"`
		}
		decode(t, ok(t, "dead", "groups", "--db", d.dsn, "--json"), &out)
		if want := []group{{"", "broker down", 2, 2}, {"", "no stream", 1, 1}}; out.By != "error" || !slices.Equal(out.Groups, want) || out.More {
			t.Errorf("dead groups --json: %+v, want %v", out, want)
		}
		r := ok(t, "dead", "groups", "--db", d.dsn)
		if !regexp.MustCompile(`(?m)^2\s+2\s+\S+\s+\S+\s+broker down$`).MatchString(r.stdout) || !strings.Contains(r.stderr, "--error") {
			t.Errorf("dead groups:\nstdout %s\nstderr %s", r.stdout, r.stderr)
		}
		decode(t, ok(t, "dead", "groups", "--db", d.dsn, "--by", "type", "--json", "--limit", "2"), &out)
		if out.By != "type" || len(out.Groups) != 2 || !out.More || out.Groups[0].EventTypes != 1 || out.Groups[0].EventType == "" {
			t.Errorf("dead groups --by type --limit 2: %+v", out)
		}

		// The whole cause in one requeue: both types, and nothing else.
		var res struct {
			Affected int64 `json:"affected"`
		}
		decode(t, ok(t, "dead", "requeue", "--db", d.dsn, "--all", "--yes", "--state", "dead", "--error", "broker down", "--json"), &res)
		if res.Affected != 2 {
			t.Errorf("requeue of the cause: %+v, want 2", res)
		}
		for id, want := range map[string]string{f.dead1: "due", f.dead2: "due", other: "dead", f.waiting: "waiting", sched[0]: "scheduled"} {
			if st := stateOf(t, d, id); st != want {
				t.Errorf("after the requeue of the cause, %s is %s, want %s", id, st, want)
			}
		}
		if ids, _ := listIDs(t, d, "--error", "timeout"); !slices.Equal(ids, []string{f.waiting}) {
			t.Errorf("events list --error timeout: %v", ids)
		}
		for _, args := range [][]string{{"--by", "cause"}, {"--limit", "0"}, {"--limit", "1001"}, {"extra"}} {
			wantCode(t, exitUsage, append([]string{"dead", "groups", "--db", d.dsn}, args...)...)
		}
	})
}
