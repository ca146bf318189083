package outboxwatermill

import (
	"fmt"

	"github.com/gorm-outbox/outboxplugin"
)

// Option configures a Publisher.
type Option func(*config) error

type config struct {
	topic       func(outboxplugin.Message) string
	concurrency int
	unavailable func(error) bool // WithUnavailable; nil: the defaults only
}

// DefaultConcurrency is how many Watermill Publish calls a Publisher runs at once by default.
const DefaultConcurrency = 16

// maxConcurrency bounds WithConcurrency: a batch has at most 10 000 messages (the worker's largest
// batch size), so more calls than that can never run at once.
const maxConcurrency = 10000

// DefaultTopic is the topic a message goes to unless WithTopic says otherwise: outbox.<aggregate>,
// the aggregate type sanitised by outboxplugin.RouteTokens ("outbox._" for an event without one).
// It matches the Kafka publisher's default topic, so that one aggregate's events share a topic
// whatever carries them.
func DefaultTopic(m outboxplugin.Message) string {
	aggregate, _ := outboxplugin.RouteTokens(m)
	return "outbox." + aggregate
}

// WithTopic sets the function that picks each message's Watermill topic (default DefaultTopic).
// Messages of one topic are published together, in the order of the batch; a message for which it
// returns "" is not published and fails with ErrEmptyTopic.
func WithTopic(topic func(outboxplugin.Message) string) Option {
	return func(c *config) error {
		if topic == nil {
			return fmt.Errorf("outboxwatermill: %w: nil topic function", outboxplugin.ErrInvalidOption)
		}
		c.topic = topic
		return nil
	}
}

// WithConcurrency sets how many Watermill Publish calls — one per topic of a batch — run at once,
// over all the Publish calls of the Publisher (default 16, at most 10 000). A call that outlives its
// context keeps its slot until it returns, so a Watermill publisher that hangs cannot pile up calls
// beyond this bound.
func WithConcurrency(n int) Option {
	return func(c *config) error {
		if n < 1 || n > maxConcurrency {
			return fmt.Errorf("outboxwatermill: %w: concurrency %d not in 1..%d", outboxplugin.ErrInvalidOption, n, maxConcurrency)
		}
		c.concurrency = n
		return nil
	}
}

// WithUnavailable tells the Publisher which errors of the Watermill publisher mean that the broker
// did not get a group's messages — a lost connection, no server, a timeout — rather than refused
// them. The Publisher cannot tell by itself for every backend: by default it takes for such only
// the end of the publish context, network errors of the standard library (net.Error, net.ErrClosed,
// io.EOF) and errors that wrap outboxplugin.ErrBrokerUnavailable, and any other error for a
// refusal, which spends an attempt of each message of the group (and kills them after the last).
// fn is called with each other error a Watermill Publish call returns, possibly from several
// goroutines at once; when it returns true, the group's messages fail with the error wrapped with
// outboxplugin.ErrBrokerUnavailable, and the worker retries them without spending an attempt.
//
// For watermill-amqp, whose "not connected to AMQP" error has no type of its own, and whose
// errors of a lost connection are amqp091-go's *amqp.Error raised by the library rather than the
// broker:
//
//	outboxwatermill.WithUnavailable(func(err error) bool {
//		var aerr *amqp.Error
//		return !amqpPub.IsConnected() || errors.As(err, &aerr) && !aerr.Server
//	})
func WithUnavailable(fn func(error) bool) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("outboxwatermill: %w: nil unavailable function", outboxplugin.ErrInvalidOption)
		}
		c.unavailable = fn
		return nil
	}
}
