package tooltest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	migratedb "github.com/golang-migrate/migrate/v4/database"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	migratesqlite "github.com/golang-migrate/migrate/v4/database/sqlite3"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/pressly/goose/v3"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// tool applies the outbox's migration files with a real migration tool, used as a library.
type tool struct {
	format outboxplugin.MigrationFormat
	// migrate brings d's table to version (0: down to nothing; -1: every version).
	migrate func(t *testing.T, d *database, fsys fs.FS, version int)
}

var tools = []tool{
	{outboxplugin.GolangMigrate, golangMigrate},
	{outboxplugin.Goose, gooseMigrate},
}

// golangMigrate runs golang-migrate on d, over a pool of its own (it closes it).
func golangMigrate(t *testing.T, d *database, fsys fs.FS, version int) {
	t.Helper()
	m := newGolangMigrate(t, d, fsys)
	defer closeMigrate(t, m)
	var err error
	switch version {
	case -1:
		err = m.Up()
	case 0:
		err = m.Down()
	default:
		err = m.Migrate(uint(version))
	}
	if err != nil && !errors.Is(err, migrate.ErrNoChange) {
		t.Fatalf("golang-migrate to version %d: %v", version, err)
	}
}

func newGolangMigrate(t *testing.T, d *database, fsys fs.FS) *migrate.Migrate {
	t.Helper()
	src, err := iofs.New(fsys, ".")
	if err != nil {
		t.Fatal(err)
	}
	pool := d.open(t)
	var drv migratedb.Driver
	switch d.name {
	case "postgres":
		drv, err = migratepgx.WithInstance(pool, &migratepgx.Config{})
	case "mysql":
		drv, err = migratemysql.WithInstance(pool, &migratemysql.Config{})
	default:
		drv, err = migratesqlite.WithInstance(pool, &migratesqlite.Config{})
	}
	if err != nil {
		t.Fatal(err)
	}
	m, err := migrate.NewWithInstance("iofs", src, d.name, drv)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func closeMigrate(t *testing.T, m *migrate.Migrate) {
	t.Helper()
	if srcErr, dbErr := m.Close(); srcErr != nil || dbErr != nil {
		t.Errorf("close golang-migrate: %v, %v", srcErr, dbErr)
	}
}

// gooseMigrate runs goose's provider on d, over a pool of its own (it closes it).
func gooseMigrate(t *testing.T, d *database, fsys fs.FS, version int) {
	t.Helper()
	dialect := map[string]goose.Dialect{"postgres": goose.DialectPostgres, "mysql": goose.DialectMySQL, "sqlite": goose.DialectSQLite3}[d.name]
	p, err := goose.NewProvider(dialect, d.open(t), fsys)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Close(); err != nil {
			t.Errorf("close goose: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch version {
	case -1:
		_, err = p.Up(ctx)
	case 0:
		_, err = p.DownTo(ctx, 0)
	default:
		_, err = p.UpTo(ctx, int64(version))
	}
	if err != nil {
		t.Fatalf("goose to version %d: %v", version, err)
	}
}

// reference is the outbox table outboxplugin.AutoMigrate makes on a fresh database of s.
func reference(t *testing.T, s server) []string {
	t.Helper()
	ref := freshDatabase(t, s)
	if err := outboxplugin.AutoMigrate(ref.gorm); err != nil {
		t.Fatal(err)
	}
	return catalog(t, ref, outboxplugin.DefaultTableName)
}

// checkTable checks that d's outbox table is what AutoMigrate makes (want), that AutoMigrate has
// nothing to run on it, and that a worker relays its events: the pending ones already there (old)
// and one written now through the plugin.
func checkTable(t *testing.T, d *database, want []string, old int) {
	t.Helper()
	got := catalog(t, d, outboxplugin.DefaultTableName)
	if !equal(got, want) {
		t.Errorf("the table the files made differs from AutoMigrate's:\n got: %q\nwant: %q", got, want)
	}
	plan, err := outboxplugin.PlanMigration(d.gorm)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) > 0 {
		t.Errorf("AutoMigrate would run, on the table the files made: %q", plan)
	}

	app := d.newGorm(t)
	if err := app.Use(outboxplugin.New()); err != nil {
		t.Fatal(err)
	}
	if err := app.Transaction(func(tx *gorm.DB) error { return outboxplugin.Emit(tx, "Order_placed", map[string]int{"id": 7}) }); err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		published []string
	)
	pub := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			published = append(published, m.EventType)
		}
		return nil
	})
	w, err := outboxplugin.NewWorker(d.gorm, pub)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := w.ProcessOnce(ctx)
	if err != nil {
		t.Fatalf("the worker refuses the table: %v", err)
	}
	if n != old+1 || len(published) != old+1 || published[len(published)-1] != "Order_placed" {
		t.Errorf("the worker published %d events (%v), want the %d old ones and Order_placed", n, published, old)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// insertOld writes a pending event as a table of the first version holds it (its columns only).
func insertOld(t *testing.T, d *database) {
	t.Helper()
	if err := d.gorm.Exec(`INSERT INTO outbox_events (message_id, event_type, payload, created_at) VALUES (?, ?, ?, ?)`,
		"0190d5a8-0000-7000-8000-000000000001", "Old_create", `{"id": 1}`, time.Now().UTC()).Error; err != nil {
		t.Fatal(err)
	}
}

// golang-migrate and goose apply the files as they are to a fresh database, which ends with the
// table AutoMigrate makes, one AutoMigrate finds nothing to do on, and a worker relays from; both
// take them down to nothing and up again.
func TestToolsMakeWhatAutoMigrateMakes(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			want := reference(t, s)
			for _, tl := range tools {
				t.Run(string(tl.format), func(t *testing.T) {
					fsys, err := outboxplugin.MigrationFiles(tl.format, s.name, "")
					if err != nil {
						t.Fatal(err)
					}
					d := freshDatabase(t, s)
					tl.migrate(t, d, fsys, -1)
					checkTable(t, d, want, 0)

					tl.migrate(t, d, fsys, 0)
					if d.gorm.Migrator().HasTable(outboxplugin.DefaultTableName) {
						t.Fatal("the down migrations left the table")
					}
					tl.migrate(t, d, fsys, -1)
					checkTable(t, d, want, 0)
				})
			}
		})
	}
}

// A table of each earlier version, holding a pending event, brought up to date by the tool: the
// steps after its version make the table AutoMigrate makes, and its event is relayed.
func TestToolsUpgradeATableOfEachEarlierVersion(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			want := reference(t, s)
			for _, tl := range tools {
				fsys, err := outboxplugin.MigrationFiles(tl.format, s.name, "")
				if err != nil {
					t.Fatal(err)
				}
				for version := 1; version < 6; version++ {
					t.Run(fmt.Sprintf("%s/from %d", tl.format, version), func(t *testing.T) {
						d := freshDatabase(t, s)
						tl.migrate(t, d, fsys, version)
						insertOld(t, d)
						tl.migrate(t, d, fsys, -1)
						checkTable(t, d, want, 1)
					})
				}
			}
		})
	}
}

// A table made before the tool managed it — here by AutoMigrate of the first version, as the file of
// version 1 makes it — is handed to golang-migrate with force (the version it is at), and the
// following steps bring it up to date. Before they do, the worker refuses it, naming AutoMigrate.
func TestGolangMigrateTakesOverATableMadeByAutoMigrate(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			want := reference(t, s)
			fsys, err := outboxplugin.MigrationFiles(outboxplugin.GolangMigrate, s.name, "")
			if err != nil {
				t.Fatal(err)
			}
			d := freshDatabase(t, s)
			v1, err := fs.ReadFile(fsys, "000001_create_table.up.sql")
			if err != nil {
				t.Fatal(err)
			}
			execAll(t, d.db, string(v1))
			insertOld(t, d)
			w, err := outboxplugin.NewWorker(d.gorm, outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error { return nil }))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := w.Run(ctx); err == nil || ctx.Err() != nil {
				t.Fatalf("Run on a table of the first version: %v, want a refusal at once", err)
			}

			m := newGolangMigrate(t, d, fsys)
			if err := m.Force(1); err != nil {
				t.Fatal(err)
			}
			if err := m.Up(); err != nil {
				t.Fatal(err)
			}
			closeMigrate(t, m)
			checkTable(t, d, want, 1)
		})
	}
}

// execAll runs a file's statements as one query, as golang-migrate does.
func execAll(t *testing.T, db *sql.DB, body string) {
	t.Helper()
	if _, err := db.Exec(body); err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
}

// The files of a partitioned table (MigrationFiles with WithPartitions), applied by each tool to a
// fresh database, make the table AutoMigrate with the option makes, partitions and all; AutoMigrate
// with the option then has nothing to do, a worker relays from it, and the down migration drops it.
func TestToolsMakeAPartitionedTable(t *testing.T) {
	for _, s := range servers {
		if s.name == "sqlite" {
			continue // no partitions
		}
		t.Run(s.name, func(t *testing.T) {
			for _, tl := range tools {
				t.Run(string(tl.format), func(t *testing.T) {
					// The files and AutoMigrate make the partitions of the day they run: the same day,
					// unless midnight UTC passes between them (then once more).
					var want []string
					var d *database
					var fsys fs.FS
					for attempt := 0; attempt < 2; attempt++ {
						day := time.Now().UTC().Format(time.DateOnly)
						ref := freshDatabase(t, s)
						if err := outboxplugin.AutoMigrate(ref.gorm, outboxplugin.WithPartitions(0)); err != nil {
							t.Fatal(err)
						}
						want = catalog(t, ref, outboxplugin.DefaultTableName)
						var err error
						fsys, err = outboxplugin.MigrationFiles(tl.format, s.name, "", outboxplugin.WithPartitions(0))
						if err != nil {
							t.Fatal(err)
						}
						d = freshDatabase(t, s)
						tl.migrate(t, d, fsys, -1)
						if time.Now().UTC().Format(time.DateOnly) == day {
							break
						}
					}
					if !slices.ContainsFunc(want, func(l string) bool { return strings.HasPrefix(l, "partition ") }) {
						t.Fatalf("AutoMigrate made no partitions: %q", want)
					}
					checkTable(t, d, want, 0)
					plan, err := outboxplugin.PlanMigration(d.gorm, outboxplugin.WithPartitions(0))
					if err != nil {
						t.Fatal(err)
					}
					if len(plan) > 0 {
						t.Errorf("AutoMigrate with the option would run: %q", plan)
					}
					tl.migrate(t, d, fsys, 0)
					if d.gorm.Migrator().HasTable(outboxplugin.DefaultTableName) {
						t.Fatal("the down migration left the table")
					}
				})
			}
		})
	}
}
