package outboxplugin

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/dbtime"
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
			if c, err := w.backlog(ctx, now); err == nil {
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
	conn, err := w.sql.DB().Conn(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("outboxplugin: cleanup: %w", err)
	}
	defer conn.Close()
	if exclusive {
		release, got, err := w.sql.TryCleanupLock(ctx, conn)
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
		n, err := w.sql.CleanupChunk(ctx, conn, cutoff, cleanupChunk)
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

// backlogCounts is one backlog measurement: the pending events (due, leased, waiting for a retry),
// the created_at of the oldest of them (zero when there is none), and the scheduled events.
type backlogCounts struct {
	pending, scheduled int64
	oldest             time.Time
}

// backlog measures the backlog at the time at, in two reads of the claim index (processed, dead_at,
// next_attempt_at, created_at, id). The rows whose time has come (next_attempt_at NULL or past: due
// and leased) are counted from the index alone, with the MIN of created_at that it covers too. The
// rows whose time has not come are scheduled (never attempted) or waiting (failed): only their own
// rows tell which (attempts, last_error), so that second read fetches those rows, and no others.
func (w *Worker) backlog(ctx context.Context, at time.Time) (backlogCounts, error) {
	q := w.sql
	var (
		c               backlogCounts
		n, nFuture      int64
		nScheduled      sql.NullInt64
		oldest, oldest2 any
	)
	at = q.Clock(at)
	read := func(query string, dest ...any) error {
		args := make([]any, strings.Count(query, "?")) // each the time of the measurement
		for i := range args {
			args[i] = at
		}
		query, args = q.Literal(q.Bind(query), args)
		return q.DB().QueryRowContext(ctx, query, args...).Scan(dest...)
	}
	if err := read(`SELECT COUNT(*), MIN(c.created_at) FROM `+q.Table()+` c WHERE `+liveGroup+
		` AND (c.next_attempt_at IS NULL OR c.next_attempt_at <= ?)`, &n, &oldest); err != nil {
		return c, err
	}
	if err := read(`SELECT COUNT(*), SUM(CASE WHEN `+scheduledCond+` THEN 1 ELSE 0 END), `+
		`MIN(CASE WHEN `+scheduledCond+` THEN NULL ELSE c.created_at END) FROM `+q.Table()+` c WHERE `+liveGroup+
		` AND c.next_attempt_at > ?`, &nFuture, &nScheduled, &oldest2); err != nil {
		return c, err
	}
	c.scheduled = nScheduled.Int64
	c.pending = n + nFuture - c.scheduled
	for _, v := range []any{oldest, oldest2} {
		if v == nil {
			continue
		}
		t, err := dbtime.FromColumn(v)
		if err != nil {
			return c, fmt.Errorf("oldest created_at: %w", err)
		}
		if c.oldest.IsZero() || t.Before(c.oldest) {
			c.oldest = t
		}
	}
	return c, nil
}
