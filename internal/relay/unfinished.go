package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// Events whose publish kills the relay. Such an event never returns a failure: its attempt is counted
// at claim, its lease runs out, and the claim that takes it over (and, with it, every batch-mate that
// died with it) sees rows whose delivery did not finish (store.Row.Unfinished). Published together
// again, they would crash the next relay together, each crash counting an attempt against all of them,
// until every one of them reached its maximum: the poison would take its batch-mates to dead with it.
//
// So a claim that finds such rows publishes them one by one, each recorded before the next starts,
// and counts an attempt only for the delivery under way: the claim's attempt is given back for all but
// the first, and counted again just before each is published. A crash then counts an attempt against
// one event only; the ones before it are done, the ones after it untouched. The rest of the batch (rows
// of no unfinished delivery) is handed back for the next claim. A claim never hands out an event whose
// attempts already reached the maximum: buryUnpublishable makes it dead first.

// isolateUnfinished returns the rows of a claimed batch to publish one by one, with alone set, when the
// batch holds rows taken over from unfinished deliveries; otherwise rows as they are.
func (e *Engine[M]) isolateUnfinished(ctx context.Context, rows []store.Row) ([]store.Row, bool) {
	if !slices.ContainsFunc(rows, func(r store.Row) bool { return r.Unfinished }) {
		return rows, false // the usual case
	}
	var unfinished []store.Row
	var later, fresh []int64
	for _, r := range rows {
		switch {
		case !r.Unfinished:
			fresh = append(fresh, r.ID)
		case len(unfinished) == 0:
			unfinished = append(unfinished, r)
		default:
			r.Msg.Attempt--
			unfinished = append(unfinished, r)
			later = append(later, r.ID)
		}
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
	defer cancel()
	err := e.sql.InTx(fctx, func(tx *sql.Tx) error {
		if len(later) > 0 {
			if err := e.sql.CountAttempt(fctx, tx, e.cfg.Owner, later, -1); err != nil {
				return err
			}
		}
		if len(fresh) > 0 {
			return e.sql.Release(fctx, tx, e.cfg.Owner, fresh, "")
		}
		return nil
	})
	if err != nil {
		// Publish the batch as it is: a crash would count against all of it, once more.
		e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: could not set apart events taken over from unfinished deliveries; publishing them together",
			slog.String("worker", e.cfg.Owner), slog.Int("events", len(rows)), slog.Any("error", err))
		return rows, false
	}
	return unfinished, true
}

// deliverAlone publishes and records the rows of c one at a time (see isolateUnfinished), and reports
// them to the observer as one batch.
func (e *Engine[M]) deliverAlone(ctx context.Context, c *claimedBatch[M]) (published int, err error) {
	held := c.lease // the rows not recorded yet, renewed meanwhile
	defer func() { e.drop(held, nil) }()
	res := c.res
	start := time.Now()
	for i := range c.rows {
		if i > 0 {
			until := e.leaseEnd(held)
			e.drop(held, nil)
			held = e.hold(c.rows[i:], time.Now(), until)
		}
		r := c.rows[i]
		// Found by id: the statements before (this one's attempt, renewals) moved it on PostgreSQL.
		r.Ctid = ""
		if ctx.Err() != nil || !e.leaseLive(held) {
			// Stopping, or the lease ran out (renewals failed): the rest were not started, and their
			// attempts were given back already.
			ids := store.RowIDs(c.rows[i:])
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
			err := e.sql.CountAttempt(fctx, e.sql.DB(), e.cfg.Owner, ids, 0)
			cancel()
			if err != nil {
				return published, fmt.Errorf("outboxplugin: hand back events: %w", err)
			}
			res.Released += len(ids)
			break
		}
		if i > 0 {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
			err := e.sql.CountAttempt(fctx, e.sql.DB(), e.cfg.Owner, []int64{r.ID}, +1)
			cancel()
			if err != nil {
				return published, fmt.Errorf("outboxplugin: count an attempt: %w", err)
			}
			r.Msg.Attempt++
		}
		lctx, stop := e.leaseContext(ctx, held)
		msgs := []M{e.h.Message(r.Msg)}
		out := e.deliver(lctx, []store.Row{r}, msgs)
		ranOut := errors.Is(context.Cause(lctx), errLeaseRanOut)
		stop()
		var one Result[M]
		if _, err := e.finish(ctx, []store.Row{r}, msgs, out, &one, ranOut); err != nil {
			return published, fmt.Errorf("outboxplugin: record batch outcome: %w", err)
		}
		published += len(one.Published)
		res.Published = append(res.Published, one.Published...)
		res.Failed = append(res.Failed, one.Failed...)
		res.NotDelivered = append(res.NotDelivered, one.NotDelivered...)
		res.Released += one.Released
		res.LeaseLost += one.LeaseLost
	}
	res.PublishDuration = time.Since(start)
	e.h.BatchDone(ctx, res)
	return published, nil
}
