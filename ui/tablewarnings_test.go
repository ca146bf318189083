package outboxui_test

import (
	"database/sql"
	"html"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	mysqldriver "github.com/go-sql-driver/mysql"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
)

func mysqlServerDSN() string {
	if dsn := os.Getenv("OUTBOX_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/"
}

// newMySQL is a MySQL/MariaDB database of t's own, dropped when t ends. Only the table warning tests
// run on it: what else the console shows does not depend on the database past the Admin, whose own
// tests cover MySQL.
func newMySQL(t testing.TB) *testDB {
	t.Helper()
	admin, err := sql.Open("mysql", mysqlServerDSN())
	if err == nil {
		err = admin.Ping()
	}
	if err != nil {
		if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("MySQL unreachable and OUTBOX_REQUIRE_DBS=1: %v", err)
		}
		t.Skipf("MySQL unreachable: %v", err)
	}
	defer admin.Close()
	name := testName("db")
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	var db *gorm.DB
	t.Cleanup(func() {
		if db != nil {
			if s, err := db.DB(); err == nil {
				s.Close()
			}
		}
		admin, err := sql.Open("mysql", mysqlServerDSN())
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close()
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg, err := mysqldriver.ParseDSN(mysqlServerDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName, cfg.ParseTime = name, true
	db, err = gorm.Open(mysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	return prepare(t, "mysql", db)
}

// gormTable re-creates d's outbox table with GORM's own db.AutoMigrate, as an application that never
// called outboxplugin.AutoMigrate has it.
func gormTable(t testing.TB, d *testDB) {
	t.Helper()
	plain := d.db.Session(&gorm.Session{NewDB: true})
	if err := plain.Migrator().DropTable(&outboxplugin.OutboxEvent{}); err != nil {
		t.Fatal(err)
	}
	if err := plain.AutoMigrate(&outboxplugin.OutboxEvent{}); err != nil {
		t.Fatal(err)
	}
}

var warningRE = regexp.MustCompile(`(?s)<li data-warning="([a-z_]+)">(.*?)</li>`)

// The overview shows a warning box of what a table made by GORM's own db.AutoMigrate lacks, on each
// database, with the text the worker logs and outbox status prints; a table made by
// outboxplugin.AutoMigrate shows none. A table of an earlier version that kept its pending index
// shows that one, on every database.
func TestOverviewShowsTableWarnings(t *testing.T) {
	want := map[string][]string{
		"postgres": {"storage_settings", "reference_index", "dead_index"},
		"sqlite":   {"reference_index", "dead_index"},
		"mysql":    {"lease_defaults"},
	}
	for _, open := range []struct {
		name string
		open func(testing.TB) *testDB
	}{{"sqlite", newSQLite}, {"postgres", newPostgres}, {"mysql", newMySQL}} {
		t.Run(open.name, func(t *testing.T) {
			d := open.open(t)
			admin, err := outboxplugin.NewAdmin(d.db)
			if err != nil {
				t.Fatal(err)
			}
			srv, _ := serve(t, d)
			c := newClient(t, srv.URL)
			check := func(step string, codes []string) {
				t.Helper()
				res, body := c.get("/outbox/")
				wantStatus(t, res, body, http.StatusOK)
				var got []string
				items := warningRE.FindAllStringSubmatch(body, -1)
				for _, m := range items {
					got = append(got, m[1])
				}
				if !slices.Equal(got, codes) {
					t.Errorf("%s: the overview warns of %v, want %v", step, got, codes)
				}
				if box := strings.Contains(body, "data-table-warnings"); box != (len(codes) > 0) {
					t.Errorf("%s: warning box shown: %v, want %v", step, box, len(codes) > 0)
				}
				st, err := admin.Stats(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				for i, m := range items {
					if i >= len(st.TableWarnings) {
						break
					}
					text := html.UnescapeString(strings.NewReplacer("<strong>", "", "</strong>", "").Replace(m[2]))
					if text != st.TableWarnings[i].String() {
						t.Errorf("%s: the overview says\n%s\nStats says\n%s", step, text, st.TableWarnings[i])
					}
				}
			}
			gormTable(t, d)
			check("db.AutoMigrate", want[d.name])
			if err := outboxplugin.AutoMigrate(d.db); err != nil {
				t.Fatal(err)
			}
			check("outboxplugin.AutoMigrate", nil)
			if err := d.db.Exec(`CREATE INDEX idx_outbox_events_pending ON outbox_events (created_at, id)`).Error; err != nil {
				t.Fatal(err)
			}
			check("the pending index of an earlier version", []string{"pending_index"})
		})
	}
}

// The warning box is visible in a browser, above the counts, and passes the page checks.
func TestBrowserShowsTableWarnings(t *testing.T) {
	needChromium(t)
	d := newPostgres(t)
	gormTable(t, d)
	addFixture(t, d)
	srv, _ := serve(t, d)
	b := newBrowser(t)
	if status := b.open(srv.URL + "/outbox/"); status != http.StatusOK {
		t.Fatalf("overview: %d", status)
	}
	visible := evaluate[bool](b, `(() => {
  const box = document.querySelector("[data-table-warnings]"), cards = document.querySelector(".cards");
  if (!box || !cards) return false;
  const r = box.getBoundingClientRect();
  return r.height > 0 && r.width > 0 && getComputedStyle(box).visibility === "visible" && r.bottom <= cards.getBoundingClientRect().top;
})()`)
	if !visible {
		t.Error("the warning box is not visible above the counts")
	}
	if got := b.text(`[data-warning="storage_settings"]`); !strings.Contains(got, "Fix: run outboxplugin.AutoMigrate(db)") {
		t.Errorf("the storage settings warning reads %q", got)
	}
	b.screenshot("overview-table-warnings")
	b.noConsoleErrors()
}
