// Package relay is the relay's engine: the loop that claims a batch, publishes it, decides what
// became of each message and records it (Engine), with the small state it keeps between turns (the
// batch claimed ahead, the batch carried to the next claim to be marked, how long the latest took),
// the leases it renews while it holds a batch, and the one-by-one delivery of rows taken over after a
// crash. Its decisions need no database: SplitPublish tells a message at fault from an outage, and
// Decide (pure, with table tests) says what to write for a batch. The SQL it records with is the
// store's (internal/relay/store). The root package's Worker is its public face: it makes the engine
// from its options and gives it the publisher, the observer and the logger as Hooks.
package relay

import (
	"strconv"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/failure"
	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// DeliveryKind is what became of one message of a publish.
type DeliveryKind uint8

const (
	Delivered DeliveryKind = iota // the broker took it
	Refused                       // the broker refused it, or it failed alone while the broker took others
	Unsent                        // it failed with its batch, and nothing says it was the message's fault
)

// Delivery is the outcome of one message of a publish.
type Delivery struct {
	Kind DeliveryKind
	Err  error
	// Took is how long the publish that decided it took, from its start (the worker's deliver) to its end:
	// the attempt's duration in the event's history.
	Took time.Duration
}

// Outcome is what the worker writes for a batch after its publish.
type Outcome struct {
	Done     []store.Row   // published: processed (or deleted)
	Retries  []RetryGroup  // refused, with attempts left: pending again at their next time
	Dead     []DeadRow     // refused at their last attempt
	Released []ReleasedRow // not delivered (outage, or shutdown): pending again, the attempt given back
	Failed   []Failure     // refused, for BatchResult, in batch order
	Unsent   []Failure     // not delivered (not at shutdown), for BatchResult
	Stopped  int           // released because the worker was stopping
	// Outage: the broker took none of the batch and refused none of it.
	Outage bool
}

// RetryGroup are refused rows that failed alike (same attempt, same error): one statement schedules
// them.
type RetryGroup struct {
	IDs     []int64
	Next    time.Time
	Err     string
	Attempt failure.Record // for the rows' histories
}

// DeadRow is a row refused at its last attempt.
type DeadRow struct {
	ID      int64
	Err     string
	Attempt failure.Record
}

// ReleasedRow is a row handed back unpublished.
type ReleasedRow struct {
	ID  int64
	Err string // the last error to record; empty keeps the one there
}

// Failure is a message that was refused or not delivered, as the worker reports it
// (outboxplugin.FailedMessage).
type Failure struct {
	Msg         store.Message
	Err         error
	Dead        bool
	NextAttempt time.Time
}

// Decide turns a batch's deliveries into what to write. It is pure: rows and out are aligned, and
// stopping says the worker is shutting down (a message not delivered is then handed back, whatever
// the reason). Refused messages at attempt maxAttempts or more are dead; the others wait for
// backoff(attempt), grouped so that messages that failed alike share one statement. Each refusal
// comes with the record of its attempt, for the event's history; messages not delivered have none
// (their attempt is given back).
func Decide(rows []store.Row, out []Delivery, stopping bool, maxAttempts int, backoff func(attempt int) time.Duration, now time.Time) Outcome {
	var o Outcome
	groups := map[string]int{}
	sent, refusedN := 0, 0
	for i, r := range rows {
		d := out[i]
		switch {
		case d.Kind == Delivered:
			o.Done = append(o.Done, r)
			sent++
		case stopping:
			o.Released = append(o.Released, ReleasedRow{ID: r.ID})
			o.Stopped++
		case d.Kind == Unsent:
			o.Released = append(o.Released, ReleasedRow{ID: r.ID, Err: failure.LastError(d.Err)})
			o.Unsent = append(o.Unsent, Failure{Msg: r.Msg, Err: d.Err})
		case r.Msg.Attempt >= maxAttempts:
			refusedN++
			o.Dead = append(o.Dead, DeadRow{ID: r.ID, Err: failure.LastError(d.Err), Attempt: failure.Attempt(now, r.Msg.Attempt, d.Err, d.Took)})
			o.Failed = append(o.Failed, Failure{Msg: r.Msg, Err: d.Err, Dead: true})
		default:
			refusedN++
			msg := failure.LastError(d.Err)
			key := strconv.Itoa(r.Msg.Attempt) + "\x00" + msg
			g, ok := groups[key]
			if !ok {
				g = len(o.Retries)
				groups[key] = g
				// Grouped by attempt and error text: the group's rows share the history entry
				// of the first (they failed in one publish, whose duration they share too).
				o.Retries = append(o.Retries, RetryGroup{Next: now.Add(backoff(r.Msg.Attempt)), Err: msg,
					Attempt: failure.Attempt(now, r.Msg.Attempt, d.Err, d.Took)})
			}
			o.Retries[g].IDs = append(o.Retries[g].IDs, r.ID)
			o.Failed = append(o.Failed, Failure{Msg: r.Msg, Err: d.Err, NextAttempt: o.Retries[g].Next})
		}
	}
	o.Outage = !stopping && sent == 0 && refusedN == 0 && len(o.Released) > 0
	return o
}
