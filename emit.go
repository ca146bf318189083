package outboxplugin

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/internal/capture"
	"github.com/gorm-outbox/outboxplugin/internal/msgid"
)

// unregistered writes the events Emit is asked for on a database without the plugin: default options.
var unregistered = New()

// EmitOption adds to an event written with Emit.
type EmitOption func(*capture.Event, map[string]string)

// WithAggregate sets the aggregate an emitted event belongs to; together the two form its message key.
func WithAggregate(aggregateType, aggregateID string) EmitOption {
	return func(e *capture.Event, _ map[string]string) {
		e.AggregateType, e.AggregateID = aggregateType, aggregateID
	}
}

// WithHeaders adds headers to an emitted event, over those of WithContextHeaders.
func WithHeaders(h map[string]string) EmitOption {
	return func(_ *capture.Event, headers map[string]string) {
		maps.Copy(headers, h)
	}
}

// DeliverAfter delays an emitted event by d: it is published no earlier than d after it was written,
// at least once, by the first poll of a worker after that (workers poll every WithPollInterval, 1 s by
// default; the wake-up of a commit does not wait for the delay). A d of zero or less publishes it at
// once. With WithKeyOrdering, a delayed event holds back the later events of its key until it is
// published; without it, later events of the key may be published before it.
func DeliverAfter(d time.Duration) EmitOption {
	return func(e *capture.Event, _ map[string]string) {
		e.DeliverAt = capture.Due(e.CreatedAt.Add(d), e.CreatedAt)
	}
}

// DeliverAt is DeliverAfter with a time: the event is published no earlier than t. A zero t, or one
// not after the event's write, publishes it at once.
func DeliverAt(t time.Time) EmitOption {
	return func(e *capture.Event, _ map[string]string) {
		e.DeliverAt = capture.Due(t, e.CreatedAt)
	}
}

// Emit writes an explicit domain event in tx's transaction: it commits with the transaction's other
// writes or not at all. payload is encoded as JSON (json.RawMessage, JSON and []byte are taken as
// already encoded and must be valid JSON). The table is that of the plugin registered on tx, or
// DefaultTableName.
//
// Emit refuses, writing nothing: an empty eventType (ErrEmptyEventType), a payload that cannot be
// encoded (ErrEncodePayload), and a tx that is not inside a transaction (ErrNotInTransaction) — use
// it inside db.Transaction(func(tx *gorm.DB) error { ... }) or after db.Begin().
func Emit(tx *gorm.DB, eventType string, payload any, opts ...EmitOption) error {
	if tx == nil || tx.Statement == nil {
		return errors.New("outboxplugin: Emit: nil *gorm.DB")
	}
	if tx.Error != nil {
		return fmt.Errorf("outboxplugin: Emit %q: %w", eventType, tx.Error)
	}
	if eventType == "" {
		return fmt.Errorf("outboxplugin: Emit: %w", ErrEmptyEventType)
	}
	if !capture.InTransaction(tx.Statement.ConnPool) {
		return fmt.Errorf("outboxplugin: Emit %q: %w", eventType, ErrNotInTransaction)
	}
	body, err := capture.EncodePayload(rawJSON(payload))
	if err != nil {
		return fmt.Errorf("outboxplugin: Emit %q: %w", eventType, err)
	}

	p := pluginOf(tx)
	if p == nil {
		p = unregistered
	}
	ctx := tx.Statement.Context
	headers := map[string]string{}
	if p.cfg.headers != nil {
		maps.Copy(headers, p.cfg.headers(ctx))
	}
	ev := capture.Event{Type: eventType, Payload: body, CreatedAt: now()}
	for _, opt := range opts {
		if opt != nil {
			opt(&ev, headers)
		}
	}
	if ev.Headers, err = capture.EncodeHeaders(headers); err != nil {
		return fmt.Errorf("outboxplugin: Emit %q: %w", eventType, err)
	}
	ev.MessageID = msgid.New()
	if err := p.c.Insert(tx, tx.Statement.ConnPool, []capture.Event{ev}, fmt.Sprintf("Emit %q", eventType)); err != nil {
		return fmt.Errorf("outboxplugin: Emit %q: %w", eventType, err)
	}
	return nil
}
