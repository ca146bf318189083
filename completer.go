package outboxplugin

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay"
	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// Recording what became of a batch: relay.Decide (internal/relay) says what to write for each row, and the
// functions here write it — in one statement, or one transaction — report it to the observer and log it.

// completeBatch records the outcome of a published batch, or — when carry is allowed and the batch
// was full and published completely — returns it for the next claim to mark.
func (w *Worker) completeBatch(ctx context.Context, c *claimedBatch, carry bool) (published int, next *carriedBatch, outage bool, err error) {
	allDelivered := !slices.ContainsFunc(c.out, func(d relay.Delivery) bool { return d.Kind != relay.Delivered })
	if carry && allDelivered && len(c.rows) == w.cfg.batchSize && !w.cfg.keyOrdering && ctx.Err() == nil && !c.handBack {
		res := c.res
		res.Published = c.msgs
		return len(c.rows), &carriedBatch{rows: c.rows, lease: c.lease, now: w.wallClock(time.Now()), res: res}, false, nil
	}
	w.drop(c.lease, c.rows)
	res := c.res
	start := time.Now()
	o, err := w.finish(ctx, c.rows, c.out, &res, c.handBack)
	res.FinishDuration = time.Since(start)
	if err != nil {
		return 0, nil, false, fmt.Errorf("outboxplugin: record batch outcome: %w", err)
	}
	w.report(ctx, res)
	return len(res.Published), nil, o.Outage, nil
}

// report logs what failed in a recorded batch, and gives the observer the batch and each event it
// made dead.
func (w *Worker) report(ctx context.Context, res BatchResult) {
	w.logFailures(ctx, res)
	w.batchDone(ctx, res)
	for _, f := range res.Failed {
		if f.Dead {
			w.cfg.observer.Dead(ctx, f.Message, f.Err)
		}
	}
}

// finishCarried marks a carried batch done on its own, when no further claim will: at shutdown, or
// after the claim that was to mark it failed.
func (w *Worker) finishCarried(ctx context.Context, b *carriedBatch) {
	b.marked = true
	d := w.done(b)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	start := time.Now()
	n, err := w.sql.MarkDone(fctx, w.sql.DB(), w.owner, d, w.cfg.deleteOnPublish)
	if err != nil {
		// The rows stay leased and are published again once the lease ends: a duplicate, not a loss.
		w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: could not mark published events done; they will be published again",
			slog.String("worker", w.owner), slog.Int("events", len(d.IDs)), slog.Any("error", err))
		return
	}
	b.res.FinishDuration = time.Since(start)
	w.noteLeaseLost(ctx, &b.res, len(d.IDs), n)
	w.batchDone(ctx, b.res)
}

// noteLeaseLost records in res, and logs, the published rows a mark no longer found leased to the
// worker: another worker took them over after their lease ran out, and publishes them again.
func (w *Worker) noteLeaseLost(ctx context.Context, res *BatchResult, published int, marked int64) {
	if marked >= int64(published) {
		return
	}
	res.LeaseLost = published - int(marked)
	w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: published events had been taken over by another worker; they will be published twice",
		slog.String("worker", w.owner), slog.Int("events", res.LeaseLost))
}

// finish records the outcome of a batch (see relay.Decide): published rows done, refused rows scheduled
// for retry or dead, rows not delivered handed back. Several statements run in one transaction; one
// runs alone. With handBack (the lease ran out), as when the worker is stopping, the rows not
// delivered are handed back with their attempt given back and nothing recorded against them.
func (w *Worker) finish(ctx context.Context, rows []store.Row, out []relay.Delivery, res *BatchResult, handBack bool) (relay.Outcome, error) {
	now := w.wallClock(time.Now())
	o := relay.Decide(rows, out, ctx.Err() != nil || handBack, w.cfg.maxAttempts, w.cfg.retry.Backoff, now)
	for _, r := range o.Done {
		res.Published = append(res.Published, Message(r.Msg))
	}
	res.Failed = failedMessages(o.Failed)
	res.NotDelivered = failedMessages(o.Unsent)
	res.Released = o.Stopped

	var marked int64
	var steps []func(context.Context, store.Execer) error
	if len(o.Done) > 0 {
		steps = append(steps, func(ctx context.Context, ex store.Execer) (err error) {
			marked, err = w.sql.MarkDone(ctx, ex, w.owner, store.Done{IDs: store.RowIDs(o.Done), Ctids: store.RowCtids(o.Done), Now: now}, w.cfg.deleteOnPublish)
			return err
		})
	}
	for _, g := range o.Retries {
		steps = append(steps, func(ctx context.Context, ex store.Execer) error {
			return w.sql.MarkRetry(ctx, ex, w.owner, g.IDs, g.Err, now, g.Next.Sub(now), g.Attempt)
		})
	}
	for _, d := range o.Dead {
		steps = append(steps, func(ctx context.Context, ex store.Execer) error {
			return w.sql.MarkDead(ctx, ex, w.owner, []int64{d.ID}, d.Err, now, d.Attempt)
		})
	}
	for _, g := range groupReleased(o.Released) {
		steps = append(steps, func(ctx context.Context, ex store.Execer) error {
			return w.sql.Release(ctx, ex, w.owner, g.ids, g.err)
		})
	}

	// The outcome must be recorded even when ctx has ended (shutdown): use a context of its own.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	var err error
	if len(steps) == 1 {
		err = steps[0](fctx, w.sql.DB())
	} else {
		err = w.sql.InTx(fctx, func(tx *sql.Tx) error {
			for _, step := range steps {
				if err := step(fctx, tx); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return o, err
	}
	w.noteLeaseLost(ctx, res, len(o.Done), marked)
	return o, nil
}

// releasedGroup is rows handed back with the same last error.
type releasedGroup struct {
	ids []int64
	err string
}

func groupReleased(rows []relay.ReleasedRow) []releasedGroup {
	var groups []releasedGroup
	for _, r := range rows {
		i := slices.IndexFunc(groups, func(g releasedGroup) bool { return g.err == r.Err })
		if i < 0 {
			groups = append(groups, releasedGroup{err: r.Err})
			i = len(groups) - 1
		}
		groups[i].ids = append(groups[i].ids, r.ID)
	}
	return groups
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// failedMessages are a decision's failures as BatchResult reports them.
func failedMessages(fs []relay.Failure) []FailedMessage {
	if fs == nil {
		return nil
	}
	out := make([]FailedMessage, len(fs))
	for i, f := range fs {
		out[i] = FailedMessage{Message: Message(f.Msg), Err: f.Err, Dead: f.Dead, NextAttempt: f.NextAttempt}
	}
	return out
}
