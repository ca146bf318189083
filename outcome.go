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
// stops after splitBudget calls: an outage costs a few fast-failing calls per batch, not one per
// message.

// splitBudget is how many calls a batch may fail as a whole, naming no message, while the broker has
// taken none of it, before the worker takes the broker for down: the whole batch and two levels of
// halves, which isolate up to three poison messages in most batches.
const splitBudget = 7

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

// splitPublish is deliver's algorithm, with the publisher call as a parameter (tests drive it with
// scripted publishers).
func splitPublish(ctx context.Context, msgs []Message, call func(context.Context, []Message) error) (out []relay.Delivery, unknownIDs []string) {
	out = make([]relay.Delivery, len(msgs))
	type span struct{ lo, hi int }
	queue := []span{{0, len(msgs)}}
	var (
		took       bool  // the broker took at least one message of the batch
		wholeFails int   // calls that failed whole, naming no message, while took was false
		alone      []int // messages that failed whole, alone
		lastErr    error
	)
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		if ctx.Err() != nil || (!took && wholeFails >= splitBudget) {
			markUnsent(out[s.lo:s.hi], cmpErr(ctx.Err(), lastErr))
			continue
		}
		part := msgs[s.lo:s.hi]
		err := call(ctx, part)
		if err == nil {
			took = true
			continue
		}
		var partial *PublishError
		if errors.As(err, &partial) {
			named, unknown := 0, []string(nil)
			for id, ferr := range partial.Failed {
				i := indexOfMessage(part, id)
				if i < 0 {
					unknown = append(unknown, id)
					continue
				}
				if ferr == nil {
					ferr = err
				}
				kind := relay.Refused
				if notTaken(ferr) {
					kind = relay.Unsent
				}
				out[s.lo+i] = relay.Delivery{Kind: kind, Err: ferr}
				named++
			}
			for _, id := range unknown {
				unknownIDs = appendNew(unknownIDs, id)
			}
			if named > 0 {
				if named < len(part) {
					took = true
				}
				if refusedAny(out[s.lo:s.hi]) {
					took = true // the broker answered for a message: it is up
				}
				continue
			}
			// A PublishError that names no message of the call is a failure of the whole call.
		}
		lastErr = err
		if !took {
			wholeFails++
		}
		if ctx.Err() != nil || notTaken(err) {
			// The publish timeout (or shutdown) cut the call short, or the publisher says the broker
			// is not there or is configured wrong: that says nothing of the messages, and splitting
			// would not either.
			markUnsent(out[s.lo:s.hi], err)
			continue
		}
		if len(part) == 1 {
			out[s.lo] = relay.Delivery{Kind: relay.Unsent, Err: err}
			alone = append(alone, s.lo)
			continue
		}
		mid := s.lo + len(part)/2
		queue = append(queue, span{s.lo, mid}, span{mid, s.hi})
	}
	if took {
		// The broker was up: a message that failed alone was refused.
		for _, i := range alone {
			out[i].Kind = relay.Refused
		}
	}
	return out, unknownIDs
}

// notTaken reports whether err, a publisher's error, says the broker did not take the message(s)
// for a reason that is not theirs: it is unavailable, or it or the relay is misconfigured. No
// attempt is spent on such a delivery.
func notTaken(err error) bool {
	return errors.Is(err, ErrBrokerUnavailable) || errors.Is(err, ErrMisconfigured)
}

func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return errors.New("not published")
}

func refusedAny(out []relay.Delivery) bool {
	for _, d := range out {
		if d.Kind == relay.Refused {
			return true
		}
	}
	return false
}

func markUnsent(out []relay.Delivery, err error) {
	for i := range out {
		if out[i].Kind == relay.Delivered {
			out[i] = relay.Delivery{Kind: relay.Unsent, Err: err}
		}
	}
}

func indexOfMessage(msgs []Message, id string) int {
	for i := range msgs {
		if msgs[i].ID == id {
			return i
		}
	}
	return -1
}

// errNotFinished is the last error of an event given up on at claim: it has had its maximum of
// deliveries, and the last of them recorded no outcome — the publish killed the process, or the process
// died meanwhile (or the maximum was lowered since).
func errNotFinished(attempts int) error {
	return fmt.Errorf("outboxplugin: gave up after %d deliveries that did not finish", attempts)
}
