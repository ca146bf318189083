package outboxplugin

import "errors"

// Errors a caller can act on. They are returned wrapped, with the operation and the model named;
// match them with errors.Is.
var (
	// ErrInvalidOption is returned by db.Use when an option is out of range.
	ErrInvalidOption = errors.New("invalid option")

	// ErrInvalidTableName is returned by db.Use when WithTableName, and by the worker's methods when
	// WithTable, is not a plain SQL identifier (letters, digits and underscores, not starting with a
	// digit, optionally schema-qualified). It comes wrapped together with ErrInvalidOption.
	ErrInvalidTableName = errors.New("invalid outbox table name")

	// ErrEmptyEventType is returned when an event would have no type.
	ErrEmptyEventType = errors.New("empty event type")

	// ErrInvalidJSON is returned when a payload or headers given as raw JSON are not valid JSON.
	ErrInvalidJSON = errors.New("invalid JSON")

	// ErrEncodePayload wraps the error of a payload that cannot be encoded as JSON. The write that
	// produced it fails and its transaction rolls back: no business row is committed without its
	// event.
	ErrEncodePayload = errors.New("cannot encode event payload as JSON")

	// ErrNotInTransaction is returned by Emit when tx is not inside a transaction: an event written
	// outside the business transaction could outlive a rollback or be lost by a crash.
	ErrNotInTransaction = errors.New("not inside a transaction")

	// ErrConcurrentChange is returned when a write without primary keys (an update or delete by
	// condition) changed more rows than the plugin locked and listed just before it. That happens
	// only when another transaction commits a matching row between the two statements, under an
	// isolation level that allows it (READ COMMITTED). The write is rolled back; retrying it is safe.
	ErrConcurrentChange = errors.New("rows matching the condition changed concurrently")
)
