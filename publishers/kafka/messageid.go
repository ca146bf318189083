package outboxkafka

import (
	"errors"
	"fmt"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrNoMessageID is the error of MessageID for a record that carries no message id, which no outbox
// publisher produced. Reading it again cannot give it one: skip it (commit past it) or set it aside.
var ErrNoMessageID = errors.New("outboxkafka: record has no message id")

// MessageID returns the id of an outbox event consumed from Kafka, the key to give to inbox.Handle:
// the value of the record's outbox-id header (outboxplugin.HeaderID), which Publisher sets to the
// event's id. Kafka records have no id of their own, and an offset names a copy, not the event: the
// same event published twice (a retry of the worker, which the idempotent producer does not cover)
// is two records at two offsets with the same header. A record without the header, or with an empty
// one, returns an error wrapping ErrNoMessageID.
func MessageID(r *kgo.Record) (string, error) {
	if r == nil {
		return "", fmt.Errorf("%w: nil record", ErrNoMessageID)
	}
	for _, h := range r.Headers {
		if h.Key == outboxplugin.HeaderID && len(h.Value) > 0 {
			return string(h.Value), nil
		}
	}
	return "", fmt.Errorf("%w: no %s header", ErrNoMessageID, outboxplugin.HeaderID)
}
