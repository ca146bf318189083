package outboxrabbitmq

import (
	"errors"
	"fmt"

	"github.com/gorm-outbox/outboxplugin"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrNoMessageID is the error of MessageID for a delivery that carries no message id, which no
// outbox publisher sent. Redelivering it cannot give it one: reject it without requeueing (to a
// dead-letter exchange, if the queue has one).
var ErrNoMessageID = errors.New("outboxrabbitmq: delivery has no message id")

// MessageID returns the id of an outbox event delivered by RabbitMQ, the key to give to
// inbox.Handle: the message-id property, which Publisher sets to the event's id, or, on a delivery
// without it, the outbox-id header (outboxplugin.HeaderID), which every outbox publisher sends among
// the event's fields (a message outboxwatermill sent through watermill-amqp has only that one, unless
// its marshaler copies it into the property). Both are the event's id, so the result is the same on
// every delivery of the event, and on every copy the worker published more than once: RabbitMQ does
// not de-duplicate on message-id. A delivery with neither, or with an empty or non-string header,
// returns an error wrapping ErrNoMessageID.
func MessageID(d amqp.Delivery) (string, error) {
	if d.MessageId != "" {
		return d.MessageId, nil
	}
	if id, ok := d.Headers[outboxplugin.HeaderID].(string); ok && id != "" {
		return id, nil
	}
	return "", fmt.Errorf("%w: no message-id property or %s header", ErrNoMessageID, outboxplugin.HeaderID)
}
