package outboxplugin

import (
	"context"
	"errors"
	"log/slog"

	"github.com/gorm-outbox/outboxplugin/internal/relay"
)

// What a publish says about each message, as the engine (internal/relay) reads it, and what the
// worker then reports of a batch to its logger and observer.
//
// A publisher answers for a batch: nil (every message taken), a *PublishError naming the messages the
// broker refused, or another error. Only a refusal says something about a message; an error that
// names none (connection refused, a timeout, broker unavailable) says the broker was not there, and
// spends no attempt (and so does one that says the broker or the relay is misconfigured,
// ErrMisconfigured): the rows go back to pending as they were, and Run backs off. But an error that
// names none may also be one message making the publisher fail its whole batch (too large, say).
// So a batch that fails whole is split in halves, and the halves published; once the broker has
// taken any message of the batch it is known to be up, and the splitting goes on until each message
// that still fails stands alone — a refusal of that message. While it has taken none, splitting
// stops after relay.SplitBudget calls: an outage costs a few fast-failing calls per batch, not one per
// message.

// publisherAnswers reads a publisher's error for relay.SplitPublish.
var publisherAnswers = relay.Answers{Named: namedFailures, NotTaken: notTaken}

// namedFailures are the messages a *PublishError in err's chain names.
func namedFailures(err error) (map[string]error, bool) {
	var partial *PublishError
	if errors.As(err, &partial) {
		return partial.Failed, true
	}
	return nil, false
}

// notTaken reports whether err, a publisher's error, says the broker did not take the message(s)
// for a reason that is not theirs: it is unavailable, or it or the relay is misconfigured. No
// attempt is spent on such a delivery.
func notTaken(err error) bool {
	return errors.Is(err, ErrBrokerUnavailable) || errors.Is(err, ErrMisconfigured)
}

// batchResult is a batch's result as the observer is given it.
func batchResult(r relay.Result[Message]) BatchResult {
	return BatchResult{
		Claimed: r.Claimed, Published: r.Published,
		Failed: failedMessages(r.Failed), NotDelivered: failedMessages(r.NotDelivered),
		Released: r.Released, LeaseLost: r.LeaseLost,
		ClaimDuration: r.ClaimDuration, PublishDuration: r.PublishDuration, FinishDuration: r.FinishDuration,
	}
}

// failedMessages are a batch's failures as BatchResult reports them.
func failedMessages(fs []relay.Failed[Message]) []FailedMessage {
	if fs == nil {
		return nil
	}
	out := make([]FailedMessage, len(fs))
	for i, f := range fs {
		out[i] = FailedMessage(f)
	}
	return out
}

// report logs what failed in a recorded batch, counts it, and gives the observer the batch and each
// event it made dead.
func (w *Worker) report(ctx context.Context, res BatchResult) {
	w.logFailures(ctx, res)
	w.batchDone(ctx, res)
	for _, f := range res.Failed {
		if f.Dead {
			w.cfg.observer.Dead(ctx, f.Message, f.Err)
		}
	}
}

// buried reports the events a claim made dead before their delivery: they could not be read, or every
// delivery of theirs started and none finished.
func (w *Worker) buried(ctx context.Context, dead []relay.Failed[Message]) {
	fs := failedMessages(dead)
	for _, f := range fs {
		w.cfg.observer.Dead(ctx, f.Message, f.Err)
	}
	w.counts.dead.Add(int64(len(fs)))
	for _, g := range groupFailures(BatchResult{Failed: fs}) {
		w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: events marked dead before their delivery",
			slog.String("worker", w.owner), slog.Int("events", g.n), slog.Any("event_types", g.types),
			slog.Any("message_ids", g.ids), slog.Any("error", g.err))
	}
}
