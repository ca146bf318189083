package outboxplugin

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Message is an outbox event as a publisher receives it.
type Message struct {
	// ID is the event's message id (a UUIDv7): unique, and the same on every delivery of the event.
	// Brokers that de-duplicate (JetStream's Nats-Msg-Id, AMQP message-id) and consumers should key
	// on it.
	ID string
	// EventType is the event's type, such as User_create or OrderPlaced.
	EventType string
	// Key identifies the aggregate, "<AggregateType>:<AggregateID>" (User:42), or is empty for
	// events without one. Publishers use it for partitioning, so that one aggregate's events stay in
	// order.
	Key string
	// AggregateType and AggregateID are the two halves of Key.
	AggregateType string
	AggregateID   string
	// Payload is the event's JSON document.
	Payload []byte
	// Headers are the event's headers (trace context and the like); nil when it has none.
	Headers map[string]string
	// CreatedAt is when the event was written, in UTC.
	CreatedAt time.Time
	// Attempt counts the deliveries of this event so far, this one included (1 on the first).
	Attempt int
}

// messageKey joins the aggregate into the message key.
func messageKey(aggregateType, aggregateID string) string {
	if aggregateType == "" && aggregateID == "" {
		return ""
	}
	return aggregateType + ":" + aggregateID
}

// Publisher sends a batch of messages to a broker. It returns nil when every message was accepted
// (acknowledged by the broker), a *PublishError (possibly wrapped) naming the messages that failed
// when some did, and any other error when the batch failed as a whole. Publish must honour ctx: the
// worker bounds every call with its publish timeout.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) error
}

// PublisherFunc adapts a function to Publisher.
type PublisherFunc func(ctx context.Context, msgs []Message) error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []Message) error { return f(ctx, msgs) }

// PublishError is how a publisher reports a partly failed batch: Failed maps the ID of each message
// that was not published to its error. Messages of the batch not in Failed count as published and
// are marked done; only the failed ones are retried.
type PublishError struct {
	Failed map[string]error
}

// Error summarises the failures.
func (e *PublishError) Error() string {
	if len(e.Failed) == 0 {
		return "outboxplugin: publish failed"
	}
	ids := make([]string, 0, len(e.Failed))
	for id := range e.Failed {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	const shown = 3
	var b strings.Builder
	fmt.Fprintf(&b, "outboxplugin: %d message(s) failed to publish", len(ids))
	for i, id := range ids {
		if i == shown {
			fmt.Fprintf(&b, "; and %d more", len(ids)-shown)
			break
		}
		fmt.Fprintf(&b, "; %s: %v", id, e.Failed[id])
	}
	return b.String()
}

// FailedMessages returns a *PublishError for the given failures, or nil when there are none: a
// publisher can end with return outboxplugin.FailedMessages(failed).
func FailedMessages(failed map[string]error) error {
	if len(failed) == 0 {
		return nil
	}
	return &PublishError{Failed: failed}
}
