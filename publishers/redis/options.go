package outboxredis

import (
	"fmt"

	"github.com/gorm-outbox/outboxplugin"
)

// Option configures a Publisher. An option given an invalid value makes New return an error wrapping
// outboxplugin.ErrInvalidOption.
type Option func(*config) error

type config struct {
	stream     func(outboxplugin.Message) string
	maxLen     int64
	noMkStream bool
	// checkStreams are the keys Check looks at (WithCheckStreams).
	checkStreams []string
}

// DefaultStream is the stream a message goes to unless WithStream says otherwise:
// outbox:<aggregate>, the aggregate type sanitised by outboxplugin.RouteTokens ("_" for an event
// without one), so outbox:User for the events of a User model.
func DefaultStream(m outboxplugin.Message) string {
	aggregate, _ := outboxplugin.RouteTokens(m)
	return "outbox:" + aggregate
}

// WithStream sets the function that names the stream each message is appended to (default
// DefaultStream). It is called once per message; a message for which it returns "" fails alone, with
// ErrNoStreamName, and is retried. On Redis Cluster, streams that should be written in one round trip
// per node can share a hash tag ({outbox}:User).
func WithStream(fn func(outboxplugin.Message) string) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("outboxredis: %w: nil stream function", outboxplugin.ErrInvalidOption)
		}
		c.stream = fn
		return nil
	}
}

// WithMaxLen caps every stream the publisher writes at about n entries: each XADD carries
// MAXLEN ~ n, so Redis drops the oldest entries, a whole macro node at a time, once a stream has
// more (it may keep somewhat more than n). n must be positive. Without it, streams grow until
// trimmed by someone else (XTRIM, or the consumers). Entries trimmed before a consumer read them are
// lost to that consumer: size n for the longest consumer outage you want to survive.
func WithMaxLen(n int64) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("outboxredis: %w: max length %d, want > 0", outboxplugin.ErrInvalidOption, n)
		}
		c.maxLen = n
		return nil
	}
}

// WithNoMkStream appends only to streams that already exist (XADD NOMKSTREAM, Redis 6.2 or later):
// a message whose stream does not exist fails alone, with ErrNoStream, and is retried until the
// stream is created (or the event is dead). Use it when streams are provisioned with their consumer groups beforehand, so that
// a mistyped or unexpected stream name is an error rather than a stream no one reads.
func WithNoMkStream() Option {
	return func(c *config) error {
		c.noMkStream = true
		return nil
	}
}
