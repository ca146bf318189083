package relay

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/partition"
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

// Cleanup deletes processed events created before cutoff and returns how many it deleted (see
// CleanupReport).
func Cleanup(ctx context.Context, s *store.Store, cutoff time.Time, exclusive bool) (deleted int64, ran bool, err error) {
	r, err := CleanupReport(ctx, s, time.Now(), cutoff, exclusive)
	return r.Deleted, r.Ran, err
}

// Report is what a cleanup did.
type Report struct {
	// Deleted is how many rows it deleted: on a partitioned table, the rows of the partitions it
	// dropped as the catalog estimated them, and those it deleted from the default partition.
	Deleted int64
	// Ran is false when another relay held the cleanup lock.
	Ran bool
	// Partitions is what the partitions' maintenance did and found (nil for a table that is not
	// partitioned).
	Partitions *partition.Result
}

// CleanupReport deletes processed events created before cutoff. Dead and pending events are never
// deleted. On a table that is not partitioned it deletes their rows, CleanupChunk per statement, so
// that no statement locks much of the table. On a partitioned one (internal/partition) it makes the
// partitions the table lacks at now and drops those whose range ended before cutoff and that hold no
// unfinished event: whole partitions, never their rows (but for the default partition's).
//
// Exclusive is the periodic cleanup of Run: with several relays on one table only one deletes (or
// makes or drops partitions) at a time. Each chunk, and each partition's step, takes a lock of the
// database's own without waiting (Store.CleanupChunkLocked, Store.CleanupStep) — on PostgreSQL a
// transaction-scoped advisory lock in the chunk's or the step's transaction, which a transaction
// pooler such as PgBouncer keeps with the transaction; GET_LOCK on MySQL/MariaDB, tied to the
// connection — so a relay that dies mid-cleanup lets go of it. A turn ends when it finds the lock
// taken: it does nothing (Ran false) when another relay holds it at the first chunk or step. (SQLite
// serialises writers anyway: there it takes no lock.) On a plain table it pauses between chunks for as
// long as the chunk took, so that a table with months of processed rows costs the database at most
// half of one connection's time while the backlog of deletions lasts (two relays whose turns overlap,
// taking chunks in turn, may cost it all of that connection's time).
func CleanupReport(ctx context.Context, s *store.Store, now, cutoff time.Time, exclusive bool) (Report, error) {
	var r Report
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		return r, err
	}
	defer conn.Close()
	if t, ok := s.Partitions(); ok {
		l, err := t.Read(ctx, conn)
		if err != nil {
			return r, fmt.Errorf("read the partitions: %w", err)
		}
		if l.Partitioned {
			res, ran, err := t.Maintain(ctx, conn, now, cutoff, true, guard(s, conn, exclusive))
			r.Partitions, r.Ran = &res, ran
			r.Deleted = res.DroppedRows + res.DefaultDeleted
			return r, err
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		start := time.Now()
		var n int64
		if exclusive {
			var got bool
			if n, got, err = s.CleanupChunkLocked(ctx, conn, cutoff, CleanupChunk); err == nil && !got {
				return r, nil // another relay is cleaning the table
			}
		} else {
			n, err = s.CleanupChunk(ctx, conn, cutoff, CleanupChunk)
		}
		r.Ran = true
		r.Deleted += n
		if err != nil {
			return r, err
		}
		if n < CleanupChunk {
			return r, nil
		}
		if exclusive { // Run's cleanup: leave the database as much time as the chunk took
			timer := time.NewTimer(time.Since(start))
			select {
			case <-ctx.Done():
				timer.Stop()
				return r, ctx.Err()
			case <-timer.C:
			}
		}
	}
}

// MakePartitions makes the partitions a partitioned table lacks at now, under the cleanup lock (ran
// false when another relay holds it): what a relay without a periodic cleanup still does, so that its
// writes never land in the default partition. partitioned is false for a table that is not (nothing
// is done).
func MakePartitions(ctx context.Context, s *store.Store, now time.Time) (res partition.Result, partitioned, ran bool, err error) {
	t, ok := s.Partitions()
	if !ok {
		return res, false, false, nil
	}
	l, err := t.Read(ctx, s.DB())
	if err != nil || !l.Partitioned {
		return res, false, false, err
	}
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		return res, true, false, err
	}
	defer conn.Close()
	res, ran, err = t.Maintain(ctx, conn, now, time.Time{}, false, guard(s, conn, true))
	return res, true, ran, err
}

// guard is the lock a partitions' step takes (Store.CleanupStep), on conn.
func guard(s *store.Store, conn *sql.Conn, exclusive bool) partition.Guard {
	return func(ctx context.Context) (partition.Execer, func(bool) error, bool, error) {
		held, release, got, err := s.CleanupStep(ctx, conn, exclusive)
		if err != nil {
			return nil, nil, false, fmt.Errorf("cleanup lock: %w", err)
		}
		return held, release, got, nil
	}
}
