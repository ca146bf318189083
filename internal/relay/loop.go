package relay

import (
	"context"
	"log/slog"
	"time"
)

// MaxPublishBackoff caps Run's pause after a batch the broker took none of (unless the poll interval
// is longer): during an outage the worker tries again at most this often, and after it, new events
// wait at most this long.
const MaxPublishBackoff = 10 * time.Second

// loop is Run's state between turns: the batch carried to the next claim to be marked, the batch
// claimed ahead, how long the latest batch took, and the failures in a row.
type loop[M any] struct {
	e        *Engine[M]
	carried  *carriedBatch[M] // published, to be marked done by the next claim
	ahead    *claimedBatch[M] // claimed while the batch before it was being published
	pace     batchPace        // how long the latest batch took to claim and to publish
	failures int              // consecutive turns that failed (database errors, or the broker away)
}

// turn is one turn of Run. It takes the batch claimed ahead, or claims one (marking the carried batch
// done in the same statement), publishes it and records the outcome. When the batch is full and the
// worker pipelines, the next batch is claimed — and this turn's carried batch marked — while the
// publisher works, so that the database and the broker are busy at the same time; that batch is
// published by the next turn. outage reports that the broker took none of the batch.
func (l *loop[M]) turn(ctx context.Context) (published int, outage bool, err error) {
	e := l.e
	c := l.ahead
	l.ahead = nil
	if c == nil {
		c, err = l.claim(ctx)
		if err != nil || len(c.rows) == 0 {
			return 0, false, err
		}
	}
	if c.alone {
		l.markCarried(ctx)
		n, err := e.deliverAlone(ctx, c)
		return n, false, err
	}
	// A batch claimed ahead leaves the batch before it carried: the claim made while this one is
	// published marks it, even when this batch is short — unless the publisher has become too fast
	// for the overlap to pay.
	if !e.pipeline || (l.carried == nil && len(c.rows) < e.cfg.BatchSize) || !l.pace.overlapPays() {
		// This batch may have been claimed ahead, and no claim will run while it is published to
		// mark the one before it: mark that one now.
		l.markCarried(ctx)
		e.publishBatch(ctx, c)
		l.pace = batchPace{c.res.ClaimDuration, c.res.PublishDuration}
		n, next, outage, err := e.completeBatch(ctx, c, true)
		l.carried = next
		return n, outage, err
	}
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		e.publishBatch(ctx, c)
	}()
	next, claimErr := l.claim(ctx)
	<-pubDone
	l.pace = batchPace{c.res.ClaimDuration, c.res.PublishDuration}
	if claimErr == nil && len(next.rows) > 0 {
		l.ahead = next
	}
	n, done, outage, err := e.completeBatch(ctx, c, true)
	l.carried = done
	if err == nil && claimErr != nil {
		err = claimErr
	}
	return n, outage, err
}

// claim claims a batch, marking the carried batch done with it; when the claim fails, the carried
// batch is marked on its own.
func (l *loop[M]) claim(ctx context.Context) (*claimedBatch[M], error) {
	prev := l.carried
	l.carried = nil
	c, err := l.e.claimBatch(ctx, prev)
	if prev != nil && !prev.marked {
		l.e.finishCarried(ctx, prev) // the claim that was to mark it failed
	}
	return c, err
}

// markCarried marks the carried batch done on its own, when no claim will mark it.
func (l *loop[M]) markCarried(ctx context.Context) {
	if l.carried != nil {
		l.e.finishCarried(ctx, l.carried)
		l.carried = nil
	}
}

// pause says how long Run waits after a turn, and whether a wake-up may cut the wait short.
func (l *loop[M]) pause(ctx context.Context, published int, outage bool, err error) (wait time.Duration, wakeable bool) {
	e := l.e
	poll := e.cfg.PollInterval
	wait = poll
	switch {
	case err != nil:
		l.failures++
		wait = min(poll*time.Duration(1<<min(l.failures, 6)), 30*time.Second+poll)
		e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: relay batch failed",
			slog.String("worker", e.cfg.Owner), slog.Int("consecutive_failures", l.failures), slog.Any("error", err))
	case outage:
		// The broker took none of the batch and refused none of it: it is probably down. The events
		// are pending again with their attempts given back. Back off, ignoring wake-ups meanwhile, so
		// that an outage costs a claim, a write and a log line now and then, not one per commit of the
		// application — and no attempts, however long it lasts.
		l.failures++
		wait = min(poll*time.Duration(1<<min(l.failures, 6)), max(MaxPublishBackoff, poll))
		if l.ahead != nil {
			e.releaseAhead(ctx, l.ahead) // its lease would be renewed for nothing while the worker waits
			l.ahead = nil
		}
	case published == e.cfg.BatchSize || l.ahead != nil:
		l.failures = 0
		wait = 0 // more may be waiting
	default:
		l.failures = 0
	}
	// Backing off: a notification must not cut the pause short.
	return wait, l.failures == 0
}

// stop hands back the batch claimed ahead and marks the carried one, when Run returns.
func (l *loop[M]) stop(ctx context.Context) {
	if l.ahead != nil {
		l.e.releaseAhead(ctx, l.ahead)
		l.ahead = nil
	}
	if l.carried != nil && !l.carried.marked {
		l.e.finishCarried(ctx, l.carried)
		l.carried = nil
	}
}

// overlapMin is the least share of a claim's time that publishing must take for Run to claim ahead.
// Below it the overlap saves little, and costs the other workers on the table: a batch claimed ahead
// is leased rows that their claims must step over. A publisher that does nothing takes microseconds
// against a claim's milliseconds; a broker's round trip takes far more than an eighth of a claim.
const overlapMin = 8

// batchPace is how long Run's latest batch took to claim and to publish.
type batchPace struct{ claim, publish time.Duration }

// overlapPays reports whether the latest batch took long enough to publish that claiming the next one
// meanwhile pays; before any batch, it assumes so.
func (p batchPace) overlapPays() bool {
	return p.claim == 0 || p.publish*overlapMin >= p.claim
}
