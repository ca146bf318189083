package inbox_test

import (
	"testing"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/internal/testdb"
)

// The tests run on SQLite, and on PostgreSQL and MariaDB/MySQL in a database of each test's own when
// the servers are reachable (internal/testdb: OUTBOX_POSTGRES_DSN, OUTBOX_MYSQL_DSN override the
// defaults; with OUTBOX_REQUIRE_DBS=1 an unreachable server fails the test instead of skipping it).
// Every database is named with testPrefix, and TestMain fails the run when the tests left one behind.

var testPrefix = testdb.Prefix("inbox")

func TestMain(m *testing.M) { testdb.Main(m, testPrefix) }

func randomHex() string { return testdb.RandomHex() }

var postgresServer = testdb.Postgres

// target is a way the tests drive a database (testdb.Targets): SQLite, PostgreSQL, MariaDB, and
// MariaDB driven the way GORM drives MySQL 8.
type target struct {
	testdb.Target
	name   string
	server *testdb.Server // nil: SQLite
}

var targets = func() []target {
	out := make([]target, len(testdb.Targets))
	for i, tg := range testdb.Targets {
		out[i] = target{Target: tg, name: tg.Name, server: tg.Server}
	}
	return out
}()

// forEachDB runs test on each target, each with an empty database of its own.
func forEachDB(t *testing.T, test func(t *testing.T, db *gorm.DB)) {
	forEachTarget(t, func(t *testing.T, tg target) { test(t, tg.openDB(t, tg.newDatabase(t))) })
}

// forEachTarget runs test as a subtest of t for each target.
func forEachTarget(t *testing.T, test func(t *testing.T, tg target)) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) { test(t, tg) })
	}
}

// forEachServer runs test on each server target with a database of its own, and a function that
// opens another pool of it (as another process would).
func forEachServer(t *testing.T, test func(t *testing.T, db *gorm.DB, reopen func() *gorm.DB)) {
	forEachTarget(t, func(t *testing.T, tg target) {
		if tg.server == nil {
			t.Skip("SQLite has no lock across processes")
		}
		dsn := tg.newDatabase(t)
		test(t, tg.openDB(t, dsn), func() *gorm.DB { return tg.openDB(t, dsn) })
	})
}

// newDatabase makes an empty database of t's own (a file on SQLite), dropped when t ends, and
// returns its DSN.
func (tg target) newDatabase(t testing.TB) string {
	t.Helper()
	return tg.NewDatabase(t, testPrefix)
}

// openDB opens a pool of dsn, closed when t ends.
func (tg target) openDB(t testing.TB, dsn string) *gorm.DB {
	t.Helper()
	return tg.OpenDB(t, dsn)
}
