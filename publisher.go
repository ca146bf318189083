package outboxplugin

import (
	"context"
	"fmt"
	"sort"
	"strconv"
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

// Publisher sends a batch of messages to a broker. It returns:
//
//   - nil when every message was accepted (acknowledged by the broker): they are marked done;
//   - a *PublishError (possibly wrapped) naming the messages the broker refused: those are retried
//     after their backoff, spending an attempt each (dead after the last), and the others are done.
//     Ids in it that are not in the batch are ignored (and logged); a PublishError that names no
//     message of the batch — an empty one included — is a failure of the whole batch;
//   - any other error when the batch failed as a whole: connection refused or lost, a timeout, the
//     broker unavailable. That says nothing about the messages, so it spends no attempt: the worker
//     splits the batch in halves and publishes them, to find a message that makes the whole batch fail
//     — once the broker took any message of the batch, a message that still fails alone counts as
//     refused — and if the broker takes none, the events go back to pending, attempts untouched, and
//     Run backs off. An outage of any length kills no event. An error that wraps ErrMisconfigured — a
//     destination that does not exist, credentials the broker refuses — is handled the same way (not
//     split, no attempt spent) and reported apart: logged at error, and by Worker.Health.
//
// Publish must honour ctx: the worker bounds each batch with its publish timeout, and a call cut short
// by it counts as a failure that names no message.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) error
}

// PublisherFunc adapts a function to Publisher.
type PublisherFunc func(ctx context.Context, msgs []Message) error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []Message) error { return f(ctx, msgs) }

// PublishError is how a publisher reports messages the broker refused: Failed maps the ID of each
// message that was not published to its error. Messages of the batch not in Failed count as published
// and are marked done; only the failed ones are retried. Naming no message of the batch makes it a
// failure of the whole batch (see Publisher).
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

// Header names under which the publishers in publishers/ send a message's fields beside its payload,
// wherever the broker has headers (Kafka, JetStream, AMQP) or fields (Redis Streams). They are the same
// for every broker, so that a consumer reads them the same way whatever carried the message.
const (
	HeaderID            = "outbox-id"             // Message.ID
	HeaderEventType     = "outbox-event-type"     // Message.EventType
	HeaderKey           = "outbox-key"            // Message.Key (absent when empty)
	HeaderAggregateType = "outbox-aggregate-type" // Message.AggregateType (absent when empty)
	HeaderAggregateID   = "outbox-aggregate-id"   // Message.AggregateID (absent when empty)
	HeaderCreatedAt     = "outbox-created-at"     // Message.CreatedAt, RFC 3339 with nanoseconds, UTC
	HeaderAttempt       = "outbox-attempt"        // Message.Attempt, in decimal
)

// Header is one name and value of Message.HeaderList.
type Header struct {
	Key, Value string
}

// HeaderList returns the headers a publisher sends with m: the event's own Headers, sorted by name,
// then the outbox's fields under the Header* names (a Headers entry with one of those names is left
// out, so that the outbox's value is the only one). It allocates one slice.
func (m Message) HeaderList() []Header {
	out := make([]Header, 0, len(m.Headers)+7)
	for k, v := range m.Headers {
		if !isOutboxHeader(k) {
			out = append(out, Header{k, v})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	out = append(out, Header{HeaderID, m.ID}, Header{HeaderEventType, m.EventType})
	if m.Key != "" {
		out = append(out, Header{HeaderKey, m.Key})
	}
	if m.AggregateType != "" {
		out = append(out, Header{HeaderAggregateType, m.AggregateType})
	}
	if m.AggregateID != "" {
		out = append(out, Header{HeaderAggregateID, m.AggregateID})
	}
	return append(out,
		Header{HeaderCreatedAt, m.CreatedAt.UTC().Format(time.RFC3339Nano)},
		Header{HeaderAttempt, strconv.Itoa(m.Attempt)})
}

func isOutboxHeader(k string) bool {
	switch k {
	case HeaderID, HeaderEventType, HeaderKey, HeaderAggregateType, HeaderAggregateID, HeaderCreatedAt, HeaderAttempt:
		return true
	}
	return false
}

// RouteTokens returns the aggregate type and the event type of m as name tokens for the default
// destinations of the publishers in publishers/ (Kafka topic outbox.<aggregate>, NATS subject
// outbox.<aggregate>.<event>, AMQP routing key <aggregate>.<event>, Redis stream outbox:<aggregate>):
// every byte other than an ASCII letter, digit, '_' or '-' becomes '_', so that a token is valid in
// every broker's names and never adds a level to a dotted subject; an empty aggregate type (an event
// emitted without WithAggregate) becomes "_".
func RouteTokens(m Message) (aggregate, event string) {
	return routeToken(m.AggregateType), routeToken(m.EventType)
}

func routeToken(s string) string {
	if s == "" {
		return "_"
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if !isRouteByte(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if !isRouteByte(c) {
			b[i] = '_'
		}
	}
	return string(b)
}

func isRouteByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}
