package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/inbox"
	"github.com/gorm-outbox/outboxplugin/internal/testdb"
)

// A delivery whose context ends while its handler runs — a deadline, the usual shape of a consumer's
// time limit — leaves no lock behind on any database: the redelivery that comes next through another
// pool (another process) runs the handler, and so does one through the first Inbox. Each shape of
// handler waits for the deadline inside the handler; the last one is inside a statement then (on the
// servers a row lock another transaction holds, on SQLite a query that never ends).
func TestDeadlineInHandlerLeavesNoLock(t *testing.T) {
	shapes := []struct {
		name    string
		handler func(ctx context.Context, tx *gorm.DB, id string) error
		// mayCommit: the commit can still win the race with the deadline (database/sql's transaction
		// sees its context end a moment after the handler sees the delivery's).
		mayCommit bool
	}{
		{"returns the context's error", func(ctx context.Context, _ *gorm.DB, _ string) error {
			<-ctx.Done()
			return ctx.Err()
		}, false},
		{"ignores the deadline", func(ctx context.Context, tx *gorm.DB, id string) error {
			if err := tx.Create(&Invoice{MessageID: id}).Error; err != nil {
				return err
			}
			<-ctx.Done()
			return nil // the commit is refused: the transaction's context has ended
		}, true},
		{"writes after the deadline", func(ctx context.Context, tx *gorm.DB, id string) error {
			<-ctx.Done()
			return tx.Create(&Invoice{MessageID: id}).Error
		}, false},
		{"in a statement at the deadline", func(ctx context.Context, tx *gorm.DB, _ string) error {
			return blockInStatement(tx)
		}, false},
		{"panics after the deadline", func(ctx context.Context, _ *gorm.DB, _ string) error {
			<-ctx.Done()
			panic("handler bug")
		}, false},
	}
	forEachTarget(t, func(t *testing.T, tg target) {
		dsn := tg.newDatabase(t)
		db := tg.openDB(t, dsn)
		first := newInbox(t, db)
		other, err := inbox.New(tg.openDB(t, dsn))
		require.NoError(t, err)
		release := holdLockedRow(t, db)
		defer release()
		for i, s := range shapes {
			t.Run(s.name, func(t *testing.T) {
				id, ran, err := deliverPastDeadline(t, first, fmt.Sprint("m-", i), s.handler)
				committed := ran && s.mayCommit
				if !committed {
					assert.False(t, ran)
					assert.Error(t, err)
					assert.EqualValues(t, 0, invoices(t, db, id), "nothing of the failed delivery stayed")
				}

				ran, err = redeliver(t, other, id)
				require.NoError(t, err, "the redelivery through another pool")
				assert.Equal(t, !committed, ran, "the redelivery through another pool runs the handler, unless the first committed")
				ran, err = first.Handle(context.Background(), "billing", id, createInvoice(id))
				require.NoError(t, err)
				assert.False(t, ran, "handled now")
				assert.EqualValues(t, 1, invoices(t, db, id))
				noSessionLeftBehind(t, tg, db)
			})
		}
	})
}

// A handler that panics leaves no lock: the panic reaches the caller, and the next delivery, through
// another pool or the same Inbox, runs at once.
func TestPanickingHandlerLeavesNoLock(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		dsn := tg.newDatabase(t)
		db := tg.openDB(t, dsn)
		first := newInbox(t, db)
		other, err := inbox.New(tg.openDB(t, dsn))
		require.NoError(t, err)
		for _, in := range []*inbox.Inbox{first, other} { // redelivered through another pool, then the same Inbox
			id := "m-" + randomHex()
			var recovered any
			func() {
				defer func() { recovered = recover() }()
				_, _ = first.Handle(context.Background(), "billing", id, func(tx *gorm.DB) error {
					if err := tx.Create(&Invoice{MessageID: id}).Error; err != nil {
						return err
					}
					panic("handler bug")
				})
			}()
			assert.Equal(t, "handler bug", recovered, "the panic reaches the caller")
			assert.EqualValues(t, 0, invoices(t, db, id))
			ran, err := in.Handle(context.Background(), "billing", id, createInvoice(id))
			require.NoError(t, err)
			assert.True(t, ran)
			assert.EqualValues(t, 1, invoices(t, db, id))
		}
		noSessionLeftBehind(t, tg, db)
	})
}

// A delivery whose context has ended before it starts returns the context's error and takes nothing.
func TestContextDoneBeforeDelivery(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		dsn := tg.newDatabase(t)
		db := tg.openDB(t, dsn)
		first := newInbox(t, db)
		other, err := inbox.New(tg.openDB(t, dsn))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		ran, err := first.Handle(ctx, "billing", "m-1", func(*gorm.DB) error {
			t.Error("the handler ran under an ended context")
			return nil
		})
		assert.False(t, ran)
		assert.ErrorIs(t, err, context.Canceled)
		for _, in := range []*inbox.Inbox{other, first} {
			ran, err := in.Handle(context.Background(), "billing", "m-1", createInvoice("m-1"))
			require.NoError(t, err)
			assert.Equal(t, in == other, ran)
		}
	})
}

// Two databases on one server (and on PostgreSQL two schemas of one database) each have their inbox:
// the same consumer and message id in both do not block each other. One table named two ways (with
// its database or schema, and without) has one lock.
func TestLocksPerDatabase(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		if tg.server == nil {
			t.Skip("SQLite has no lock across processes")
		}
		dsnA, dsnB := tg.newDatabase(t), tg.newDatabase(t)
		var a, b *gorm.DB
		var otherB string // B's table, named from A's pool
		if tg.server == postgresServer {
			testdb.SkipBehindPooler(t, "PgBouncer refuses search_path as a startup parameter, which gives each pool its schema here")
			// Two schemas of one database, each pool finding its table through its search_path.
			admin := tg.openDB(t, dsnA)
			require.NoError(t, admin.Exec(`CREATE SCHEMA s1; CREATE SCHEMA s2`).Error)
			a, b = tg.openDB(t, dsnA+" search_path=s1"), tg.openDB(t, dsnA+" search_path=s2")
			otherB = "s2." + inbox.DefaultTableName
		} else {
			a, b = tg.openDB(t, dsnA), tg.openDB(t, dsnB)
			var name string
			require.NoError(t, b.Raw(`SELECT DATABASE()`).Scan(&name).Error)
			otherB = name + "." + inbox.DefaultTableName
		}
		inA, inB := newInbox(t, a), newInbox(t, b)
		require.NoError(t, b.AutoMigrate(&Invoice{}))

		release := holdDelivery(t, inA, "billing", "m-1")
		ran, err := inB.Handle(context.Background(), "billing", "m-1", createInvoice("m-1"))
		require.NoError(t, err, "the other database's delivery is not blocked")
		assert.True(t, ran)
		release()

		// B's table through A's pool, by its qualified name: the lock of B's table.
		viaA, err := inbox.New(a, inbox.WithTable(otherB))
		require.NoError(t, err)
		release = holdDelivery(t, inB, "billing", "m-2")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = viaA.Handle(ctx, "billing", "m-2", func(*gorm.DB) error { return nil })
		assert.ErrorIs(t, err, inbox.ErrInProgress, "one table named two ways has one lock")
		release()
		ran, err = viaA.Handle(context.Background(), "billing", "m-2", func(*gorm.DB) error { return nil })
		require.NoError(t, err)
		assert.False(t, ran, "handled through B's pool")
	})
}

func createInvoice(id string) func(tx *gorm.DB) error {
	return func(tx *gorm.DB) error { return tx.Create(&Invoice{MessageID: id}).Error }
}

// holdDelivery starts a delivery of id through in whose handler waits, and returns once the handler
// runs; the returned function lets it commit and waits for it.
func holdDelivery(t *testing.T, in *inbox.Inbox, consumer, id string) (release func()) {
	t.Helper()
	entered, released, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	go func() {
		_, err := in.Handle(ctx, consumer, id, func(*gorm.DB) error {
			close(entered)
			select {
			case <-released:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		cancel()
		t.Fatalf("the held delivery of %s did not run: %v", id, err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(released)
			assert.NoError(t, <-done)
			cancel()
		})
	}
	t.Cleanup(release) // a test that failed before releasing it does not wait for its deadline
	return release
}

// deliverPastDeadline delivers a message (base plus a suffix) through in with a deadline that ends
// while handler runs, and returns the id and Handle's outcome (a panic as an error). A deadline that
// ended before the handler started, on a slow machine, is tried again, longer, under another id.
func deliverPastDeadline(t *testing.T, in *inbox.Inbox, base string, handler func(ctx context.Context, tx *gorm.DB, id string) error) (string, bool, error) {
	t.Helper()
	for timeout := 200 * time.Millisecond; timeout <= 10*time.Second; timeout *= 2 {
		id := base + "-" + randomHex()
		entered := false
		ran, err := func() (ran bool, err error) {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			return in.Handle(ctx, "billing", id, func(tx *gorm.DB) error {
				entered = true
				return handler(ctx, tx, id)
			})
		}()
		if entered {
			return id, ran, err
		}
	}
	t.Fatal("the handler never started before its deadline")
	return "", false, nil
}

// redeliver delivers id through in once more.
func redeliver(t *testing.T, in *inbox.Inbox, id string) (bool, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return in.Handle(ctx, "billing", id, createInvoice(id))
}

// holdLockedRow writes the row blockInStatement waits for and, on the servers, locks it in a
// transaction of db until the returned function ends it.
func holdLockedRow(t *testing.T, db *gorm.DB) (release func()) {
	t.Helper()
	require.NoError(t, db.Create(&Invoice{ID: 1_000_000, MessageID: "locked"}).Error)
	if db.Dialector.Name() == "sqlite" {
		return func() {}
	}
	tx := db.Begin()
	require.NoError(t, tx.Error)
	require.NoError(t, tx.Exec(`UPDATE invoices SET message_id = 'locked' WHERE id = 1000000`).Error)
	return func() { tx.Rollback() }
}

// blockInStatement runs a statement of tx that does not return before tx's context ends: the update
// of the row holdLockedRow holds on the servers, a query that never ends on SQLite.
func blockInStatement(tx *gorm.DB) error {
	if tx.Dialector.Name() == "sqlite" {
		var n int64
		return tx.Raw(`WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c`).Scan(&n).Error
	}
	return tx.Exec(`UPDATE invoices SET message_id = 'blocked' WHERE id = 1000000`).Error
}

// noSessionLeftBehind checks, on the servers, that no session of db's database other than the
// blocker of holdLockedRow is still in a statement or a transaction, or holds an advisory lock
// (PostgreSQL), after a bounded wait for sessions that were told to end.
func noSessionLeftBehind(t *testing.T, tg target, db *gorm.DB) {
	t.Helper()
	var query string
	switch tg.server {
	case nil:
		return
	case postgresServer:
		query = `SELECT count(*) FROM pg_stat_activity a WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
			AND (a.state NOT IN ('idle') AND a.query NOT LIKE 'UPDATE invoices SET message_id = ''locked''%'
				OR EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory'))`
	default:
		query = `SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()
			AND COMMAND <> 'Sleep'`
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int64
		require.NoError(t, db.Raw(query).Scan(&n).Error)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d sessions of the database still busy", n)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
