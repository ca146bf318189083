package outboxrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"

	"github.com/gorm-outbox/outboxplugin"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Configuration errors: what the broker refuses because of how it or the publisher is configured,
// not because of a message. They wrap outboxplugin.ErrMisconfigured — the worker spends no attempt on
// them, backs off, and reports them at error and in Worker.Health — and name the broker (host, port
// and vhost, never the credentials):
//
//   - a login the broker refuses (ACCESS_REFUSED at the handshake, amqp.ErrCredentials), a vhost the
//     user may not open (amqp.ErrVhost), no shared SASL mechanism (amqp.ErrSASL), and a declaration of
//     the topology the broker refuses (403 ACCESS_REFUSED, 404 NOT_FOUND, 406 PRECONDITION_FAILED
//     for an exchange declared again with another kind): the connection attempt fails with it;
//   - a publish to an exchange that does not exist (the broker closes the channel with 404
//     NOT_FOUND) or that the user may not write to (403 ACCESS_REFUSED): ErrChannelClosed, wrapping
//     ErrMisconfigured too;
//   - a mandatory message no queue is bound to receive (ErrUnroutable): the exchange routes nowhere.

// brokerAddr is how errors name the broker of uri: host:port/vhost.
func brokerAddr(uri amqp.URI) string {
	return net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)) + "/" + uri.Vhost
}

// connectError is the error of a connection attempt that failed: a configuration error, or else the
// broker unavailable.
func (p *Publisher) connectError(err error) error {
	var aerr *amqp.Error
	switch {
	case errors.Is(err, outboxplugin.ErrMisconfigured), errors.Is(err, outboxplugin.ErrBrokerUnavailable):
		return err
	case errors.Is(err, amqp.ErrCredentials):
		return fmt.Errorf("%w: %w: the broker refused the credentials (broker %s)", err, outboxplugin.ErrMisconfigured, p.addr)
	case errors.Is(err, amqp.ErrVhost), errors.Is(err, amqp.ErrSASL):
		return fmt.Errorf("%w: %w (broker %s)", err, outboxplugin.ErrMisconfigured, p.addr)
	case errors.As(err, &aerr) && aerr.Server &&
		(aerr.Code == amqp.AccessRefused || aerr.Code == amqp.NotFound || aerr.Code == amqp.PreconditionFailed || aerr.Code == amqp.NotAllowed):
		return fmt.Errorf("%w: %w (broker %s)", err, outboxplugin.ErrMisconfigured, p.addr)
	}
	return fmt.Errorf("%w: %w (broker %s)", err, outboxplugin.ErrBrokerUnavailable, p.addr)
}

// exchangeInReason finds the exchange a channel error names: "NOT_FOUND - no exchange 'x' in vhost
// '/'", "ACCESS_REFUSED - access to exchange 'x' in vhost '/' refused for user 'u'".
var exchangeInReason = regexp.MustCompile(`exchange '((?:[^']|'')*)' in vhost`)

// allRoutedTo reports whether every message of msgs is routed to the exchange that the channel error
// err names (or err names none): then each is at fault. Otherwise the batch mixes messages at fault
// with others, which the broker may or may not have taken before it closed the channel: Publish
// fails the batch as a whole, without ErrMisconfigured, for the worker to split it until the
// messages at fault stand alone — a configuration error each — and the others are published.
func (p *Publisher) allRoutedTo(msgs []outboxplugin.Message, err error) bool {
	var aerr *amqp.Error
	if !errors.As(err, &aerr) {
		return true
	}
	m := exchangeInReason.FindStringSubmatch(aerr.Reason)
	if m == nil {
		return true
	}
	for _, msg := range msgs {
		if exchange, _ := p.o.route(msg); exchange != m[1] {
			return false
		}
	}
	return true
}

var _ outboxplugin.CheckingPublisher = (*Publisher)(nil)

// Check tells whether the broker takes the publisher's messages before it is given any
// (outboxplugin.CheckingPublisher: the worker calls it when Run starts): it connects when not
// connected (a refused login or topology is a configuration error) and declares the exchange of
// WithExchange passively — a 404 NOT_FOUND says it does not exist, which happens when WithTopology
// declares something else. With WithRoute, the exchanges the route picks are not known in advance:
// a missing one fails at publish, as a configuration error too. Errors name the exchange and the
// broker, and wrap outboxplugin.ErrMisconfigured or outboxplugin.ErrBrokerUnavailable.
func (p *Publisher) Check(ctx context.Context) error {
	conn, _, err := p.session(ctx)
	if err != nil {
		return fmt.Errorf("outboxrabbitmq: check: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("outboxrabbitmq: check: open channel: %w: %w (broker %s)", outboxplugin.ErrBrokerUnavailable, err, p.addr)
	}
	err = ch.ExchangeDeclarePassive(p.o.exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	if err == nil {
		_ = ch.Close()
		return nil
	}
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Server && aerr.Recover {
		return fmt.Errorf("outboxrabbitmq: check: exchange %q: %w (broker %s): %w", p.o.exchange, outboxplugin.ErrMisconfigured, p.addr, err)
	}
	return fmt.Errorf("outboxrabbitmq: check: exchange %q: %w (broker %s): %w", p.o.exchange, outboxplugin.ErrBrokerUnavailable, p.addr, err)
}
