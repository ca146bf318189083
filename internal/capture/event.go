// Package capture is the second half of the capture path: the events a statement made, held in the
// application's transaction and written in one multi-row INSERT just before it commits (Watch, Tx,
// Inserter). The first half — which rows a statement changed and the event of each — calls it with
// the events (Inserter.Insert); it never looks at the relay, which it wakes through Waker.
package capture

import (
	"errors"
	"time"
)

// Event is one outbox row about to be inserted.
type Event struct {
	MessageID     string
	Type          string
	AggregateType string
	AggregateID   string
	Payload       string  // JSON text
	Headers       *string // JSON text; nil: SQL NULL
	CreatedAt     time.Time
	DeliverAt     *time.Time // DeliverAfter, DeliverAt: not published before; nil: at once
}

// Due is the time a delayed event becomes due, or nil for one due at once (a zero time, or one not
// after the event's creation).
func Due(t, created time.Time) *time.Time {
	if t.IsZero() || !t.After(created) {
		return nil
	}
	t = t.UTC()
	return &t
}

// Errors of the transaction watch, which the root package exports under the same names
// (outboxplugin.ErrTransactionRolledBack, …) and documents.
var (
	ErrTransactionRolledBack = errors.New("the database rolled the transaction back")
	ErrTransactionEnded      = errors.New("the transaction was ended")
	ErrUnknownSavepoint      = errors.New("rollback to a savepoint the plugin did not see")
	ErrCommitUnknown         = errors.New("whether the transaction committed is not known")
)
