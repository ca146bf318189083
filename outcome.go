package outboxplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay"
)

// What a publish says about each message, and what the worker then does with its row.
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

// deliver publishes msgs within one publish timeout and returns the outcome of each. Ids a
// *PublishError named that were not in the call's messages are ignored, and logged.
func (w *Worker) deliver(ctx context.Context, msgs []Message) []relay.Delivery {
	pctx, cancel := context.WithTimeout(ctx, w.cfg.publishTimeout)
	defer cancel()
	start := time.Now()
	out, unknown := splitPublish(pctx, msgs, w.call)
	// One duration for the whole publish: a message's verdict is known when the publish that split
	// its batch ends, and the messages of a statement (retryGroup) share one history entry.
	took := time.Since(start)
	for i := range out {
		out[i].Took = took
	}
	if len(unknown) > 0 {
		w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: the publisher named messages that are not in its batch; ignored",
			slog.String("worker", w.owner), slog.Any("message_ids", firstFew(unknown)), slog.Int("count", len(unknown)))
	}
	return out
}

// splitPublish is deliver's algorithm (relay.SplitPublish) on msgs, with the publisher call as a
// parameter (tests drive it with scripted publishers) and the publisher's errors read as this
// package defines them: a *PublishError names messages, ErrBrokerUnavailable and ErrMisconfigured
// spend no attempt.
func splitPublish(ctx context.Context, msgs []Message, call func(context.Context, []Message) error) (out []relay.Delivery, unknownIDs []string) {
	return relay.SplitPublish(ctx, len(msgs), func(i int) string { return msgs[i].ID },
		func(ctx context.Context, lo, hi int) error { return call(ctx, msgs[lo:hi]) }, publisherAnswers)
}

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

// errNotFinished is the last error of an event given up on at claim: it has had its maximum of
// deliveries, and the last of them recorded no outcome — the publish killed the process, or the process
// died meanwhile (or the maximum was lowered since).
func errNotFinished(attempts int) error {
	return fmt.Errorf("outboxplugin: gave up after %d deliveries that did not finish", attempts)
}
