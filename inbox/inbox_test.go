package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/inbox"
)

// Invoice is the consumer's effect: one per handled message.
type Invoice struct {
	ID        int64
	MessageID string
}

func newInbox(t *testing.T, db *gorm.DB) *inbox.Inbox {
	t.Helper()
	in, err := inbox.New(db)
	require.NoError(t, err)
	require.NoError(t, in.AutoMigrate(context.Background()))
	require.NoError(t, db.AutoMigrate(&Invoice{}))
	return in
}

// invoices counts the invoices of msgID, compared exactly (the invoices table compares by its
// collation on MySQL and MariaDB).
func invoices(t *testing.T, db *gorm.DB, msgID string) int64 {
	t.Helper()
	var ids []string
	require.NoError(t, db.Model(&Invoice{}).Where("message_id = ?", msgID).Pluck("message_id", &ids).Error)
	var n int64
	for _, id := range ids {
		if id == msgID {
			n++
		}
	}
	return n
}

func TestHandleRunsOncePerMessage(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		in := newInbox(t, db)
		ctx := context.Background()
		create := func(id string) func(tx *gorm.DB) error {
			return func(tx *gorm.DB) error { return tx.Create(&Invoice{MessageID: id}).Error }
		}
		ran, err := in.Handle(ctx, "billing", "m-1", create("m-1"))
		require.NoError(t, err)
		assert.True(t, ran)
		for range 3 { // redeliveries
			ran, err = in.Handle(ctx, "billing", "m-1", create("m-1"))
			require.NoError(t, err)
			assert.False(t, ran, "a redelivery is a duplicate")
		}
		assert.EqualValues(t, 1, invoices(t, db, "m-1"))

		// Another consumer of the same message has a record of its own.
		ran, err = in.Handle(ctx, "shipping", "m-1", func(*gorm.DB) error { return nil })
		require.NoError(t, err)
		assert.True(t, ran)

		// The package-level Handle, on the default table.
		ran, err = inbox.Handle(ctx, db, "billing", "m-2", create("m-2"))
		require.NoError(t, err)
		assert.True(t, ran)
		ran, err = inbox.Handle(ctx, db, "billing", "m-2", create("m-2"))
		require.NoError(t, err)
		assert.False(t, ran)
		assert.EqualValues(t, 1, invoices(t, db, "m-2"))
	})
}

// A handler error rolls back its effects and the record: the redelivery runs the handler again.
func TestHandlerErrorRollsBack(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		in := newInbox(t, db)
		ctx := context.Background()
		boom := errors.New("downstream refused")
		ran, err := in.Handle(ctx, "billing", "m-1", func(tx *gorm.DB) error {
			if err := tx.Create(&Invoice{MessageID: "m-1"}).Error; err != nil {
				return err
			}
			return boom
		})
		assert.False(t, ran)
		assert.ErrorIs(t, err, boom, "the handler's own error, wrapped")
		assert.EqualValues(t, 0, invoices(t, db, "m-1"), "its effect is rolled back")

		ran, err = in.Handle(ctx, "billing", "m-1", func(tx *gorm.DB) error { return tx.Create(&Invoice{MessageID: "m-1"}).Error })
		require.NoError(t, err)
		assert.True(t, ran, "the record was rolled back too: the redelivery runs")
		assert.EqualValues(t, 1, invoices(t, db, "m-1"))

		// A handler that returns ErrInProgress of its own is still the handler's error.
		_, err = in.Handle(ctx, "billing", "m-2", func(*gorm.DB) error { return inbox.ErrInProgress })
		assert.ErrorIs(t, err, inbox.ErrInProgress)
		ran, err = in.Handle(ctx, "billing", "m-2", func(*gorm.DB) error { return nil })
		require.NoError(t, err)
		assert.True(t, ran)
	})
}

// Concurrent deliveries of one message: exactly one handler runs and commits, and the others return
// ErrInProgress while it is still inside its handler — they do not wait for its transaction. The
// handler that won blocks until every other delivery has returned: a delivery that waited for it would
// never return, and the test's deadline would end it.
func TestConcurrentDeliveriesDoNotWait(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		in := newInbox(t, db)
		concurrentDeliveries(t, db, in, in) // one process's consumers, sharing their Inbox
	})
}

// The same from other processes, each with a pool and an Inbox of its own, where the database's lock
// answers: PostgreSQL's advisory lock and MariaDB's named lock. (SQLite has no such lock: another
// process's delivery waits for SQLite's write lock, up to the busy timeout, like any writer.)
func TestConcurrentDeliveriesFromOtherProcesses(t *testing.T) {
	forEachServer(t, func(t *testing.T, db *gorm.DB, reopen func() *gorm.DB) {
		in := newInbox(t, db)
		other, err := inbox.New(reopen())
		require.NoError(t, err)
		concurrentDeliveries(t, db, in, other)
	})
}

// concurrentDeliveries handles one message through first while eight deliveries of it go through
// second.
func concurrentDeliveries(t *testing.T, db *gorm.DB, first, second *inbox.Inbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const others = 8
	var (
		entered  = make(chan struct{})
		released = make(chan struct{})
		runs     sync.Map
	)
	type result struct {
		ran bool
		err error
	}
	winner := make(chan result, 1)
	go func() {
		ran, err := first.Handle(ctx, "billing", "m-1", func(tx *gorm.DB) error {
			runs.Store("first", true)
			close(entered)
			select {
			case <-released:
			case <-ctx.Done():
				return ctx.Err()
			}
			return tx.Create(&Invoice{MessageID: "m-1"}).Error
		})
		winner <- result{ran, err}
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the first delivery did not start its handler")
	}
	var wg sync.WaitGroup
	results := make([]result, others)
	for i := range others {
		wg.Go(func() {
			ran, err := second.Handle(ctx, "billing", "m-1", func(tx *gorm.DB) error {
				runs.Store(fmt.Sprint("other ", i), true)
				return tx.Create(&Invoice{MessageID: "m-1"}).Error
			})
			results[i] = result{ran, err}
		})
	}
	wg.Wait() // returns only if no delivery waited for the first one's transaction
	close(released)
	w := <-winner
	require.NoError(t, w.err)
	assert.True(t, w.ran)
	for i, r := range results {
		assert.False(t, r.ran, "delivery %d ran", i)
		assert.ErrorIs(t, r.err, inbox.ErrInProgress, "delivery %d", i)
	}
	n := 0
	runs.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, 1, n, "one handler ran")
	assert.EqualValues(t, 1, invoices(t, db, "m-1"))

	// Once the first committed, a redelivery is a duplicate, through either Inbox.
	for _, in := range []*inbox.Inbox{first, second} {
		ran, err := in.Handle(context.Background(), "billing", "m-1", func(*gorm.DB) error { return nil })
		require.NoError(t, err)
		assert.False(t, ran)
	}
}

func TestHandleRefusesBadInput(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		in := newInbox(t, db)
		ctx := context.Background()
		ok := func(*gorm.DB) error { return nil }
		for _, c := range []struct{ consumer, id string }{{"", "m"}, {"billing", ""}, {strings.Repeat("c", 192), "m"}, {"billing", strings.Repeat("é", 192)}} {
			_, err := in.Handle(ctx, c.consumer, c.id, ok)
			assert.ErrorIs(t, err, inbox.ErrInvalidKey)
		}
		// The longest key fits, in characters that take four bytes in UTF-8.
		ran, err := in.Handle(ctx, strings.Repeat("c", 191), strings.Repeat("😀", 191), ok)
		require.NoError(t, err)
		assert.True(t, ran)
		_, err = in.Handle(ctx, "billing", "m", nil)
		assert.Error(t, err)
		_, err = inbox.New(db, inbox.WithTable("x; DROP TABLE y"))
		assert.ErrorIs(t, err, inbox.ErrInvalidOption)
		_, err = inbox.New(nil)
		assert.ErrorIs(t, err, inbox.ErrInvalidOption)
		_, err = in.Cleanup(ctx, -time.Hour)
		assert.ErrorIs(t, err, inbox.ErrInvalidOption)
		_, err = inbox.New(db, inbox.WithRetention(0))
		assert.ErrorIs(t, err, inbox.ErrInvalidOption)
		assert.ErrorIs(t, in.RunCleanup(ctx, 0, nil), inbox.ErrInvalidOption)
	})
}

// Cleanup deletes the records older than the retention, in batches, and keeps the others.
func TestCleanup(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		in := newInbox(t, db)
		ctx := context.Background()
		const old = 2500 // more than one batch
		recs := make([]inbox.Record, old)
		for i := range recs {
			recs[i] = inbox.Record{Consumer: "billing", MessageID: fmt.Sprint("old-", i), HandledAt: time.Now().UTC().Add(-8 * 24 * time.Hour)}
		}
		require.NoError(t, db.Table(inbox.DefaultTableName).CreateInBatches(recs, 500).Error)
		ran, err := in.Handle(ctx, "billing", "new", func(*gorm.DB) error { return nil })
		require.NoError(t, err)
		require.True(t, ran)

		n, err := in.Cleanup(ctx, 0) // the default retention: 7 days
		require.NoError(t, err)
		assert.EqualValues(t, old, n)
		var left int64
		require.NoError(t, db.Table(inbox.DefaultTableName).Count(&left).Error)
		assert.EqualValues(t, 1, left)
		ran, err = in.Handle(ctx, "billing", "old-7", func(*gorm.DB) error { return nil })
		require.NoError(t, err)
		assert.True(t, ran, "a record cleaned up is handled again")
	})
}

// RunCleanup cleans up on its interval until its context ends, with the Inbox's retention.
func TestRunCleanup(t *testing.T) {
	forEachDB(t, func(t *testing.T, db *gorm.DB) {
		in, err := inbox.New(db, inbox.WithRetention(time.Hour))
		require.NoError(t, err)
		require.NoError(t, in.AutoMigrate(context.Background()))
		require.NoError(t, db.Table(inbox.DefaultTableName).Create(&[]inbox.Record{
			{Consumer: "billing", MessageID: "old", HandledAt: time.Now().UTC().Add(-2 * time.Hour)},
			{Consumer: "billing", MessageID: "new", HandledAt: time.Now().UTC()},
		}).Error)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- in.RunCleanup(ctx, 10*time.Millisecond, func(err error) { t.Error(err) }) }()
		for {
			var left int64
			require.NoError(t, db.Table(inbox.DefaultTableName).Count(&left).Error)
			if left == 1 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatal("RunCleanup did not delete the old record")
			case <-time.After(10 * time.Millisecond):
			}
		}
		cancel()
		require.NoError(t, <-done)
		var kept []string
		require.NoError(t, db.Table(inbox.DefaultTableName).Pluck("message_id", &kept).Error)
		assert.Equal(t, []string{"new"}, kept)
	})
}
