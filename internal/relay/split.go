package relay

import (
	"context"
	"errors"
	"slices"
)

// SplitBudget is how many calls a batch may fail as a whole, naming no message, while the broker has
// taken none of it, before the worker takes the broker for down: the whole batch and two levels of
// halves, which isolate up to three poison messages in most batches.
const SplitBudget = 7

// Answers reads a publisher's error for SplitPublish: Named returns the failures it names by message
// id (ok false when it names none: the call failed whole), NotTaken reports an error that says the
// broker did not take a message for a reason that is not the message's (it is down, or it or the
// relay is misconfigured), which spends no attempt.
type Answers struct {
	Named    func(err error) (failed map[string]error, ok bool)
	NotTaken func(err error) bool
}

// SplitPublish publishes the n messages of a batch (id(i) is the i-th one's id) through call, and
// returns what became of each, and the ids a publisher's error named that are not in the batch.
// A call that fails whole, naming no message, is split in halves, and the halves published: once the
// broker has taken any message of the batch it is known to be up, and the splitting goes on until each
// message that still fails stands alone — a refusal of that message. While it has taken none,
// splitting stops after SplitBudget calls: an outage costs a few fast-failing calls per batch, not
// one per message. An error that spends no attempt (a.NotTaken), or the end of ctx, leaves the
// messages of the call unsent, and is not split.
func SplitPublish(ctx context.Context, n int, id func(i int) string, call func(ctx context.Context, lo, hi int) error, a Answers) (out []Delivery, unknownIDs []string) {
	out = make([]Delivery, n)
	type span struct{ lo, hi int }
	queue := []span{{0, n}}
	var (
		took       bool  // the broker took at least one message of the batch
		wholeFails int   // calls that failed whole, naming no message, while took was false
		alone      []int // messages that failed whole, alone
		lastErr    error
	)
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		if ctx.Err() != nil || (!took && wholeFails >= SplitBudget) {
			MarkUnsent(out[s.lo:s.hi], cmpErr(ctx.Err(), lastErr))
			continue
		}
		size := s.hi - s.lo
		err := call(ctx, s.lo, s.hi)
		if err == nil {
			took = true
			continue
		}
		if failed, ok := a.Named(err); ok {
			named, unknown := 0, []string(nil)
			for mid, ferr := range failed {
				i := indexOf(id, s.lo, s.hi, mid)
				if i < 0 {
					unknown = append(unknown, mid)
					continue
				}
				if ferr == nil {
					ferr = err
				}
				kind := Refused
				if a.NotTaken(ferr) {
					kind = Unsent
				}
				out[i] = Delivery{Kind: kind, Err: ferr}
				named++
			}
			for _, mid := range unknown {
				if !slices.Contains(unknownIDs, mid) {
					unknownIDs = append(unknownIDs, mid)
				}
			}
			if named > 0 {
				if named < size {
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
		if ctx.Err() != nil || a.NotTaken(err) {
			// The publish timeout (or shutdown) cut the call short, or the publisher says the broker
			// is not there or is configured wrong: that says nothing of the messages, and splitting
			// would not either.
			MarkUnsent(out[s.lo:s.hi], err)
			continue
		}
		if size == 1 {
			out[s.lo] = Delivery{Kind: Unsent, Err: err}
			alone = append(alone, s.lo)
			continue
		}
		half := s.lo + size/2
		queue = append(queue, span{s.lo, half}, span{half, s.hi})
	}
	if took {
		// The broker was up: a message that failed alone was refused.
		for _, i := range alone {
			out[i].Kind = Refused
		}
	}
	return out, unknownIDs
}

// cmpErr is the first error that is not nil, or a general one.
func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return errors.New("not published")
}

// refusedAny reports whether any of out was refused.
func refusedAny(out []Delivery) bool {
	for _, d := range out {
		if d.Kind == Refused {
			return true
		}
	}
	return false
}

// MarkUnsent makes every delivered message of out unsent with err: its publish did not count.
func MarkUnsent(out []Delivery, err error) {
	for i := range out {
		if out[i].Kind == Delivered {
			out[i] = Delivery{Kind: Unsent, Err: err}
		}
	}
}

// indexOf is the index in [lo, hi) whose id is mid, or -1.
func indexOf(id func(int) string, lo, hi int, mid string) int {
	for i := lo; i < hi; i++ {
		if id(i) == mid {
			return i
		}
	}
	return -1
}
