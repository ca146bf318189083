package outboxrabbitmq

import (
	"fmt"

	"github.com/gorm-outbox/outboxplugin"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultExchange is the exchange the default route publishes to, and the one the default topology
// declares (durable, of kind topic): the same default as every AMQP publisher of the project.
const DefaultExchange = "outbox"

// Option configures a Publisher. An invalid option makes Dial fail with an error wrapping
// outboxplugin.ErrInvalidOption.
type Option func(*options) error

type options struct {
	exchange  string
	route     func(outboxplugin.Message) (exchange, routingKey string)
	topology  func(*amqp.Channel) error
	mandatory bool
}

func defaultOptions() options {
	return options{exchange: DefaultExchange, mandatory: true}
}

// defaultRoute publishes to o.exchange with the routing key <aggregate>.<event>, both tokens made
// safe for a topic exchange by outboxplugin.RouteTokens (so that a binding such as "Order.*" or
// "#.User_create" works and no token adds a level).
func (o *options) defaultRoute(m outboxplugin.Message) (string, string) {
	aggregate, event := outboxplugin.RouteTokens(m)
	return o.exchange, aggregate + "." + event
}

// declareExchange is the default topology: o.exchange as a durable, non-auto-deleted topic exchange.
// Declaring it again on every connection is idempotent; a declaration that conflicts with an existing
// exchange of another kind fails with PRECONDITION_FAILED, which Dial reports.
func (o *options) declareExchange(ch *amqp.Channel) error {
	return ch.ExchangeDeclare(o.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
}

// WithExchange sets the exchange of the default route (default DefaultExchange). Unless WithTopology
// replaces it, the publisher also declares this exchange, durable and of kind topic, on every
// connection. With WithRoute, it names only the exchange the default topology declares.
func WithExchange(name string) Option {
	return func(o *options) error {
		if name == "" {
			return fmt.Errorf("outboxrabbitmq: %w: empty exchange name (the AMQP default exchange does not route by topic)", outboxplugin.ErrInvalidOption)
		}
		o.exchange = name
		return nil
	}
}

// WithRoute sets where each message goes: the exchange and the routing key it is published with.
// The default is the exchange of WithExchange (DefaultExchange) and the routing key
// <aggregate>.<event> (outboxplugin.RouteTokens). route is called once per message, from Publish, and
// must be safe for concurrent use. Publishing to an exchange that does not exist makes the broker
// close the channel: the messages routed to it fail with ErrChannelClosed, a configuration error
// (no attempt spent; the worker reports it until the exchange exists), and the next Publish opens a
// new channel; declare the exchanges route uses with WithTopology.
func WithRoute(route func(outboxplugin.Message) (exchange, routingKey string)) Option {
	return func(o *options) error {
		if route == nil {
			return fmt.Errorf("outboxrabbitmq: %w: nil route", outboxplugin.ErrInvalidOption)
		}
		o.route = route
		return nil
	}
}

// WithTopology replaces the default topology (the declaration of the WithExchange exchange) with
// declare, which runs on a channel of its own each time the publisher opens its publishing channel —
// in Dial, and after every lost connection or channel — before any message is published on it. Use it to declare the exchanges, queues
// and bindings your routes need; an error from declare fails the connection attempt. To declare
// nothing, pass a function that returns nil.
func WithTopology(declare func(*amqp.Channel) error) Option {
	return func(o *options) error {
		if declare == nil {
			return fmt.Errorf("outboxrabbitmq: %w: nil topology function", outboxplugin.ErrInvalidOption)
		}
		o.topology = declare
		return nil
	}
}

// WithMandatory sets whether messages are published with the mandatory flag (default true). With it,
// a message that no queue receives — no binding matches its routing key — is returned by the broker
// and reported failed (ErrUnroutable, a configuration error: no attempt is spent), so the worker
// keeps it pending, reports the missing binding at error and in Worker.Health, and publishes it once
// a queue is bound: nothing is dropped silently. Turn it off when unrouted
// events are meant to be discarded (a topic exchange of which consumers bind only a part), or when an
// alternate exchange of the target exchange catches them.
func WithMandatory(mandatory bool) Option {
	return func(o *options) error {
		o.mandatory = mandatory
		return nil
	}
}
