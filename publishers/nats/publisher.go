// Package outboxnats publishes outbox events to NATS JetStream.
//
// Each event becomes one JetStream message: the payload is the body, the event's headers and the
// outbox's fields (outboxplugin.Message.HeaderList) are NATS headers, and the message id is also sent
// as Nats-Msg-Id, so that a stream drops an event published twice within its duplicate window. A
// batch is published asynchronously and its acknowledgements are awaited together; the messages
// the stream did not store are reported one by one, so that the worker retries only those.
//
//	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
//	js, err := jetstream.New(nc)
//	pub, err := outboxnats.New(js)
//	worker, err := outboxplugin.NewWorker(db, pub)
//	go func() {
//		if err := worker.Run(ctx); err != nil {
//			log.Fatal(err)
//		}
//	}()
//
// Options, delivery guarantees and measured throughput:
// https://github.com/gorm-outbox/outboxplugin/blob/main/publishers/nats/README.md
// How the publishers compare: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/publishers.md.
package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var _ outboxplugin.Publisher = (*Publisher)(nil)

// ErrInvalidSubject is the error of a message whose subject (from WithSubject) cannot be published
// to: empty, with an empty token, a wildcard token or white space. Only that message fails.
var ErrInvalidSubject = errors.New("invalid subject")

// Publisher publishes outbox messages to JetStream. It is safe for concurrent use by several
// workers. It does not own the connection: the caller closes it after the workers have stopped.
type Publisher struct {
	js             jetstream.JetStream
	subject        func(outboxplugin.Message) string
	expectedStream string
	checkSubjects  []string // nil: the default of WithCheckSubjects
}

// Option configures a Publisher.
type Option func(*Publisher) error

// WithSubject sets the subject of each message (default DefaultSubject). The function must be safe
// for concurrent use; a subject it returns that is invalid fails that message with ErrInvalidSubject.
func WithSubject(fn func(outboxplugin.Message) string) Option {
	return func(p *Publisher) error {
		if fn == nil {
			return fmt.Errorf("%w: WithSubject(nil)", outboxplugin.ErrInvalidOption)
		}
		p.subject = fn
		return nil
	}
}

// WithExpectedStream makes the server store each message only in the named stream: a message whose
// subject another stream captures, or no stream, is refused and fails (Nats-Expected-Stream).
func WithExpectedStream(name string) Option {
	return func(p *Publisher) error {
		if name == "" || strings.ContainsAny(name, " \t\r\n.*>") {
			return fmt.Errorf("%w: stream name %q", outboxplugin.ErrInvalidOption, name)
		}
		p.expectedStream = name
		return nil
	}
}

// New returns a Publisher that publishes with js. Its asynchronous publishing window is the one js
// was created with (jetstream.WithPublishAsyncMaxPending, default 4000 messages in flight); batches
// larger than the window are published as acknowledgements free it. An invalid option is returned
// as an error wrapping outboxplugin.ErrInvalidOption.
func New(js jetstream.JetStream, opts ...Option) (*Publisher, error) {
	if js == nil {
		return nil, fmt.Errorf("outboxnats: New: %w: nil JetStream", outboxplugin.ErrInvalidOption)
	}
	p := &Publisher{js: js}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(p); err != nil {
			return nil, fmt.Errorf("outboxnats: New: %w", err)
		}
	}
	if p.subject == nil {
		p.subject = DefaultSubject
		if p.checkSubjects == nil {
			p.checkSubjects = []string{"outbox.>"}
		}
	}
	return p, nil
}

// DefaultSubject returns the subject a message goes to by default: outbox.<aggregate>.<event>, with
// the tokens of outboxplugin.RouteTokens (outbox.User.User_create; outbox._.<event> for an event
// without an aggregate). A stream that captures outbox.> takes every event; outbox.User.> one
// aggregate type's.
func DefaultSubject(m outboxplugin.Message) string {
	aggregate, event := outboxplugin.RouteTokens(m)
	return "outbox." + aggregate + "." + event
}

// Publish publishes msgs asynchronously and waits for the stream's acknowledgement of each. It
// returns nil when every message was stored (a duplicate the stream dropped by its Nats-Msg-Id
// counts as stored), and an *outboxplugin.PublishError naming the messages that were not. Their
// errors say which of two kinds each failure is:
//
//   - the broker did not get the message — the connection was lost or closed, no acknowledgement
//     came before ctx ended or the client's publish timeout, JetStream answered 503 (temporarily
//     unavailable, out of resources): the error wraps outboxplugin.ErrBrokerUnavailable, and the
//     worker retries the message without spending an attempt;
//   - the relay or the server is configured wrong — no stream captures its subject, the stream of
//     WithExpectedStream does not, the server refused the credentials or the permission to publish:
//     the error wraps outboxplugin.ErrMisconfigured and names the subject (and the stream) and the
//     server, and the worker retries the message without spending an attempt, reporting the cause
//     at error and in Worker.Health until it is fixed;
//   - the server or the client refused it — too large, an invalid subject, a stream that refuses it
//     by its limits (DiscardNew): the error wraps neither, and the retry spends an attempt, so that
//     a message that can never be stored ends dead instead of being retried for ever.
//
// When the connection is down it fails the whole batch at once, without waiting, with an error
// wrapping outboxplugin.ErrBrokerUnavailable: the NATS client reconnects by itself (unless it gave
// up and closed) and a later call publishes again.
func (p *Publisher) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outboxnats: publish: %w", err)
	}
	nc := p.js.Conn()
	if err := connected(nc); err != nil {
		if refused := nc.LastError(); misconfigured(refused) {
			return fmt.Errorf("outboxnats: publish: %w: the server refused the credentials (server %s): %w", outboxplugin.ErrMisconfigured, serverOf(nc), refused)
		}
		return fmt.Errorf("outboxnats: publish: %w: %w", outboxplugin.ErrBrokerUnavailable, err)
	}

	var failed map[string]error
	subjects := make([]string, len(msgs))
	fail := func(i int, err error) {
		if failed == nil {
			failed = make(map[string]error)
		}
		id := msgs[i].ID
		switch {
		case misconfigured(err):
			failed[id] = fmt.Errorf("outboxnats: %w: %s: %w", outboxplugin.ErrMisconfigured, p.misconfiguration(nc, subjects[i], err), err)
		case unavailable(err):
			failed[id] = fmt.Errorf("outboxnats: %w: %w", outboxplugin.ErrBrokerUnavailable, err)
		default:
			failed[id] = fmt.Errorf("outboxnats: %w", err)
		}
	}

	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		msg, err := p.natsMsg(m)
		if msg != nil {
			subjects[i] = msg.Subject
		}
		stop := false
		switch {
		case err != nil:
		case ctx.Err() != nil:
			err, stop = fmt.Errorf("not published: %w", ctx.Err()), true
		default:
			futures[i], stop, err = p.publishAsync(ctx, nc, msg)
		}
		if err == nil {
			continue
		}
		fail(i, err)
		if stop {
			// The rest of the batch cannot go out either: fail it without trying.
			for j := i + 1; j < len(msgs); j++ {
				fail(j, err)
			}
			break
		}
	}

	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			fail(i, err)
		case <-ctx.Done():
			// Whatever was acknowledged by now is stored; the rest counts as failed, and if the
			// stream stores it after all, the retry is dropped as a duplicate.
			for j := i; j < len(futures); j++ {
				if futures[j] != nil && !acknowledged(futures[j]) {
					fail(j, fmt.Errorf("no acknowledgement: %w", ctx.Err()))
				}
			}
			return outboxplugin.FailedMessages(failed)
		}
	}
	return outboxplugin.FailedMessages(failed)
}

// publishAsync publishes msg, waiting while the window of unacknowledged messages is full — until
// ctx ends. stop reports an error after which no later message of the batch can be published
// either: a lost or closed connection, or the end of ctx.
func (p *Publisher) publishAsync(ctx context.Context, nc *nats.Conn, msg *nats.Msg) (f jetstream.PubAckFuture, stop bool, err error) {
	for {
		// Once disconnected, the client would buffer the message until it reconnects, and the batch
		// would wait out its whole timeout: stop here instead, and let the worker retry.
		if err := connected(nc); err != nil {
			return nil, true, err
		}
		f, err := p.js.PublishMsgAsync(msg)
		switch {
		case err == nil:
			return f, false, nil
		case errors.Is(err, jetstream.ErrTooManyStalledMsgs):
			// The window stayed full for the client's stall wait (200 ms): keep waiting for
			// acknowledgements as long as ctx allows.
			if ctx.Err() != nil {
				return nil, true, fmt.Errorf("window of unacknowledged messages full: %w", ctx.Err())
			}
		case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining),
			errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrDisconnected):
			return nil, true, err
		default:
			return nil, false, err // this message only: too large, a bad header, a bad subject
		}
	}
}

// misconfiguration describes a configuration error of a message to subject: what is missing, and
// the server.
func (p *Publisher) misconfiguration(nc *nats.Conn, subject string, err error) string {
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired):
		return fmt.Sprintf("the server refused the credentials (server %s)", serverOf(nc))
	case errors.Is(err, nats.ErrPermissionViolation):
		return fmt.Sprintf("no permission to publish to subject %q (server %s)", subject, serverOf(nc))
	case p.expectedStream != "":
		return fmt.Sprintf("stream %q does not capture subject %q, or does not exist (server %s)", p.expectedStream, subject, serverOf(nc))
	}
	return fmt.Sprintf("no JetStream stream captures subject %q (server %s)", subject, serverOf(nc))
}

// serverOf names the server of nc without credentials: the one it is connected to, or else the
// first it knows of.
func serverOf(nc *nats.Conn) string {
	if u := nc.ConnectedUrlRedacted(); u != "" {
		return u
	}
	for _, s := range nc.Servers() {
		if u, err := url.Parse(s); err == nil {
			return u.Redacted()
		}
	}
	return "unknown"
}

// connected reports an error unless nc is connected.
func connected(nc *nats.Conn) error {
	if nc.IsConnected() {
		return nil
	}
	if nc.IsClosed() {
		return nats.ErrConnectionClosed
	}
	return fmt.Errorf("%w (connection %s)", nats.ErrDisconnected, nc.Status())
}

// acknowledged reports whether f has its acknowledgement, without waiting.
func acknowledged(f jetstream.PubAckFuture) bool {
	select {
	case <-f.Ok():
		return true
	default:
		return false
	}
}

// natsMsg builds the JetStream message of m: headers from HeaderList, Nats-Msg-Id = m.ID (over an
// event header of that name), payload as the body.
func (p *Publisher) natsMsg(m *outboxplugin.Message) (*nats.Msg, error) {
	subject := p.subject(*m)
	if err := validateSubject(subject); err != nil {
		return nil, err
	}
	list := m.HeaderList()
	// One backing array for every header value: a nats.Header value is a []string, and a slice of
	// length one per header would be one allocation each.
	values := make([]string, 0, len(list)+2)
	h := make(nats.Header, len(list)+2)
	set := func(k, v string) {
		values = append(values, v)
		h[k] = values[len(values)-1 : len(values) : len(values)]
	}
	for _, kv := range list {
		set(kv.Key, kv.Value)
	}
	if m.ID != "" {
		set(jetstream.MsgIDHeader, m.ID)
	}
	if p.expectedStream != "" {
		set(jetstream.ExpectedStreamHeader, p.expectedStream)
	}
	return &nats.Msg{Subject: subject, Header: h, Data: m.Payload}, nil
}

// validateSubject refuses the subjects a message must not be published to. The client checks only
// white space: a subject with an empty token reaches the server and fails only after the client's
// no-responders retries, and one with a wildcard token is stored literally, where no consumer's
// filter can single it out.
func validateSubject(s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty", ErrInvalidSubject)
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			switch s[i] {
			case ' ', '\t', '\r', '\n':
				return fmt.Errorf("%w: %q has white space", ErrInvalidSubject, s)
			case '.':
			default:
				continue
			}
		}
		switch tok := s[start:i]; tok {
		case "":
			return fmt.Errorf("%w: %q has an empty token", ErrInvalidSubject, s)
		case "*", ">":
			return fmt.Errorf("%w: %q has a wildcard", ErrInvalidSubject, s)
		}
		start = i + 1
	}
	return nil
}
