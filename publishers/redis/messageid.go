package outboxredis

import (
	"errors"
	"fmt"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/redis/go-redis/v9"
)

// ErrNoMessageID is the error of MessageID for a stream entry that carries no message id, which no
// outbox publisher appended. Reading it again cannot give it one: acknowledge it (XACK) and set it
// aside.
var ErrNoMessageID = errors.New("outboxredis: stream entry has no message id")

// MessageID returns the id of an outbox event read from a stream (XREAD, XREADGROUP, XCLAIM,
// XAUTOCLAIM, XRANGE), the key to give to inbox.Handle: the entry's outbox-id field
// (outboxplugin.HeaderID), which Publisher sets to the event's id. The entry ID is no substitute: Redis
// generates it on every XADD, so the same event appended twice (Redis has no de-duplication) is two
// entries with two entry IDs and one outbox-id. An entry without the field, or with an empty or
// non-string one, returns an error wrapping ErrNoMessageID.
func MessageID(m redis.XMessage) (string, error) {
	if id, ok := m.Values[outboxplugin.HeaderID].(string); ok && id != "" {
		return id, nil
	}
	return "", fmt.Errorf("%w: entry %s has no %s field", ErrNoMessageID, m.ID, outboxplugin.HeaderID)
}
