package outboxui_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
)

// healthCardRE finds the overview's table health figures: data-health and the text shown.
var healthCardRE = regexp.MustCompile(`<dd data-health="([a-z_]+)"[^>]*>(.*?)</dd>`)

// The overview shows the table health figures each database gives (a size on each, dead rows and
// the last vacuum on PostgreSQL, free space on SQLite and MariaDB, the purge lag on MariaDB), none it
// does not, and no alert on a fresh table.
func TestOverviewShowsTableHealth(t *testing.T) {
	want := map[string][]string{
		"sqlite":   {"total_bytes", "free_bytes", "partitions"},
		"postgres": {"total_bytes", "table_bytes", "index_bytes", "live_rows", "dead_rows", "last_vacuum", "partitions"},
		"mysql":    {"total_bytes", "table_bytes", "index_bytes", "free_bytes", "live_rows", "purge_lag", "partitions"},
	}
	for _, open := range []struct {
		name string
		open func(testing.TB) *testDB
	}{{"sqlite", newSQLite}, {"postgres", newPostgres}, {"mysql", newMySQL}} {
		t.Run(open.name, func(t *testing.T) {
			d := open.open(t)
			addFixture(t, d)
			srv, _ := serve(t, d)
			res, body := newClient(t, srv.URL).get("/outbox/")
			wantStatus(t, res, body, http.StatusOK)
			got := map[string]string{}
			var names []string
			for _, m := range healthCardRE.FindAllStringSubmatch(body, -1) {
				got[m[1]] = m[2]
				names = append(names, m[1])
			}
			if strings.Join(names, " ") != strings.Join(want[d.name], " ") {
				t.Errorf("the overview shows %v, want %v", names, want[d.name])
			}
			if !regexp.MustCompile(`^\d+\.\d (KiB|MiB)$`).MatchString(got["total_bytes"]) {
				t.Errorf("size on disk %q", got["total_bytes"])
			}
			if got["partitions"] != "none" {
				t.Errorf("partitions %q, want none", got["partitions"])
			}
			if strings.Contains(body, "data-health-alerts") || strings.Contains(body, "data-health-unread") {
				t.Errorf("an alert or an unread figure on a fresh table")
			}
		})
	}
}

// partitionedTable re-creates d's outbox table (PostgreSQL) partitioned by day of created_at: the
// partitions of yesterday and today, and the default one, which holds an event written a month
// ahead. It returns yesterday.
func partitionedTable(t testing.TB, d *testDB) time.Time {
	t.Helper()
	exec := func(stmt string) {
		t.Helper()
		if err := d.db.Exec(stmt).Error; err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	plain := d.db.Session(&gorm.Session{NewDB: true})
	if err := plain.Migrator().DropTable(&outboxplugin.OutboxEvent{}); err != nil {
		t.Fatal(err)
	}
	stmts, err := outboxplugin.SchemaSQL("postgres", "outbox_events")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range stmts {
		if strings.HasPrefix(stmt, "ALTER TABLE") {
			continue // no storage settings on a partitioned table
		}
		if strings.HasPrefix(stmt, "CREATE TABLE") {
			stmt = strings.Replace(stmt, "PRIMARY KEY (id)", "PRIMARY KEY (id, created_at)", 1) + " PARTITION BY RANGE (created_at)"
		}
		exec(stmt)
	}
	yesterday := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -1)
	for _, day := range []time.Time{yesterday, yesterday.AddDate(0, 0, 1)} {
		exec("CREATE TABLE outbox_events_p" + day.Format("20060102") + " PARTITION OF outbox_events FOR VALUES FROM ('" +
			day.Format(time.RFC3339) + "') TO ('" + day.AddDate(0, 0, 1).Format(time.RFC3339) + "')")
	}
	exec("CREATE TABLE outbox_events_default PARTITION OF outbox_events DEFAULT")
	exec("INSERT INTO outbox_events (message_id, event_type, payload, created_at) VALUES " +
		"('p1', 'OrderPlaced', '{}', '" + yesterday.Add(time.Hour).Format(time.RFC3339) + "'), ('p2', 'OrderPlaced', '{}', now() + interval '30 days')")
	exec("ANALYZE outbox_events")
	return yesterday
}

// On a partitioned table the overview lists the partitions with their ranges, the default one last
// and marked, and the alert for the row in it.
func TestOverviewShowsPartitions(t *testing.T) {
	d := newPostgres(t)
	yesterday := partitionedTable(t, d)
	srv, _ := serve(t, d)
	res, body := newClient(t, srv.URL).get("/outbox/")
	wantStatus(t, res, body, http.StatusOK)
	rows := regexp.MustCompile(`<tr data-partition="([a-z0-9_]+)"( data-default)?>`).FindAllStringSubmatch(body, -1)
	var names []string
	for _, r := range rows {
		names = append(names, r[1]+r[2])
	}
	want := []string{"outbox_events_p" + yesterday.Format("20060102"), "outbox_events_p" + yesterday.AddDate(0, 0, 1).Format("20060102"),
		"outbox_events_default data-default"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("partitions %v, want %v", names, want)
	}
	if !strings.Contains(body, yesterday.Format("2006-01-02 15:04:05.000 UTC")) {
		t.Errorf("the first partition's lower bound is not shown")
	}
	if !strings.Contains(body, `<li data-alert="default_partition_rows">`) {
		t.Errorf("no alert for the row in the default partition")
	}
}

// In a browser the table health section, its partitions and its alert are visible, below the counts,
// and the page passes the page checks.
func TestBrowserShowsTableHealth(t *testing.T) {
	needChromium(t)
	d := newPostgres(t)
	partitionedTable(t, d)
	srv, _ := serve(t, d)
	b := newBrowser(t)
	if status := b.open(srv.URL + "/outbox/"); status != http.StatusOK {
		t.Fatalf("overview: %d", status)
	}
	visible := evaluate[bool](b, `(() => {
  const section = document.querySelector("[data-table-health]"), cards = document.querySelector(".cards");
  const alerts = document.querySelector("[data-health-alerts]"), parts = document.querySelector("[data-partitions]");
  if (!section || !cards || !alerts || !parts) return false;
  const shown = e => { const r = e.getBoundingClientRect(); return r.height > 0 && r.width > 0 && getComputedStyle(e).visibility === "visible"; };
  return shown(section) && shown(alerts) && shown(parts) && section.getBoundingClientRect().top >= cards.getBoundingClientRect().bottom;
})()`)
	if !visible {
		t.Error("the table health section, its alert and its partitions are not all visible below the counts")
	}
	if got := b.text(`[data-alert="default_partition_rows"]`); !strings.Contains(got, "outbox_events_default") {
		t.Errorf("the alert reads %q", got)
	}
	if got := b.text(`tr[data-default] td.alert`); !strings.Contains(got, "1") {
		t.Errorf("the default partition's rows read %q, marked as an alert", got)
	}
	b.screenshot("overview-table-health")
	b.noConsoleErrors()
}

// A figure the console's database user may not read is not shown, and a line says which and why: a
// MariaDB user without the PROCESS privilege cannot read the purge lag; the rest of the overview is
// there.
func TestOverviewShowsUnreadHealth(t *testing.T) {
	d := newMySQL(t)
	addFixture(t, d)
	var schema string
	if err := d.db.Raw("SELECT DATABASE()").Scan(&schema).Error; err != nil {
		t.Fatal(err)
	}
	user := testName("user")
	exec := func(stmt string) {
		t.Helper()
		if err := d.db.Exec(stmt).Error; err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	exec("CREATE USER '" + user + "'@'%'")
	t.Cleanup(func() { d.db.Exec("DROP USER '" + user + "'@'%'") })
	exec("GRANT SELECT ON " + schema + ".* TO '" + user + "'@'%'")
	cfg, err := mysqldriver.ParseDSN(mysqlServerDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd, cfg.DBName, cfg.ParseTime = user, "", schema, true
	limited, err := gorm.Open(mysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := limited.DB(); err == nil {
			s.Close()
		}
	})
	srv, _ := serve(t, &testDB{name: "mysql", db: limited})
	res, body := newClient(t, srv.URL).get("/outbox/")
	wantStatus(t, res, body, http.StatusOK)
	unread := regexp.MustCompile(`<p class="hint" data-health-unread>([^<]*)</p>`).FindStringSubmatch(body)
	if unread == nil || !strings.Contains(unread[1], "INNODB_METRICS") {
		t.Errorf("no line naming the unread purge lag: %q", unread)
	}
	if strings.Contains(body, `data-health="purge_lag"`) {
		t.Error("the purge lag is shown though it could not be read")
	}
	if !strings.Contains(body, `data-health="total_bytes"`) || !strings.Contains(body, `data-count="pending"`) {
		t.Error("the rest of the overview is missing")
	}
}
