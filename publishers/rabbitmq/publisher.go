// Package outboxrabbitmq publishes outbox events to RabbitMQ (AMQP 0-9-1) with publisher confirms.
//
// A Publisher owns one connection and one confirm-mode channel. Publish sends a whole batch without
// waiting, then awaits the broker's confirmations together: a message counts as published once the
// broker has acknowledged it (for a persistent message routed to a durable queue, once the queue has
// it on disk). A message the broker nacks, or returns as unroutable, is reported failed alone, as
// refused; a lost connection fails what was not yet confirmed, as not delivered (wrapping
// outboxplugin.ErrBrokerUnavailable), and the next Publish reconnects.
//
//	pub, err := outboxrabbitmq.Dial("amqp://guest:guest@localhost:5672/")
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	worker, err := outboxplugin.NewWorker(db, pub)
//	if err != nil {
//		return err
//	}
//	go func() {
//		if err := worker.Run(ctx); err != nil {
//			log.Fatal(err)
//		}
//	}()
//
// Options, delivery guarantees and measured throughput:
// https://github.com/gorm-outbox/outboxplugin/blob/main/publishers/rabbitmq/README.md
// How the publishers compare: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/publishers.md.
package outboxrabbitmq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Errors of single messages, found in the Failed map of the *outboxplugin.PublishError that Publish
// returns (wrapped, with the broker's details), ErrChannelClosed, and ErrClosed.
var (
	// ErrNacked: the broker refused the message (basic.nack), for instance because the queue it
	// routes to is at its x-max-length with x-overflow reject-publish, or after an internal error.
	// A refusal: the worker's retry spends an attempt.
	ErrNacked = errors.New("outboxrabbitmq: message nacked by the broker")
	// ErrUnroutable: the message was published mandatory (WithMandatory, the default) and the
	// broker returned it because no queue is bound to receive it. A configuration error (a binding
	// missing): it comes wrapped together with outboxplugin.ErrMisconfigured, naming the exchange,
	// the routing key and the broker, and the worker's retry spends no attempt.
	ErrUnroutable = errors.New("outboxrabbitmq: message returned unroutable")
	// ErrConnectionLost: the connection was lost (or the channel closed with it, or by the client)
	// before the broker confirmed the message. The broker may have taken it all the same: retrying
	// it may publish it twice. It comes wrapped together with outboxplugin.ErrBrokerUnavailable: the
	// worker's retry spends no attempt.
	ErrConnectionLost = errors.New("outboxrabbitmq: connection lost before the broker confirmed the message")
	// ErrChannelClosed: the broker closed the publishing channel with a channel error (a soft
	// error code, kept wrapped as the *amqp.Error): 404 NOT_FOUND for a route to an exchange that
	// does not exist, 403 ACCESS_REFUSED, 406 PRECONDITION_FAILED for a message larger than the
	// broker's max_message_size. One of the messages not yet confirmed caused it, and the broker
	// does not say which, so Publish returns it as the error of the whole batch, not in a
	// PublishError: the worker then splits the batch in halves and publishes them on a new channel,
	// until the message at fault fails alone. The error of a batch of one message is that message's
	// own, a refusal: Publish reports it in a PublishError. 404 NOT_FOUND and 403 ACCESS_REFUSED are
	// configuration errors instead (wrapping outboxplugin.ErrMisconfigured, naming the broker; no
	// attempt spent) when every message of the batch goes to the exchange the broker names: Publish
	// reports them in a PublishError. A batch that mixes other messages is split as above.
	ErrChannelClosed = errors.New("outboxrabbitmq: the broker closed the channel")
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("outboxrabbitmq: publisher closed")
)

// ContentType is the content type of every message: the payload is the event's JSON document.
const ContentType = "application/json"

// handshakeTimeout bounds the TCP connect and the AMQP handshake of a connection attempt when the
// caller's context has no earlier deadline; it is amqp091-go's default.
const handshakeTimeout = 30 * time.Second

// closeTimeout bounds the close handshake of Close.
const closeTimeout = 5 * time.Second

// Publisher publishes outbox messages to RabbitMQ. It is safe for concurrent use: concurrent
// Publish calls share the channel, each awaiting the confirmations of its own messages.
type Publisher struct {
	url  string
	addr string // host:port/vhost of url, without credentials, for errors
	cfg  amqp.Config
	o    options

	// lock guards the fields below and is held while connecting; it is a channel so that a Publish
	// waiting for another's connection attempt can give up when its context ends.
	lock   chan struct{}
	conn   *amqp.Connection
	sess   *session
	closed bool
}

var _ outboxplugin.Publisher = (*Publisher)(nil)

// Dial connects to the broker at url (amqp://user:password@host:port/vhost) with amqp091-go's
// default configuration, declares the topology (by default the exchange DefaultExchange, durable, of
// kind topic), and returns a Publisher ready to publish. See DialConfig.
func Dial(url string, opts ...Option) (*Publisher, error) {
	return DialConfig(url, amqp.Config{}, opts...)
}

// DialConfig is Dial with a connection configuration (TLS, SASL, heartbeat, vhost, client
// properties). cfg.Dial, when set, opens the network connection; the publisher bounds the handshake
// of every later connection attempt by the context of the Publish that makes it. cfg.Recovery must
// be nil: the publisher reconnects by itself, on the first Publish after a lost connection, so that
// a batch never straddles two channels. Zero heartbeat and locale take amqp091-go's defaults (10 s,
// en_US).
func DialConfig(url string, cfg amqp.Config, opts ...Option) (*Publisher, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("outboxrabbitmq: %w: nil option", outboxplugin.ErrInvalidOption)
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if cfg.Recovery != nil {
		return nil, fmt.Errorf("outboxrabbitmq: %w: amqp.Config.Recovery is set; the publisher reconnects by itself", outboxplugin.ErrInvalidOption)
	}
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, fmt.Errorf("outboxrabbitmq: %w: url: %w", outboxplugin.ErrInvalidOption, err)
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Locale == "" {
		cfg.Locale = "en_US"
	}
	if o.route == nil {
		o.route = o.defaultRoute
	}
	if o.topology == nil {
		o.topology = o.declareExchange
	}
	p := &Publisher{url: url, addr: brokerAddr(uri), cfg: cfg, o: o, lock: make(chan struct{}, 1)}
	p.lock <- struct{}{}
	defer p.unlock()
	if err := p.connect(context.Background()); err != nil {
		return nil, p.connectError(err)
	}
	return p, nil
}

// Publish sends msgs and waits for the broker to confirm them. It returns nil when the broker
// acknowledged every message; an *outboxplugin.PublishError naming the messages that were not
// published, each with its reason, when some were not; and an error for the whole batch when ctx
// had ended before the call, when no connection could be made, or with ErrChannelClosed. The
// messages go out in order on one channel, without waiting between them; their confirmations are
// awaited together.
//
// The reason of a message the broker refused — ErrNacked, ErrChannelClosed for a batch of one — is
// a refusal: the worker's retry spends an attempt. A configuration error — ErrUnroutable, a missing
// exchange or a refused access (ErrChannelClosed with 404 or 403), a refused login or topology at
// connection — wraps outboxplugin.ErrMisconfigured and names the broker: no attempt is spent. The reason of a message the
// broker did not get or did not confirm in time — ErrConnectionLost, the end of ctx, a network
// error of the publish — wraps outboxplugin.ErrBrokerUnavailable, and so does the error of a batch
// for which no connection could be made (whatever the cause: nothing was sent): the worker's retry
// spends no attempt, and it backs off while nothing gets through.
//
// Publish honours ctx: when it ends, the messages not yet confirmed are reported failed with its
// error, and the connection is closed, because a write to a broker that applies TCP back-pressure
// cannot be interrupted otherwise; the next Publish reconnects. After a lost channel or connection,
// Publish reconnects first.
func (p *Publisher) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outboxrabbitmq: publish: %w", err)
	}
	conn, s, err := p.session(ctx)
	if err != nil {
		return err
	}
	var ids []string
	if s.mandatory {
		ids = make([]string, len(msgs))
		for i := range msgs {
			ids[i] = msgs[i].ID
		}
		s.register(ids)
	}

	aborted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(aborted)
		_ = conn.CloseDeadline(time.Now())
	})
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	var sendErr error
	for i := range msgs {
		exchange, key := p.o.route(msgs[i])
		dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, s.mandatory, false, publishing(msgs[i]))
		if err != nil {
			sendErr = err
			break
		}
		confirms = append(confirms, dc)
	}
	awaitConfirms(ctx, confirms)
	if !stop() {
		<-aborted // the connection is closed before Publish returns: the next one reconnects
	}

	var returned map[string]error
	if s.mandatory {
		s.sync()
		returned = s.unregister(ids)
	}
	failed := map[string]error{}
	var unsent error
	if sendErr != nil {
		unsent = p.sendError(ctx, sendErr, s)
	}
	var lost error // why the channel closed; looked up once, for the first nack
	for i, m := range msgs {
		if i >= len(confirms) {
			failed[m.ID] = unsent
			continue
		}
		dc := confirms[i]
		select {
		case <-dc.Done():
		default:
			failed[m.ID] = fmt.Errorf("outboxrabbitmq: not confirmed: %w: %w", outboxplugin.ErrBrokerUnavailable, ctx.Err())
			continue
		}
		switch {
		case !dc.Acked():
			if lost == nil {
				lost = p.nackError(ctx, s)
			}
			failed[m.ID] = lost
		case returned[m.ID] != nil:
			failed[m.ID] = returned[m.ID]
		}
	}
	if len(msgs) > 1 {
		for _, err := range failed {
			if !errors.Is(err, ErrChannelClosed) {
				continue
			}
			if errors.Is(err, outboxplugin.ErrMisconfigured) && p.allRoutedTo(msgs, err) {
				break // every message goes where the broker says it cannot: a configuration error of each
			}
			// Some message of the batch made the broker close the channel, and which one it does
			// not say: fail the batch as a whole, for the worker to split.
			var reason *amqp.Error
			errors.As(err, &reason)
			return fmt.Errorf("outboxrabbitmq: publish %d messages: %w (broker %s): %w", len(msgs), ErrChannelClosed, p.addr, reason)
		}
	}
	for id, err := range failed {
		if errors.Is(err, ErrUnroutable) {
			failed[id] = fmt.Errorf("%w (broker %s)", err, p.addr)
		}
	}
	return outboxplugin.FailedMessages(failed)
}

// awaitConfirms returns once every confirmation has arrived or ctx has ended.
func awaitConfirms(ctx context.Context, confirms []*amqp.DeferredConfirmation) {
	for _, dc := range confirms {
		select {
		case <-dc.Done():
		case <-ctx.Done():
			return
		}
	}
}

// nackError is the error of a message whose confirmation was negative: a real basic.nack, unless
// the channel closed (the library fails every pending confirmation then) or ctx ended (Publish
// closed the connection).
func (p *Publisher) nackError(ctx context.Context, s *session) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outboxrabbitmq: not confirmed: %w: %w", outboxplugin.ErrBrokerUnavailable, err)
	}
	if closed, reason := s.closed(); closed {
		return p.closedError(reason)
	}
	return ErrNacked
}

// sendError is the error of the messages Publish could not send.
func (p *Publisher) sendError(ctx context.Context, err error, s *session) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("outboxrabbitmq: not sent: %w: %w", outboxplugin.ErrBrokerUnavailable, ctx.Err())
	case errors.Is(err, amqp.ErrClosed):
		_, reason := s.closed()
		return p.closedError(reason)
	case isNetworkError(err):
		return fmt.Errorf("outboxrabbitmq: publish: %w: %w", outboxplugin.ErrBrokerUnavailable, err)
	}
	return fmt.Errorf("outboxrabbitmq: publish: %w", err)
}

// closedError is the error of the messages a closed channel did not confirm, given why it closed.
// The broker closes a channel with a soft error code (amqp.Error.Recover) for a command sent on it
// — a message of this publisher's — that it refuses: ErrChannelClosed. Every other reason is the
// connection's: the library's, for a network error or a missed heartbeat; the broker's hard error,
// closing the connection (320 CONNECTION_FORCED at shutdown, ...); none, for a close the client
// asked for (Close, or Publish at the end of its ctx).
//
// Of the channel errors, 404 NOT_FOUND (an exchange that does not exist) and 403 ACCESS_REFUSED (no
// permission on it) are configuration errors: they wrap outboxplugin.ErrMisconfigured too, and name
// the broker.
func (p *Publisher) closedError(reason *amqp.Error) error {
	switch {
	case reason == nil:
		return fmt.Errorf("%w: %w", ErrConnectionLost, outboxplugin.ErrBrokerUnavailable)
	case reason.Server && reason.Recover && (reason.Code == amqp.NotFound || reason.Code == amqp.AccessRefused):
		return fmt.Errorf("%w: %w (broker %s): %w", ErrChannelClosed, outboxplugin.ErrMisconfigured, p.addr, reason)
	case reason.Server && reason.Recover:
		return fmt.Errorf("%w: %w", ErrChannelClosed, reason)
	}
	return fmt.Errorf("%w: %w: %w", ErrConnectionLost, outboxplugin.ErrBrokerUnavailable, reason)
}

// isNetworkError reports whether err is the connection's: a network error, or a connection that
// ended.
func isNetworkError(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// publishing maps m to an AMQP message: the payload as the body, the message ID, event type and
// creation time as the message-id, type and timestamp properties, m.HeaderList() as the headers.
func publishing(m outboxplugin.Message) amqp.Publishing {
	list := m.HeaderList()
	headers := make(amqp.Table, len(list))
	for _, h := range list {
		headers[h.Key] = h.Value
	}
	return amqp.Publishing{
		Headers:      headers,
		ContentType:  ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Timestamp:    m.CreatedAt,
		Type:         m.EventType,
		Body:         m.Payload,
	}
}

// session returns the open connection and channel, connecting or opening a channel first when the
// previous one was lost.
func (p *Publisher) session(ctx context.Context) (*amqp.Connection, *session, error) {
	select {
	case p.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("outboxrabbitmq: waiting for a connection: %w: %w", outboxplugin.ErrBrokerUnavailable, ctx.Err())
	}
	defer p.unlock()
	if p.closed {
		return nil, nil, ErrClosed
	}
	if p.sess != nil && !p.sess.ch.IsClosed() {
		return p.conn, p.sess, nil
	}
	if err := p.connect(ctx); err != nil {
		// Nothing was sent: whatever kept the connection from being made (the broker down, a
		// refused login or declaration), the broker did not get the batch, and splitting it
		// would not help.
		return nil, nil, p.connectError(err)
	}
	return p.conn, p.sess, nil
}

func (p *Publisher) unlock() { <-p.lock }

// connect opens what is missing of a connection (dialled afresh when it was lost, its topology
// declared) and a confirm-mode channel on it, within ctx. The caller holds the lock.
func (p *Publisher) connect(ctx context.Context) error {
	if p.conn == nil || p.conn.IsClosed() {
		p.conn = nil
		conn, err := p.dial(ctx)
		if err != nil {
			return err
		}
		p.conn = conn
	}
	conn := p.conn
	// Channel and declaration calls wait for the broker's answer without a context: closing the
	// connection when ctx ends is what interrupts them.
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now()) })
	err := p.declare(conn)
	var s *session
	if err == nil {
		s, err = openSession(conn, p.o.mandatory)
	}
	if !stop() {
		err = fmt.Errorf("outboxrabbitmq: connect: %w", ctx.Err())
	}
	if err != nil {
		_ = conn.CloseDeadline(time.Now())
		p.conn = nil
		return err
	}
	p.sess = s
	return nil
}

// dial opens a connection, its TCP connect and handshake bounded by ctx.
func (p *Publisher) dial(ctx context.Context) (*amqp.Connection, error) {
	cfg := p.cfg
	netDial := cfg.Dial
	if netDial == nil {
		netDial = amqp.DefaultDial(handshakeTimeout)
	}
	var stop func() bool
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c, err := netDial(network, addr)
		if err != nil {
			return nil, err
		}
		// The library clears the deadline once the handshake is done.
		if d, ok := ctx.Deadline(); ok && time.Until(d) < handshakeTimeout {
			if err := c.SetDeadline(d); err != nil {
				c.Close()
				return nil, err
			}
		}
		stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
		return c, nil
	}
	conn, err := amqp.DialConfig(p.url, cfg)
	if stop != nil && !stop() {
		// ctx ended during the handshake; a connection that made it is not to be trusted: its
		// deadline may have been set after the library cleared it.
		if conn != nil {
			_ = conn.CloseDeadline(time.Now())
		}
		return nil, fmt.Errorf("outboxrabbitmq: connect: %w", ctx.Err())
	}
	if err != nil {
		return nil, fmt.Errorf("outboxrabbitmq: connect: %w", err)
	}
	return conn, nil
}

// declare runs the topology function on a channel of its own: a failed declaration closes the
// channel it ran on.
func (p *Publisher) declare(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("outboxrabbitmq: open channel: %w", err)
	}
	if err := p.o.topology(ch); err != nil {
		_ = ch.Close()
		return fmt.Errorf("outboxrabbitmq: declare topology: %w", err)
	}
	if err := ch.Close(); err != nil {
		return fmt.Errorf("outboxrabbitmq: declare topology: close channel: %w", err)
	}
	return nil
}

// Close closes the connection: a Publish in progress fails its unconfirmed messages with
// ErrConnectionLost, and later calls return ErrClosed. Close returns once the publisher's goroutine
// has ended; calling it again does nothing.
func (p *Publisher) Close() error {
	p.lock <- struct{}{}
	defer p.unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var err error
	if p.conn != nil && !p.conn.IsClosed() {
		if cerr := p.conn.CloseDeadline(time.Now().Add(closeTimeout)); cerr != nil && !errors.Is(cerr, amqp.ErrClosed) {
			err = fmt.Errorf("outboxrabbitmq: close: %w", cerr)
		}
	}
	if p.sess != nil {
		<-p.sess.done
	}
	p.conn, p.sess = nil, nil
	return err
}
