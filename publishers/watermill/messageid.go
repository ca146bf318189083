package outboxwatermill

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/gorm-outbox/outboxplugin"
)

// ErrNoMessageID is the error of MessageID for a message that carries no message id, which no outbox
// publisher sent. Redelivering it cannot give it one: acknowledge it and set it aside (a poison queue).
var ErrNoMessageID = errors.New("outboxwatermill: message has no message id")

// MessageID returns the id of an outbox event received from a Watermill subscriber, the key to give
// to inbox.Handle: the message's UUID, which Publisher sets to the event's id and Watermill's
// backends carry to the subscriber (watermill-amqp in its _watermill_message_uuid header), or, on a
// message whose UUID is empty, the outbox-id metadata (outboxplugin.HeaderID), which every outbox
// publisher sends among the event's fields: a message that outboxrabbitmq published, read through
// watermill-amqp, has no UUID header, and watermill-amqp leaves its UUID empty. Both are the event's
// id, so the result is the same on every delivery of the event, and on every copy the worker published
// more than once. A message with neither returns an error wrapping ErrNoMessageID.
//
// Watermill's middleware.Deduplicator is no substitute for inbox.Handle with this id: by default it
// keeps its keys in memory for a minute, hashes the payload rather than reading the UUID, and records
// a message before its handler runs, so that the redelivery of a message whose handler failed is
// dropped. inbox.Handle records the id in the handler's own transaction.
func MessageID(m *message.Message) (string, error) {
	if m == nil {
		return "", fmt.Errorf("%w: nil message", ErrNoMessageID)
	}
	if m.UUID != "" {
		return m.UUID, nil
	}
	if id := m.Metadata.Get(outboxplugin.HeaderID); id != "" {
		return id, nil
	}
	return "", fmt.Errorf("%w: empty UUID and no %s metadata", ErrNoMessageID, outboxplugin.HeaderID)
}
