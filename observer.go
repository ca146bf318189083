package outboxplugin

import (
	"context"
	"time"
)

// Observer receives what the worker does, for metrics, tracing and alerting. Its methods must return
// quickly and be safe for concurrent use: BatchDone and Dead are called from Run's loop, Backlog from
// the maintenance goroutine beside it. Embed NopObserver to implement only some.
type Observer interface {
	// BatchDone is called after each batch that claimed at least one event.
	BatchDone(ctx context.Context, r BatchResult)
	// Dead is called once for each event that is given up on, with the error of its last delivery.
	Dead(ctx context.Context, m Message, err error)
	// Backlog reports the number of pending events: to be published now or after a retry's pause
	// (due, leased and waiting, as Admin.Stats counts them; dead and scheduled ones excluded),
	// measured every backlog interval (WithBacklogInterval) while the worker runs.
	Backlog(ctx context.Context, pending int64)
}

// BacklogAgeObserver is an Observer that is also told how old the backlog is. When the worker's
// observer implements it, each backlog measurement reads, with the count, the created_at of the
// oldest pending event (dead and scheduled ones excluded: a delayed event is not late before its
// time), and calls OldestPending with it right after Backlog: the zero time when nothing is pending.
type BacklogAgeObserver interface {
	Observer
	OldestPending(ctx context.Context, createdAt time.Time)
}

// ScheduledObserver is an Observer that is also told how many delayed events wait for their time
// (scheduled, as Admin.Stats counts them: never attempted, next_attempt_at in the future). When the
// worker's observer implements it, Scheduled is called with each backlog measurement, after Backlog
// (and OldestPending).
type ScheduledObserver interface {
	Observer
	Scheduled(ctx context.Context, n int64)
}

// TableHealthObserver is an Observer that is also given the outbox table's health: its size, bloat,
// upkeep and partitions, as Admin.TableHealth reads them (catalog and statistics views only). When
// the worker's observer implements it, Run reads the health every table health interval
// (WithTableHealthInterval, default DefaultTableHealthEvery) and calls TableHealth with it; a figure
// the database did not give is nil, not zero.
type TableHealthObserver interface {
	Observer
	TableHealth(ctx context.Context, h TableHealth)
}

// BatchResult is what happened to one batch.
type BatchResult struct {
	// Claimed is the number of events the batch took.
	Claimed int
	// Published are the messages the publisher accepted. They were then marked done (or deleted), all
	// but LeaseLost of them.
	Published []Message
	// Failed are the messages that were not published; each will be retried, or is dead.
	Failed []FailedMessage
	// NotDelivered are the messages the publish failed without the broker refusing them: the
	// publisher returned an error for the whole batch (connection refused or lost, a timeout) that
	// splitting the batch did not pin on a message, or named them with an error wrapping
	// ErrBrokerUnavailable or ErrMisconfigured (errors.Is on Err tells a configuration error apart:
	// a destination that does not exist, credentials refused). They are pending again with their
	// attempt given back (their Err is recorded as last_error); none is ever made dead this way.
	NotDelivered []FailedMessage
	// Released is the number of events handed back unpublished, with the attempt given back, because
	// the worker was stopping.
	Released int
	// LeaseLost is the number of published events the worker could no longer mark done: their lease
	// had run out (renewals failed, or the worker was stalled) and another worker took them over, so
	// they are published twice. Logged at warn too; counted whether the worker marks the batch on its
	// own or together with its next claim.
	LeaseLost int
	// Durations of the three steps: claiming, publishing, and recording the outcome.
	ClaimDuration, PublishDuration, FinishDuration time.Duration
}

// FailedMessage is a message whose delivery failed.
type FailedMessage struct {
	Message Message
	Err     error
	// Dead is true when this was the last attempt: the event will not be retried.
	Dead bool
	// NextAttempt is when the event becomes due again (zero when Dead).
	NextAttempt time.Time
}

// NopObserver ignores everything; embed it to implement part of Observer.
type NopObserver struct{}

// BatchDone does nothing.
func (NopObserver) BatchDone(context.Context, BatchResult) {}

// Dead does nothing.
func (NopObserver) Dead(context.Context, Message, error) {}

// Backlog does nothing.
func (NopObserver) Backlog(context.Context, int64) {}
