package outboxplugin

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/dbtime"
	"github.com/gorm-outbox/outboxplugin/internal/partition"
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
	} else {
		// A partitioned table's next partitions are made whether or not this relay cleans up: without
		// them the writes would land in the default partition. The first run tells whether the table
		// is partitioned; one that is not stops the task.
		tasks = append(tasks, relay.Task{First: time.Second, Every: partitionCheckEvery, Run: func(ctx context.Context) bool {
			res, partitioned, ran, err := relay.MakePartitions(ctx, w.sql, time.Now())
			if err != nil {
				if ctx.Err() == nil {
					w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: making partitions failed", slog.String("worker", w.owner), slog.Any("error", err))
				}
				return true // tried again: the database may be away
			}
			if ran {
				w.logPartitions(ctx, &res)
			}
			return partitioned
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
	now := time.Now().UTC()
	r, err := relay.CleanupReport(ctx, w.sql, now, now.Add(-olderThan), exclusive)
	if r.Partitions != nil {
		w.logPartitions(ctx, r.Partitions)
	}
	if err != nil {
		err = fmt.Errorf("outboxplugin: cleanup: %w", err)
	}
	return r.Deleted, r.Ran, err
}

// partitionCheckEvery is how often a relay without a periodic cleanup makes a partitioned table's
// next partitions: often enough that a partition is made days before its first write (they are made
// two intervals ahead), rarely enough to cost nothing.
const partitionCheckEvery = 10 * time.Minute

// logPartitions logs what a partitions' maintenance did (INFO) and found wrong (WARN): partitions kept
// past the retention for the unfinished events they hold, rows in the default partition, drops and
// attaches that did not get their lock in time.
func (w *Worker) logPartitions(ctx context.Context, r *partition.Result) {
	log := w.cfg.logger
	worker := slog.String("worker", w.owner)
	if len(r.Created) > 0 || len(r.Dropped) > 0 {
		log.LogAttrs(ctx, slog.LevelInfo, "outboxplugin: partitions made and dropped", worker,
			slog.Any("made", r.Created), slog.Any("dropped", r.Dropped), slog.Int64("dropped_rows_estimate", r.DroppedRows))
	}
	for _, k := range r.Kept {
		log.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: partition kept past the retention: it holds unfinished events (publish, requeue or discard them)", worker,
			slog.String("partition", k.Name), slog.Time("ended", k.To), slog.Int64("pending", k.Pending), slog.Int64("dead", k.Dead))
	}
	if r.DefaultRows > 0 {
		log.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: the default partition holds rows: partitions were not made ahead of their writes (was no relay running?)", worker,
			slog.Int64("rows", r.DefaultRows), slog.Any("ranges_not_made", r.Skipped))
	}
	if len(r.Busy) > 0 {
		log.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: partition DDL did not get its lock in time; tried again at the next run", worker, slog.Any("partitions", r.Busy))
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
