package relay

import (
	"context"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// Maintenance runs beside the publishing loop, on a goroutine of its own, so that it never delays a
// claim. Each piece of it is a Task that owns its schedule; the worker gives the ones it needs: the
// periodic cleanup (Cleanup, below), the backlog measurement for its observer, its publisher's start
// check and its progress line.

// Task is one piece of maintenance: Run runs first after First, and then every Every, counted from
// when a run ends (a cleanup that takes longer than its interval does not start again at once). A Run
// that returns false is not run again.
type Task struct {
	First, Every time.Duration
	Run          func(ctx context.Context) (again bool)
}

// Maintain runs tasks until ctx ends, each when it is due, in the order given.
func Maintain(ctx context.Context, tasks ...Task) {
	start := time.Now()
	next := make([]time.Time, len(tasks))
	live := make([]bool, len(tasks))
	for i, t := range tasks {
		next[i], live[i] = start.Add(t.First), true
	}
	for {
		now := time.Now()
		var wake time.Time
		for i, t := range tasks {
			if !live[i] {
				continue
			}
			if !now.Before(next[i]) {
				live[i] = t.Run(ctx)
				next[i] = time.Now().Add(t.Every)
			}
			if live[i] && (wake.IsZero() || next[i].Before(wake)) {
				wake = next[i]
			}
		}
		if wake.IsZero() {
			<-ctx.Done() // nothing left to run
			return
		}
		timer := time.NewTimer(max(time.Until(wake), time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// CleanupChunk is how many rows one statement of a cleanup deletes.
const CleanupChunk = 1000

// Cleanup deletes processed events created before cutoff, CleanupChunk rows per statement, so that no
// statement locks much of the table, and returns how many it deleted. Dead and pending events are
// never deleted.
//
// Exclusive is the periodic cleanup of Run: with several relays on one table only one deletes at a
// time. Each chunk takes a lock of the database's own without waiting (Store.CleanupChunkLocked) —
// on PostgreSQL a transaction-scoped advisory lock in the chunk's transaction, which a transaction
// pooler such as PgBouncer keeps with the transaction; GET_LOCK on MySQL/MariaDB, tied to the
// connection — so a relay that dies mid-cleanup lets go of it. A turn ends when its chunk finds the
// lock taken: it does nothing (ran false) when another relay holds it at the first chunk. (SQLite
// serialises writers anyway: there it takes no lock.) It pauses between chunks for as long as the
// chunk took, so that a table with months of processed rows costs the database at most half of one
// connection's time while the backlog of deletions lasts (two relays whose turns overlap, taking
// chunks in turn, may cost it all of that connection's time).
func Cleanup(ctx context.Context, s *store.Store, cutoff time.Time, exclusive bool) (deleted int64, ran bool, err error) {
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		return 0, false, err
	}
	defer conn.Close()
	for {
		if err := ctx.Err(); err != nil {
			return deleted, ran, err
		}
		start := time.Now()
		var n int64
		if exclusive {
			var got bool
			if n, got, err = s.CleanupChunkLocked(ctx, conn, cutoff, CleanupChunk); err == nil && !got {
				return deleted, ran, nil // another relay is cleaning the table
			}
		} else {
			n, err = s.CleanupChunk(ctx, conn, cutoff, CleanupChunk)
		}
		ran = true
		deleted += n
		if err != nil {
			return deleted, true, err
		}
		if n < CleanupChunk {
			return deleted, true, nil
		}
		if exclusive { // Run's cleanup: leave the database as much time as the chunk took
			timer := time.NewTimer(time.Since(start))
			select {
			case <-ctx.Done():
				timer.Stop()
				return deleted, true, ctx.Err()
			case <-timer.C:
			}
		}
	}
}
