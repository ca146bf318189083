package outboxplugin

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"
)

// Maintenance runs beside Run's publishing loop, on a goroutine of its own, so that it never delays a
// claim: the periodic cleanup (WithCleanup), the backlog measurement for the Observer, the publisher's
// start check (CheckingPublisher) and the progress line (WithProgressInterval).
//
// Cleanup deletes in chunks of cleanupChunk rows, one short statement each, pausing between chunks for
// as long as the chunk took, so that a table with months of processed rows costs the database at most
// half of one connection's time while the backlog of deletions lasts, and no statement locks much of
// the table. With several relays on one table, only one cleans at a time: it holds a lock of the
// database's own for the cleanup's duration — pg_try_advisory_lock on PostgreSQL, GET_LOCK on
// MySQL/MariaDB, both tied to the connection, so a relay that dies mid-cleanup lets go of it — and the
// others skip their turn. (SQLite serialises writers anyway: there it takes no lock.)
//
// Retention counts from created_at, as in the reference design, for three reasons: it is what the
// (processed, created_at) index serves, so a cleanup reads only the rows it deletes; it bounds how far
// back a consumer can replay by the event's own time; and processed_at is not indexed, so counting from it
// would scan every processed row. The consequence: an event published more than the retention after it
// was written (an outage of days, a requeue of an old dead event) is deleted by the next cleanup. Dead
// events are never deleted, whatever their age.

const cleanupChunk = 1000

// maintain runs, until ctx ends, the periodic cleanup, the backlog measurement, the publisher's start
// check (CheckingPublisher) and the progress line.
func (w *Worker) maintain(ctx context.Context) {
	_, nop := w.cfg.observer.(NopObserver)
	backlog := !nop
	cleanup := w.cfg.cleanupEvery > 0
	checker, checking := w.pub.(CheckingPublisher)
	now := time.Now()
	nextBacklog := now
	nextCleanup := now.Add(w.cfg.cleanupEvery)
	nextCheck := now
	nextProgress := now.Add(w.cfg.progressEvery)
	var reported countsSnapshot
	checkFailed := false
	for {
		now = time.Now()
		if checking && !now.Before(nextCheck) {
			checking = w.checkPublisher(ctx, checker, checkFailed)
			checkFailed = checking
			nextCheck = time.Now().Add(recheckInterval)
		}
		if backlog && !now.Before(nextBacklog) {
			nextBacklog = now.Add(w.cfg.backlogEvery)
			if c, err := w.sql.backlog(ctx, now); err == nil {
				w.cfg.observer.Backlog(ctx, c.pending)
				if o, ok := w.cfg.observer.(BacklogAgeObserver); ok {
					o.OldestPending(ctx, c.oldest)
				}
				if o, ok := w.cfg.observer.(ScheduledObserver); ok {
					o.Scheduled(ctx, c.scheduled)
				}
			}
		}
		if cleanup && !now.Before(nextCleanup) {
			if _, _, err := w.cleanupOnce(ctx, w.cfg.retention, true); err != nil && ctx.Err() == nil {
				w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: cleanup failed", slog.String("worker", w.owner), slog.Any("error", err))
			}
			nextCleanup = time.Now().Add(w.cfg.cleanupEvery)
		}
		if !now.Before(nextProgress) {
			reported = w.logProgress(ctx, reported)
			nextProgress = time.Now().Add(w.cfg.progressEvery)
		}
		next := nextProgress
		if checking {
			next = minTime(next, nextCheck)
		}
		if backlog {
			next = minTime(next, nextBacklog)
		}
		if cleanup {
			next = minTime(next, nextCleanup)
		}
		timer := time.NewTimer(max(time.Until(next), time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Cleanup deletes processed events created more than olderThan ago, in chunks of 1000 rows, so that no
// single statement locks much of the table; it returns how many it deleted. Pending and dead events are
// never deleted. It runs whether or not another relay is cleaning the table at the same time (Run's
// periodic cleanup takes turns, see WithCleanup).
func (w *Worker) Cleanup(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("outboxplugin: Cleanup: %w: negative age %v", ErrInvalidOption, olderThan)
	}
	n, _, err := w.cleanupOnce(ctx, olderThan, false)
	return n, err
}

// cleanupOnce deletes processed events older than olderThan, chunk by chunk. When exclusive, it first
// takes the table's cleanup lock, and does nothing (ran = false) when another relay holds it; paced, it
// pauses between chunks.
func (w *Worker) cleanupOnce(ctx context.Context, olderThan time.Duration, exclusive bool) (deleted int64, ran bool, err error) {
	conn, err := w.sql.db.Conn(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("outboxplugin: cleanup: %w", err)
	}
	defer conn.Close()
	if exclusive {
		release, got, err := w.sql.tryCleanupLock(ctx, conn)
		if err != nil {
			return 0, false, fmt.Errorf("outboxplugin: cleanup lock: %w", err)
		}
		if !got {
			return 0, false, nil // another relay is cleaning the table
		}
		defer release()
	}
	cutoff := time.Now().UTC().Add(-olderThan)
	for {
		if err := ctx.Err(); err != nil {
			return deleted, true, err
		}
		start := time.Now()
		n, err := w.sql.cleanupChunk(ctx, conn, cutoff, cleanupChunk)
		deleted += n
		if err != nil {
			return deleted, true, fmt.Errorf("outboxplugin: cleanup: %w", err)
		}
		if n < cleanupChunk {
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

// cleanupLockName names the cleanup lock of the relay's table.
func (q *relaySQL) cleanupLockName() string {
	return "outboxplugin.cleanup." + q.table
}

// tryCleanupLock takes the table's cleanup lock on conn without waiting; release lets go of it.
func (q *relaySQL) tryCleanupLock(ctx context.Context, conn *sql.Conn) (release func(), got bool, err error) {
	return q.d.tryLock(ctx, conn, q.cleanupLockName())
}
