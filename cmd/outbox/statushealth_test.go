package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
)

// status prints the table's health under TABLE HEALTH, with the figures each database keeps, and
// --json has them under "health".
func TestStatusTableHealth(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		addFixture(t, d)
		r := ok(t, "status", "--db", d.dsn)
		lines := map[string][]string{
			"postgres": {`size\s+\d.*bytes\)`, `  indexes\s+\d`, `dead rows\s+\d+`, `live rows\s+~\d+`, `last vacuum\s+(never|\d{4}-\d\d-\d\dT.* ago\))`,
				`partitions\s+none \(not partitioned\)`},
			"mysql":  {`size\s+\d.*bytes\)`, `  indexes\s+\d`, `free space\s+\d`, `purge lag\s+\d+`, `partitions\s+none \(not partitioned\)`},
			"sqlite": {`size\s+\d.*, the whole database file`, `free space\s+\d`},
		}[d.name]
		for _, line := range append([]string{`TABLE HEALTH`}, lines...) {
			if !regexp.MustCompile(`(?m)^` + line + `.*$`).MatchString(r.stdout) {
				t.Errorf("status has no line %q:\n%s", line, r.stdout)
			}
		}
		if d.name != "postgres" && strings.Contains(r.stdout, "dead rows") {
			t.Errorf("%s keeps no dead rows, yet status prints them:\n%s", d.name, r.stdout)
		}
		if strings.Contains(r.stdout, unknown) || strings.Contains(r.stderr, "ALERT") {
			t.Errorf("a figure unknown or an alert on a fresh table:\n%s\n%s", r.stdout, r.stderr)
		}

		var st outboxplugin.Stats
		decode(t, ok(t, "status", "--db", d.dsn, "--json"), &st)
		if st.Health.TotalBytes == nil || *st.Health.TotalBytes <= 0 || st.Health.Partitions != nil || len(st.Health.Unread) > 0 {
			t.Errorf("status --json health: %+v", st.Health)
		}
	})
}

// On a partitioned table (PostgreSQL), status lists the partitions with their ranges and ages, the
// default one last, and an ALERT on stderr for the rows in the default partition; the exit code
// stays 0.
func TestStatusPartitions(t *testing.T) {
	s := servers[0]
	if s.name != "postgres" {
		t.Fatalf("servers[0] is %s", s.name)
	}
	d := newServerDB(t, s)
	stmts, err := outboxplugin.SchemaSQL("postgres", "outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -1)
	for _, stmt := range stmts {
		if strings.HasPrefix(stmt, "ALTER TABLE") {
			continue // no storage settings on a partitioned table
		}
		if strings.HasPrefix(stmt, "CREATE TABLE") {
			stmt = strings.Replace(stmt, "PRIMARY KEY (id)", "PRIMARY KEY (id, created_at)", 1) + " PARTITION BY RANGE (created_at)"
		}
		mustExec(t, d, stmt)
	}
	mustExec(t, d, "CREATE TABLE outbox_events_p"+day.Format("20060102")+" PARTITION OF outbox_events FOR VALUES FROM ('"+
		day.Format(time.RFC3339)+"') TO ('"+day.AddDate(0, 0, 1).Format(time.RFC3339)+"')")
	mustExec(t, d, "CREATE TABLE outbox_events_default PARTITION OF outbox_events DEFAULT")
	mustExec(t, d, "INSERT INTO outbox_events (message_id, event_type, payload, created_at) VALUES "+
		"('a', 'OrderPlaced', '{}', '"+day.Add(time.Hour).Format(time.RFC3339)+"'), ('b', 'OrderPlaced', '{}', now() + interval '30 days')")
	mustExec(t, d, "ANALYZE outbox_events")

	r := ok(t, "status", "--db", d.dsn)
	for _, line := range []string{`partitions\s+2`, `PARTITION\s+FROM\s+TO\s+AGE\s+SIZE\s+ROWS\s+DEAD ROWS`,
		`outbox_events_p` + day.Format("20060102") + `\s+` + regexp.QuoteMeta(day.Format(time.RFC3339)) + `\s+` +
			regexp.QuoteMeta(day.AddDate(0, 0, 1).Format(time.RFC3339)) + `\s+\d+h\d+m\d+s\s+\d.*\s+~1\s+\d+`,
		`outbox_events_default\s+-\s+DEFAULT\s+-\s+\d.*\s+~1\s+\d+`} {
		if !regexp.MustCompile(`(?m)^` + line + `\s*$`).MatchString(r.stdout) {
			t.Errorf("status has no line %q:\n%s", line, r.stdout)
		}
	}
	if !regexp.MustCompile(`(?m)^ALERT: the default partition outbox_events_default holds rows \(about 1,`).MatchString(r.stderr) {
		t.Errorf("no alert for the row in the default partition:\n%s", r.stderr)
	}
}

func mustExec(t *testing.T, d *testDB, stmt string) {
	t.Helper()
	if err := d.db.Exec(stmt).Error; err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// A figure the database keeps but that could not be read is printed "unknown", and what could not
// be read is noted on stderr; "never" is kept for a vacuum the statistics say never ran.
func TestStatusHealthUnknown(t *testing.T) {
	out, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	errOut, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	a := &app{dsn: "postgres://db.internal/shop", stdout: out, stderr: errOut}
	zero := int64(0)
	if err := a.printHealth(outboxplugin.TableHealth{IndexBytes: &zero, Unread: []string{"pg_partition_tree: permission denied"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	stdout, _ := os.ReadFile(out.Name())
	stderr, _ := os.ReadFile(errOut.Name())
	for _, line := range []string{`size\s+unknown`, `  rows\s+unknown`, `  indexes\s+0 B`, `dead rows\s+unknown`, `last vacuum\s+unknown`,
		`partitions\s+unknown`} {
		if !regexp.MustCompile(`(?m)^` + line + `\s*$`).Match(stdout) {
			t.Errorf("no line %q:\n%s", line, stdout)
		}
	}
	if strings.Contains(string(stdout), "purge lag") {
		t.Errorf("PostgreSQL has no purge lag, yet it is printed:\n%s", stdout)
	}
	if !strings.Contains(string(stderr), "could not read pg_partition_tree: permission denied") {
		t.Errorf("stderr: %s", stderr)
	}

	dead := int64(3)
	out.Truncate(0)
	out.Seek(0, 0)
	if err := a.printHealth(outboxplugin.TableHealth{DeadRows: &dead}, time.Now()); err != nil {
		t.Fatal(err)
	}
	stdout, _ = os.ReadFile(out.Name())
	if !regexp.MustCompile(`(?m)^last vacuum\s+never$`).Match(stdout) {
		t.Errorf("a table whose statistics were read and show no vacuum:\n%s", stdout)
	}
}
