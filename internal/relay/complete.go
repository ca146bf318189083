package relay

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// The completer: what became of a batch is decided by Decide, and written here — in one statement, or
// one transaction — then reported through the BatchDone hook.

// completeBatch records the outcome of a published batch, or — when carry is allowed and the batch
// was full and published completely — returns it for the next claim to mark.
func (e *Engine[M]) completeBatch(ctx context.Context, c *claimedBatch[M], carry bool) (published int, next *carriedBatch[M], outage bool, err error) {
	allDelivered := !slices.ContainsFunc(c.out, func(d Delivery) bool { return d.Kind != Delivered })
	if carry && allDelivered && len(c.rows) == e.cfg.BatchSize && !e.cfg.KeyOrdering && ctx.Err() == nil && !c.handBack {
		res := c.res
		res.Published = c.msgs
		return len(c.rows), &carriedBatch[M]{rows: c.rows, lease: c.lease, now: e.wallClock(time.Now()), res: res}, false, nil
	}
	e.drop(c.lease, c.rows)
	res := c.res
	start := time.Now()
	o, err := e.finish(ctx, c.rows, c.msgs, c.out, &res, c.handBack)
	res.FinishDuration = time.Since(start)
	if err != nil {
		return 0, nil, false, fmt.Errorf("outboxplugin: record batch outcome: %w", err)
	}
	e.h.BatchDone(ctx, res)
	return len(res.Published), nil, o.Outage, nil
}

// finishCarried marks a carried batch done on its own, when no further claim will: at shutdown, or
// after the claim that was to mark it failed.
func (e *Engine[M]) finishCarried(ctx context.Context, b *carriedBatch[M]) {
	b.marked = true
	d := e.done(b)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
	defer cancel()
	start := time.Now()
	n, err := e.sql.MarkDone(fctx, e.sql.DB(), e.cfg.Owner, d, e.cfg.DeleteOnPublish)
	if err != nil {
		// The rows stay leased and are published again once the lease ends: a duplicate, not a loss.
		e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: could not mark published events done; they will be published again",
			slog.String("worker", e.cfg.Owner), slog.Int("events", len(d.IDs)), slog.Any("error", err))
		return
	}
	b.res.FinishDuration = time.Since(start)
	e.noteLeaseLost(ctx, &b.res, len(d.IDs), n)
	e.h.BatchDone(ctx, b.res)
}

// noteLeaseLost records in res, and logs, the published rows a mark no longer found leased to the
// worker: another worker took them over after their lease ran out, and publishes them again.
func (e *Engine[M]) noteLeaseLost(ctx context.Context, res *Result[M], published int, marked int64) {
	if marked >= int64(published) {
		return
	}
	res.LeaseLost = published - int(marked)
	e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: published events had been taken over by another worker; they will be published twice",
		slog.String("worker", e.cfg.Owner), slog.Int("events", res.LeaseLost))
}

// finish records the outcome of a batch (see Decide): published rows done, refused rows scheduled for
// retry or dead, rows not delivered handed back. Several statements run in one transaction; one runs
// alone. With handBack (the lease ran out), as when the worker is stopping, the rows not delivered are
// handed back with their attempt given back and nothing recorded against them. msgs are the messages
// of rows, as published.
func (e *Engine[M]) finish(ctx context.Context, rows []store.Row, msgs []M, out []Delivery, res *Result[M], handBack bool) (Outcome, error) {
	now := e.wallClock(time.Now())
	o := Decide(rows, out, ctx.Err() != nil || handBack, e.cfg.MaxAttempts, e.cfg.Backoff, now)
	if len(o.Done) == len(rows) {
		res.Published = msgs // the usual case: no copy
	} else {
		for i := range out {
			if out[i].Kind == Delivered {
				res.Published = append(res.Published, msgs[i])
			}
		}
	}
	res.Failed = e.failed(o.Failed)
	res.NotDelivered = e.failed(o.Unsent)
	res.Released = o.Stopped

	var marked int64
	var steps []func(context.Context, store.Execer) error
	if len(o.Done) > 0 {
		steps = append(steps, func(ctx context.Context, ex store.Execer) (err error) {
			marked, err = e.sql.MarkDone(ctx, ex, e.cfg.Owner, store.Done{IDs: store.RowIDs(o.Done), Ctids: store.RowCtids(o.Done), Now: now}, e.cfg.DeleteOnPublish)
			return err
		})
	}
	for _, g := range o.Retries {
		steps = append(steps, func(ctx context.Context, ex store.Execer) error {
			return e.sql.MarkRetry(ctx, ex, e.cfg.Owner, g.IDs, g.Err, now, g.Next.Sub(now), g.Attempt)
		})
	}
	for _, d := range o.Dead {
		steps = append(steps, func(ctx context.Context, ex store.Execer) error {
			return e.sql.MarkDead(ctx, ex, e.cfg.Owner, []int64{d.ID}, d.Err, now, d.Attempt)
		})
	}
	for _, g := range groupReleased(o.Released) {
		steps = append(steps, func(ctx context.Context, ex store.Execer) error {
			return e.sql.Release(ctx, ex, e.cfg.Owner, g.ids, g.err)
		})
	}

	// The outcome must be recorded even when ctx has ended (shutdown): use a context of its own.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
	defer cancel()
	var err error
	if len(steps) == 1 {
		err = steps[0](fctx, e.sql.DB())
	} else {
		err = e.sql.InTx(fctx, func(tx *sql.Tx) error {
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
	e.noteLeaseLost(ctx, res, len(o.Done), marked)
	return o, nil
}

// failed are a decision's failures as a Result reports them.
func (e *Engine[M]) failed(fs []Failure) []Failed[M] {
	if fs == nil {
		return nil
	}
	out := make([]Failed[M], len(fs))
	for i, f := range fs {
		out[i] = Failed[M]{Message: e.h.Message(f.Msg), Err: f.Err, Dead: f.Dead, NextAttempt: f.NextAttempt}
	}
	return out
}

// releasedGroup is rows handed back with the same last error.
type releasedGroup struct {
	ids []int64
	err string
}

func groupReleased(rows []ReleasedRow) []releasedGroup {
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
