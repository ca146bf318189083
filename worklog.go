package outboxplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/failure"
)

// What the worker tells its logger: a line when Run starts (with the effective configuration) and
// stops, a progress line at info at most every progress interval and only when something happened,
// a line at debug per batch, and what went wrong in a batch summarised in one line per cause — not
// one per event: a broker refusing 500 events of one batch for one reason is one line.

// workerCounts are the worker's running totals, for the progress and stop lines.
type workerCounts struct {
	published, retried, dead, notDelivered, misconfigured atomic.Int64
}

// snapshot is a copy of the counts, and what the progress line compares.
type countsSnapshot struct{ published, retried, dead, notDelivered, misconfigured int64 }

func (c *workerCounts) snapshot() countsSnapshot {
	return countsSnapshot{c.published.Load(), c.retried.Load(), c.dead.Load(), c.notDelivered.Load(), c.misconfigured.Load()}
}

// logStart writes Run's start line: the worker's effective configuration (no credentials: the
// publisher is named by its type).
func (w *Worker) logStart(ctx context.Context) {
	c := &w.cfg
	attrs := []slog.Attr{
		slog.String("worker", w.owner),
		slog.String("database", w.db.Dialector.Name()),
		slog.String("table", c.table),
		slog.String("publisher", fmt.Sprintf("%T", w.pub)),
		slog.Int("batch_size", c.batchSize),
		slog.Duration("lease", c.lease),
		slog.Duration("poll_interval", c.pollInterval),
		slog.Duration("publish_timeout", c.publishTimeout),
		slog.Int("max_attempts", c.maxAttempts),
		slog.Bool("key_ordering", c.keyOrdering),
		slog.Bool("delete_on_publish", c.deleteOnPublish),
		slog.Bool("listen", c.listen && w.sql.Listens()),
	}
	if c.cleanupEvery > 0 {
		attrs = append(attrs, slog.Duration("cleanup_every", c.cleanupEvery), slog.Duration("retention", c.retention))
	}
	w.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "outboxplugin: worker started", attrs...)
}

// logStop writes Run's stop line, with the worker's totals.
func (w *Worker) logStop(ctx context.Context) {
	s := w.counts.snapshot()
	w.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "outboxplugin: worker stopped",
		slog.String("worker", w.owner), slog.Int64("published", s.published), slog.Int64("refused", s.retried+s.dead),
		slog.Int64("dead", s.dead), slog.Int64("not_delivered", s.notDelivered))
}

// batchDone counts a recorded batch, logs it at debug and gives it to the observer.
func (w *Worker) batchDone(ctx context.Context, res BatchResult) {
	c := &w.counts
	c.published.Add(int64(len(res.Published)))
	for _, f := range res.Failed {
		if f.Dead {
			c.dead.Add(1)
		} else {
			c.retried.Add(1)
		}
	}
	for _, f := range res.NotDelivered {
		c.notDelivered.Add(1)
		if errors.Is(f.Err, ErrMisconfigured) {
			c.misconfigured.Add(1)
		}
	}
	w.noteBatch(res)
	w.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "outboxplugin: batch",
		slog.String("worker", w.owner), slog.Int("claimed", res.Claimed), slog.Int("published", len(res.Published)),
		slog.Int("refused", len(res.Failed)), slog.Int("not_delivered", len(res.NotDelivered)), slog.Int("released", res.Released),
		slog.Duration("claim", res.ClaimDuration), slog.Duration("publish", res.PublishDuration), slog.Duration("finish", res.FinishDuration))
	w.cfg.observer.BatchDone(ctx, res)
}

// Kinds of failure a batch's summary tells apart.
const (
	failDead = iota
	failRetried
	failMisconfigured
	failNotDelivered
)

// failureGroup is the messages of a batch that failed alike: one kind, one error text.
type failureGroup struct {
	kind  int
	err   error
	n     int
	ids   []string // the first few
	types []string // distinct, the first few
	next  time.Time
}

// maxCauseLines bounds the summary lines of one kind per batch; the causes beyond are folded into
// one more line.
const maxCauseLines = 5

// groupFailures groups what failed in res by kind and error text, in the order first seen.
func groupFailures(res BatchResult) []failureGroup {
	var groups []failureGroup
	index := map[string]int{}
	add := func(kind int, f FailedMessage) {
		key := fmt.Sprint(kind) + "\x00" + failure.LastError(f.Err)
		i, ok := index[key]
		if !ok {
			i = len(groups)
			index[key] = i
			groups = append(groups, failureGroup{kind: kind, err: f.Err, next: f.NextAttempt})
		}
		g := &groups[i]
		g.n++
		if len(g.ids) < 5 {
			g.ids = append(g.ids, f.Message.ID)
		}
		if len(g.types) < 5 {
			if !slices.Contains(g.types, f.Message.EventType) {
				g.types = append(g.types, f.Message.EventType)
			}
		}
	}
	for _, f := range res.Failed {
		if f.Dead {
			add(failDead, f)
		} else {
			add(failRetried, f)
		}
	}
	for _, f := range res.NotDelivered {
		if errors.Is(f.Err, ErrMisconfigured) {
			add(failMisconfigured, f)
		} else {
			add(failNotDelivered, f)
		}
	}
	return groups
}

// logFailures summarises what failed in a recorded batch: one line per kind and cause, naming the
// count, the event types and the first message ids. Deaths are errors; configuration errors are
// errors once per cause and misconfiguredLogEvery (debug in between); refusals to retry and
// deliveries the broker did not take are warnings.
func (w *Worker) logFailures(ctx context.Context, res BatchResult) {
	if len(res.Failed) == 0 && len(res.NotDelivered) == 0 {
		return
	}
	lines := map[int]int{}
	folded := map[int][2]int{} // kind → causes, events left out
	for _, g := range groupFailures(res) {
		if lines[g.kind] == maxCauseLines {
			f := folded[g.kind]
			folded[g.kind] = [2]int{f[0] + 1, f[1] + g.n}
			continue
		}
		lines[g.kind]++
		attrs := []slog.Attr{slog.String("worker", w.owner), slog.Int("events", g.n), slog.Any("event_types", g.types),
			slog.Any("message_ids", g.ids)}
		switch g.kind {
		case failDead:
			w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: events are dead after their last attempt",
				append(attrs, slog.Any("error", g.err))...)
		case failRetried:
			w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: publish refused, events will be retried",
				append(attrs, slog.Time("next_attempt", g.next), slog.Any("error", g.err))...)
		case failMisconfigured:
			w.logMisconfigured(ctx, "outboxplugin: the broker did not take the events: a configuration error; they are pending again, no attempt spent, until it is fixed",
				g.err, attrs[1:]...)
		case failNotDelivered:
			w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: the broker did not take the events; they are pending again, no attempt spent",
				append(attrs, slog.Any("error", g.err))...)
		}
	}
	for kind, f := range folded {
		level := slog.LevelWarn
		if kind == failDead || kind == failMisconfigured {
			level = slog.LevelError
		}
		w.cfg.logger.LogAttrs(ctx, level, "outboxplugin: more failures of the batch, of other causes",
			slog.String("worker", w.owner), slog.Int("causes", f[0]), slog.Int("events", f[1]))
	}
}

// DefaultProgressInterval is how often, at most, Run logs its progress at info.
const DefaultProgressInterval = 30 * time.Second

// logProgress writes the progress line when something happened since last: the events published,
// refused (retried or dead), dead and not delivered since then, and the backlog (pending events and
// the age of the oldest), measured for the line. It returns the counts it reported.
func (w *Worker) logProgress(ctx context.Context, last countsSnapshot) countsSnapshot {
	s := w.counts.snapshot()
	if s == last || !w.cfg.logger.Enabled(ctx, slog.LevelInfo) {
		return s
	}
	attrs := []slog.Attr{slog.String("worker", w.owner),
		slog.Int64("published", s.published-last.published),
		slog.Int64("refused", s.retried-last.retried+s.dead-last.dead),
		slog.Int64("dead", s.dead-last.dead),
		slog.Int64("not_delivered", s.notDelivered-last.notDelivered)}
	if n := s.misconfigured - last.misconfigured; n > 0 {
		attrs = append(attrs, slog.Int64("misconfigured", n))
	}
	now := time.Now()
	if c, err := w.backlog(ctx, now); err == nil {
		attrs = append(attrs, slog.Int64("backlog", c.pending))
		if !c.oldest.IsZero() {
			attrs = append(attrs, slog.Duration("oldest_pending_age", max(now.Sub(c.oldest), 0).Round(time.Millisecond)))
		}
	}
	w.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "outboxplugin: progress", attrs...)
	return s
}
