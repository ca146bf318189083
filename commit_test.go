package outboxplugin_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
)

// The commit that carries the outbox write, on PostgreSQL with pgx: the held events and the COMMIT go
// in one message. These tests drive it through its failures — a refused INSERT, a refused COMMIT, a
// connection lost with the COMMIT sent, contexts that end, a panic — and check after each that a row
// never commits without its event nor an event without its row, and that no connection goes back to
// the pool inside a transaction.

// queryLog is a pgx tracer that records the statements a pool sends: each is one round trip once
// its prepared statement is cached (pgx prepares a statement the first time its text is seen).
type queryLog struct {
	mu      sync.Mutex
	queries []string
}

func (l *queryLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	l.queries = append(l.queries, data.SQL)
	l.mu.Unlock()
	return ctx
}

func (l *queryLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements recorded since the last call, but the wake-up NOTIFYs the plugin
// sends after commits, outside the transactions and on a connection of their own.
func (l *queryLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var q []string
	for _, s := range l.queries {
		if !strings.HasPrefix(s, "SELECT pg_notify(") {
			q = append(q, s)
		}
	}
	l.queries = nil
	return q
}

// commitPG is a PostgreSQL pool of the test's own (its application_name, to find its backends),
// optionally through a proxy and traced.
type commitPG struct {
	db      *gorm.DB
	pool    *sql.DB
	appName string
	log     *queryLog
}

func openCommitPG(t *testing.T, proxy *outboxtest.Proxy, plugin *outboxplugin.Plugin) *commitPG {
	t.Helper()
	if _, err := postgresPool(); err != nil {
		if requireDBs() {
			t.Fatalf("postgres unreachable and OUTBOX_REQUIRE_DBS=1: %v", err)
		}
		t.Skipf("postgres unreachable: %v", err)
	}
	dsn := replaceDSNField(postgresServerDSN(), "dbname", testDatabase)
	if proxy != nil {
		host, port, _ := net.SplitHostPort(proxy.Addr())
		dsn = replaceDSNField(replaceDSNField(dsn, "host", host), "port", port)
	}
	return openCommitPGAt(t, dsn, plugin)
}

// openCommitPGAt is openCommitPG on dsn.
func openCommitPGAt(t *testing.T, dsn string, plugin *outboxplugin.Plugin) *commitPG {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	c := &commitPG{appName: "commit_" + runToken(), log: &queryLog{}}
	cfg.RuntimeParams["application_name"] = c.appName
	cfg.Tracer = c.log
	c.pool = stdlib.OpenDB(*cfg)
	c.pool.SetMaxOpenConns(4)
	t.Cleanup(func() { c.pool.Close() })
	c.db, err = gorm.Open(postgres.New(postgres.Config{Conn: c.pool}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	if plugin != nil {
		require.NoError(t, c.db.Use(plugin))
	}
	return c
}

// openInTransaction is how many connections of the pool sit in a transaction on the server while
// not running a statement: a connection given back to the pool inside a transaction.
func (c *commitPG) openInTransaction(t *testing.T, admin *gorm.DB) int {
	t.Helper()
	var n int
	require.NoError(t, admin.Raw(`SELECT count(*) FROM pg_stat_activity WHERE application_name = ? AND xact_start IS NOT NULL AND state <> 'active'`, c.appName).Scan(&n).Error)
	return n
}

// requireClean checks that the pool lends no connection and that none of its connections is inside
// a transaction on the server.
func (c *commitPG) requireClean(t *testing.T, admin *gorm.DB) {
	t.Helper()
	// The wake-up NOTIFY after a commit borrows a connection for a moment.
	assert.Eventually(t, func() bool { return c.pool.Stats().InUse == 0 }, 10*time.Second, 10*time.Millisecond,
		"every connection is back in the pool")
	// A connection closed inside a transaction (the rollback of an ended context) is gone from the
	// pool at once, and from the server once its backend has seen the socket close: waited for. One
	// given back to the pool inside a transaction would stay there.
	assert.Eventually(t, func() bool { return c.openInTransaction(t, admin) == 0 }, 10*time.Second, 20*time.Millisecond,
		"no connection of the pool is inside a transaction")
}

func setupCommitTables(t *testing.T) *gorm.DB {
	t.Helper()
	d := dialectNamed(t, "postgres")
	admin := openDB(t, d, nil)
	resetTables(t, admin, append(captureModels, &BenchUser{})...)
	require.NoError(t, outboxplugin.AutoMigrate(admin.Session(&gorm.Session{NewDB: true})))
	return admin
}

func dialectNamed(t *testing.T, name string) dialect {
	t.Helper()
	for _, d := range dialects {
		if d.name == name {
			return d
		}
	}
	t.Fatalf("no dialect %s", name)
	return dialect{}
}

// A transaction with the plugin makes as many round trips as without it: the INSERT of its events
// goes with the COMMIT.
func TestOutboxWriteRidesOnTheCommit(t *testing.T) {
	admin := setupCommitTables(t)
	plain := openCommitPG(t, nil, nil)
	with := openCommitPG(t, nil, outboxplugin.New())
	sepPlugin := outboxplugin.New()
	outboxplugin.UseSeparateCommit(sepPlugin)
	separate := openCommitPG(t, nil, sepPlugin)
	shapes := []struct {
		name string
		fn   func(tx *gorm.DB, i int) error
	}{
		{"single create", func(tx *gorm.DB, i int) error { return tx.Create(&User{Name: fmt.Sprint("rt", i)}).Error }},
		{"service transaction", func(tx *gorm.DB, i int) error { return serviceTransaction(tx, fmt.Sprint("rt", i)) }},
		{"create, update, delete", func(tx *gorm.DB, i int) error {
			u := User{Name: fmt.Sprint("cud", i)}
			if err := tx.Create(&u).Error; err != nil {
				return err
			}
			if err := tx.Model(&u).Update("age", 3).Error; err != nil {
				return err
			}
			return tx.Delete(&u).Error
		}},
	}
	for _, s := range shapes {
		t.Run(s.name, func(t *testing.T) {
			trips := func(c *commitPG) []string {
				// Twice: the first prepares the statements, the second is counted.
				require.NoError(t, c.db.Transaction(func(tx *gorm.DB) error { return s.fn(tx, 0) }))
				c.log.take()
				require.NoError(t, c.db.Transaction(func(tx *gorm.DB) error { return s.fn(tx, 1) }))
				return c.log.take()
			}
			before := len(loadEvents(t, admin))
			p, w, sep := trips(plain), trips(with), trips(separate)
			require.Len(t, w, len(p), "the same round trips with the plugin as without: %q against %q", w, p)
			require.Len(t, sep, len(p)+1, "an INSERT of its own before the COMMIT costs one more: %q", sep)
			last := w[len(w)-1]
			assert.True(t, strings.HasPrefix(last, `INSERT INTO "outbox_events"`) && strings.HasSuffix(last, ";COMMIT"),
				"the last message is the INSERT and the COMMIT: %.120q", last)
			assert.Greater(t, len(loadEvents(t, admin)), before)
		})
	}
	with.requireClean(t, admin)
}

// Each way a commit can fail leaves the database with the rows and their events together, or
// neither, and the pool with no connection inside a transaction.
func TestCommitPathFailures(t *testing.T) {
	admin := setupCommitTables(t)
	c := openCommitPG(t, nil, outboxplugin.New())
	ctx := context.Background()
	state := func(t *testing.T) (users []string, events int) {
		t.Helper()
		return userNames(t, admin), len(loadEvents(t, admin))
	}
	clear := func(t *testing.T) {
		t.Helper()
		require.NoError(t, admin.Exec("DELETE FROM users").Error)
		require.NoError(t, admin.Exec("DELETE FROM outbox_events").Error)
	}

	t.Run("the outbox INSERT refused by a trigger", func(t *testing.T) {
		clear(t)
		fn := "refuse_outbox_" + runToken()
		require.NoError(t, admin.Exec(`CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'outbox closed for the test'; END $$`).Error)
		require.NoError(t, admin.Exec(`CREATE TRIGGER `+fn+` BEFORE INSERT ON outbox_events FOR EACH ROW EXECUTE FUNCTION `+fn+`()`).Error)
		defer func() {
			require.NoError(t, admin.Exec(`DROP TRIGGER `+fn+` ON outbox_events`).Error)
			require.NoError(t, admin.Exec(`DROP FUNCTION `+fn+`()`).Error)
		}()
		err := c.db.Transaction(func(tx *gorm.DB) error { return tx.Create(&User{Name: "refused"}).Error })
		require.Error(t, err)
		assert.Contains(t, err.Error(), "outbox closed for the test")
		assert.Contains(t, err.Error(), "insert into outbox_events")
		assert.Contains(t, err.Error(), "create User")
		assert.Contains(t, err.Error(), "rolled back")
		users, events := state(t)
		assert.Empty(t, users)
		assert.Zero(t, events)
		c.requireClean(t, admin)
	})

	t.Run("the COMMIT refused by a deferred constraint", func(t *testing.T) {
		clear(t)
		table := "deferred_" + runToken()
		require.NoError(t, admin.Exec(`CREATE TABLE `+table+` (k int, CONSTRAINT `+table+`_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`).Error)
		defer func() { require.NoError(t, admin.Exec(`DROP TABLE `+table).Error) }()
		err := c.db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "deferred"}).Error; err != nil {
				return err
			}
			return tx.Exec(`INSERT INTO ` + table + ` (k) VALUES (1), (1)`).Error
		})
		require.Error(t, err)
		assert.Contains(t, err.Error(), table+"_k", "the constraint's error: %v", err)
		users, events := state(t)
		assert.Empty(t, users)
		assert.Zero(t, events)
		c.requireClean(t, admin)
	})

	t.Run("a failed statement not rolled back to a savepoint", func(t *testing.T) {
		clear(t)
		tx := c.db.Begin()
		require.NoError(t, tx.Create(&User{Name: "before the error"}).Error)
		require.Error(t, tx.Exec(`SELECT 1/0`).Error)
		err := tx.Commit().Error
		require.Error(t, err, "PostgreSQL answers the COMMIT of a failed transaction with a rollback")
		users, events := state(t)
		assert.Empty(t, users)
		assert.Zero(t, events)
		c.requireClean(t, admin)
	})

	t.Run("a panic in the application's transaction", func(t *testing.T) {
		clear(t)
		func() {
			defer func() { assert.Equal(t, "boom", recover()) }()
			_ = c.db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Create(&User{Name: "panicked"}).Error)
				panic("boom")
			})
		}()
		users, events := state(t)
		assert.Empty(t, users)
		assert.Zero(t, events)
		c.requireClean(t, admin)
	})

	t.Run("the context ends before the commit", func(t *testing.T) {
		clear(t)
		cctx, cancel := context.WithCancel(ctx)
		err := c.db.WithContext(cctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "cancelled"}).Error; err != nil {
				return err
			}
			cancel()
			return nil
		})
		require.Error(t, err)
		assert.ErrorIs(t, err, context.Canceled)
		users, events := state(t)
		assert.Empty(t, users)
		assert.Zero(t, events)
		c.requireClean(t, admin)
	})

	t.Run("the context ends during a statement", func(t *testing.T) {
		clear(t)
		cctx, cancel := context.WithCancel(ctx)
		err := c.db.WithContext(cctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "mid-statement"}).Error; err != nil {
				return err
			}
			time.AfterFunc(50*time.Millisecond, cancel)
			return tx.Exec(`SELECT pg_sleep(30)`).Error
		})
		require.Error(t, err)
		users, events := state(t)
		assert.Empty(t, users)
		assert.Zero(t, events)
		c.requireClean(t, admin)
	})

	t.Run("the context ends while committing", func(t *testing.T) {
		// Whichever comes first, the rows and their events go together.
		for i := range 20 {
			clear(t)
			cctx, cancel := context.WithCancel(ctx)
			err := c.db.WithContext(cctx).Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&User{Name: fmt.Sprint("race", i)}).Error; err != nil {
					return err
				}
				go cancel()
				return nil
			})
			cancel()
			users, events := state(t)
			if err == nil {
				require.Len(t, users, 1, "committed")
				require.Equal(t, 1, events)
			} else {
				require.Empty(t, users, "failed: %v", err)
				require.Zero(t, events)
			}
		}
		c.requireClean(t, admin)
	})

	t.Run("isolation level and read-only honoured", func(t *testing.T) {
		clear(t)
		require.NoError(t, c.db.Transaction(func(tx *gorm.DB) error {
			var level, ro string
			require.NoError(t, tx.Raw(`SHOW transaction_isolation`).Scan(&level).Error)
			require.NoError(t, tx.Raw(`SHOW transaction_read_only`).Scan(&ro).Error)
			assert.Equal(t, "serializable", level)
			assert.Equal(t, "off", ro)
			return tx.Create(&User{Name: "serializable"}).Error
		}, &sql.TxOptions{Isolation: sql.LevelSerializable}))
		err := c.db.Transaction(func(tx *gorm.DB) error {
			var ro string
			require.NoError(t, tx.Raw(`SHOW transaction_read_only`).Scan(&ro).Error)
			assert.Equal(t, "on", ro)
			return tx.Create(&User{Name: "read-only"}).Error
		}, &sql.TxOptions{ReadOnly: true})
		require.Error(t, err, "a write in a read-only transaction")
		require.Error(t, c.db.Transaction(func(*gorm.DB) error { return nil }, &sql.TxOptions{Isolation: sql.LevelLinearizable}),
			"an isolation level PostgreSQL does not have is refused, as pgx refuses it")
		users, events := state(t)
		assert.Equal(t, []string{"serializable"}, users)
		assert.Equal(t, 1, events)
		c.requireClean(t, admin)
	})

	t.Run("statements after the end are refused", func(t *testing.T) {
		clear(t)
		var kept *gorm.DB
		require.NoError(t, c.db.Transaction(func(tx *gorm.DB) error {
			kept = tx
			return tx.Create(&User{Name: "kept"}).Error
		}))
		err := kept.Create(&User{Name: "after the commit"}).Error
		require.ErrorIs(t, err, sql.ErrTxDone)
		var one int
		require.ErrorIs(t, kept.Raw(`SELECT 1`).Row().Scan(&one), sql.ErrTxDone)
		users, events := state(t)
		assert.Equal(t, []string{"kept"}, users)
		assert.Equal(t, 1, events)
		c.requireClean(t, admin)
	})
}

// A connection lost once the COMMIT is sent: the database may have committed or not. The commit
// fails with ErrCommitUnknown, and the rows and their events are found together or not at all.
func TestCommitAnswerLost(t *testing.T) {
	admin := setupCommitTables(t)
	for _, sent := range []bool{true, false} {
		name := "the COMMIT reached the server"
		if !sent {
			name = "the COMMIT never reached the server"
		}
		t.Run(name, func(t *testing.T) {
			require.NoError(t, admin.Exec("DELETE FROM users").Error)
			require.NoError(t, admin.Exec("DELETE FROM outbox_events").Error)
			proxy := proxyTo(t, dialectNamed(t, "postgres"))
			c := openCommitPG(t, proxy, outboxplugin.New())
			done := make(chan error, 1)
			tx := c.db.Begin()
			require.NoError(t, tx.Create(&User{Name: "lost"}).Error)
			if sent {
				proxy.Mute(true) // the server gets the COMMIT; its answer is held back
			} else {
				proxy.Blackhole(true) // nothing reaches the server
			}
			go func() { done <- tx.Commit().Error }()
			if sent {
				require.Eventually(t, func() bool { return len(userNames(t, admin)) == 1 }, 30*time.Second, 10*time.Millisecond,
					"the server commits what it received")
			} else {
				time.Sleep(100 * time.Millisecond) // the COMMIT is on its way, into the partition
			}
			proxy.Cut()
			var err error
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("the commit did not return after its connection was cut")
			}
			require.ErrorIs(t, err, outboxplugin.ErrCommitUnknown)
			users, events := userNames(t, admin), len(loadEvents(t, admin))
			if sent {
				assert.Equal(t, []string{"lost"}, users)
				assert.Equal(t, 1, events, "committed with its event")
			} else {
				require.Eventually(t, func() bool { return c.openInTransaction(t, admin) == 0 }, 30*time.Second, 50*time.Millisecond,
					"the server ends the transaction of the lost connection")
				assert.Empty(t, userNames(t, admin))
				assert.Zero(t, len(loadEvents(t, admin)))
			}
			proxy.Mute(false)
			proxy.Blackhole(false)
			proxy.Restore()
			// The pool goes on with a new connection.
			require.NoError(t, c.db.Transaction(func(tx *gorm.DB) error { return tx.Create(&User{Name: "after"}).Error }))
			c.requireClean(t, admin)
		})
	}
}

// GORM's PrepareStmt in a session: the first transaction prepares on its held connection, and the
// pool's later transactions go back to *sql.Tx, which keeps prepared statements per connection. Every
// event is written either way.
func TestPrepareStmtOnHeldConnections(t *testing.T) {
	skipPrepareStmtBehindPooler(t)
	admin := setupCommitTables(t)
	c := openCommitPG(t, nil, outboxplugin.New())
	prep := c.db.Session(&gorm.Session{PrepareStmt: true})
	// A statement prepared on the pool first, then run in the pool's first transaction, on its held
	// connection: prepared again there from its text.
	var users []User
	require.NoError(t, prep.Find(&users).Error)
	require.NoError(t, prep.Transaction(func(tx *gorm.DB) error {
		if err := tx.Find(&users).Error; err != nil {
			return err
		}
		return tx.Create(&User{Name: "prepared"}).Error
	}))
	assert.Equal(t, []string{"prepared"}, userNames(t, admin))
	require.Len(t, loadEvents(t, admin), 1)
	require.NoError(t, admin.Exec("DELETE FROM outbox_events").Error)
	for i := range 3 {
		require.NoError(t, prep.Transaction(func(tx *gorm.DB) error { return serviceTransaction(tx, fmt.Sprint("prep", i)) }))
	}
	assert.Len(t, loadEvents(t, admin), 3*len(serviceEvents))
	c.requireClean(t, admin)
}
