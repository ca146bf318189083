package outboxnats

import (
	"errors"
	"fmt"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoMessageID is the error of MessageID for a message that carries no message id, which no outbox
// publisher sent. Redelivering it cannot give it one: terminate it (msg.Term) or set it aside.
var ErrNoMessageID = errors.New("outboxnats: message has no message id")

// MessageID returns the id of an outbox event received from JetStream, the key to give to
// inbox.Handle: the Nats-Msg-Id header, which Publisher sets to the event's id and on which the
// stream drops a copy published again within its duplicate window, or, on a message without it, the
// outbox-id header (outboxplugin.HeaderID), which every outbox publisher sends among the event's
// fields (a message outboxwatermill sent over a NATS backend may have only that one). Both are the
// event's id, so the result is the same on every delivery of the event, and on a copy that the stream
// stored again because it came after the window. A message with neither header, or only empty ones,
// returns an error wrapping ErrNoMessageID.
func MessageID(msg jetstream.Msg) (string, error) {
	if msg == nil {
		return "", fmt.Errorf("%w: nil message", ErrNoMessageID)
	}
	return HeaderMessageID(msg.Headers())
}

// HeaderMessageID is MessageID for the headers of a message: those of a *nats.Msg (msg.Header), as
// the nats.JetStreamContext API and core subscriptions deliver messages.
func HeaderMessageID(h nats.Header) (string, error) {
	if id := h.Get(jetstream.MsgIDHeader); id != "" {
		return id, nil
	}
	if id := h.Get(outboxplugin.HeaderID); id != "" {
		return id, nil
	}
	return "", fmt.Errorf("%w: no %s or %s header", ErrNoMessageID, jetstream.MsgIDHeader, outboxplugin.HeaderID)
}
