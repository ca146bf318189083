package outboxplugin

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/dbtime"
	"github.com/gorm-outbox/outboxplugin/internal/relay"
)

// The worker's maintenance (internal/relay's Maintain runs it beside the publishing loop): the
// periodic cleanup (WithCleanup, internal/relay's Cleanup), the backlog and table health measurements
// for the Observer, the publisher's start check (CheckingPublisher) and the progress line (WithProgressInterval).
//
// Retention counts from created_at, as in the reference design, for three reasons: it is what the
// (processed, created_at) index serves, so a cleanup reads only the rows it deletes; it bounds how far
// back a consumer can replay by the event's own time; and processed_at is not indexed, so counting from it
// would scan every processed row. The consequence: an event published more than the retention after it
// was written (an outage of days, a requeue of an old dead event) is deleted by the next cleanup. Dead
// events are never deleted, whatever their age.

// maintain runs, until ctx ends, the worker's maintenance tasks.
func (w *Worker) maintain(ctx context.Context) {
	var tasks []relay.Task
	if checker, ok := w.pub.(CheckingPublisher); ok {
		failed := false
		tasks = append(tasks, relay.Task{Every: recheckInterval, Run: func(ctx context.Context) bool {
			failed = w.checkPublisher(ctx, checker, failed)
			return failed
		}})
	}
	if _, nop := w.cfg.observer.(NopObserver); !nop {
		tasks = append(tasks, relay.Task{Every: w.cfg.backlogEvery, Run: func(ctx context.Context) bool {
			w.measureBacklog(ctx)
			return true
		}})
	}
	if o, ok := w.cfg.observer.(TableHealthObserver); ok {
		tasks = append(tasks, relay.Task{Every: w.cfg.healthEvery, Run: func(ctx context.Context) bool {
			// Errors are the context's end only: an unreadable figure is left unknown.
			if h, err := readTableHealth(ctx, w.sql.DB(), w.db.Dialector.Name(), w.cfg.table, w.sql.Clock(now())); err == nil {
				o.TableHealth(ctx, h)
			}
			return true
		}})
	}
	if w.cfg.cleanupEvery > 0 {
		tasks = append(tasks, relay.Task{First: w.cfg.cleanupEvery, Every: w.cfg.cleanupEvery, Run: func(ctx context.Context) bool {
			if _, _, err := w.cleanupOnce(ctx, w.cfg.retention, true); err != nil && ctx.Err() == nil {
				w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: cleanup failed", slog.String("worker", w.owner), slog.Any("error", err))
			}
			return true
		}})
	}
	var reported countsSnapshot
	tasks = append(tasks, relay.Task{First: w.cfg.progressEvery, Every: w.cfg.progressEvery, Run: func(ctx context.Context) bool {
		reported = w.logProgress(ctx, reported)
		return true
	}})
	relay.Maintain(ctx, tasks...)
}

// measureBacklog gives the observer the backlog: the pending events, and, when it asks for them, the
// age of the oldest and the scheduled events.
func (w *Worker) measureBacklog(ctx context.Context) {
	c, err := w.backlog(ctx, time.Now())
	if err != nil {
		return
	}
	w.cfg.observer.Backlog(ctx, c.pending)
	if o, ok := w.cfg.observer.(BacklogAgeObserver); ok {
		o.OldestPending(ctx, c.oldest)
	}
	if o, ok := w.cfg.observer.(ScheduledObserver); ok {
		o.Scheduled(ctx, c.scheduled)
	}
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

// cleanupOnce deletes processed events older than olderThan (internal/relay's Cleanup). When
// exclusive, it takes the table's cleanup lock and paces itself, and does nothing (ran = false) when
// another relay holds the lock.
func (w *Worker) cleanupOnce(ctx context.Context, olderThan time.Duration, exclusive bool) (deleted int64, ran bool, err error) {
	deleted, ran, err = relay.Cleanup(ctx, w.sql, time.Now().UTC().Add(-olderThan), exclusive)
	if err != nil {
		err = fmt.Errorf("outboxplugin: cleanup: %w", err)
	}
	return deleted, ran, err
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
