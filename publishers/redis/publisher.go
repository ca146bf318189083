// Package outboxredis is an outboxplugin.Publisher for Redis Streams: the relay of
// github.com/gorm-outbox/outboxplugin appends each outbox event to a stream with XADD, a whole batch
// in one pipelined round trip.
//
// Each event becomes one stream entry whose fields are the payload, under "payload", and every
// header of Message.HeaderList (the event's own headers, then outbox-id, outbox-event-type, ...).
// Redis 7 does not de-duplicate stream entries, and delivery is at least once: consumers de-duplicate
// on the outbox-id field.
//
// Options, delivery guarantees and measured throughput:
// https://github.com/gorm-outbox/outboxplugin/blob/main/publishers/redis/README.md
// How the publishers compare: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/publishers.md.
package outboxredis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/redis/go-redis/v9"
)

// FieldPayload is the stream entry field that holds the event's payload. The other fields are the
// headers of Message.HeaderList; an event header of this name is not sent, so that the field is
// always the payload.
const FieldPayload = "payload"

// Errors of single messages, found in the Failed map of the *outboxplugin.PublishError that Publish
// returns; match them with errors.Is.
var (
	// ErrNoStreamName is the error of a message for which the WithStream function returned "".
	ErrNoStreamName = errors.New("outboxredis: stream function returned an empty stream name")

	// ErrNoStream is the error of a message whose stream does not exist, with WithNoMkStream: a
	// configuration error (it comes wrapped together with outboxplugin.ErrMisconfigured).
	ErrNoStream = errors.New("outboxredis: stream does not exist")

	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("outboxredis: publisher closed")
)

// Publisher appends outbox messages to Redis streams. It is safe for concurrent use by several
// workers; it does not own the client, which the caller closes.
type Publisher struct {
	client redis.UniversalClient
	cfg    config
	// boundsIO is whether the client ends its socket I/O at the context's deadline
	// (ContextTimeoutEnabled). When it does not, Publish runs each pipeline in a goroutine of its own
	// so that it can return at the deadline anyway.
	boundsIO bool

	mu        sync.Mutex
	closed    bool
	abandoned sync.WaitGroup // pipelines Publish stopped waiting for
}

var _ outboxplugin.Publisher = (*Publisher)(nil)

// New returns a Publisher that writes with client: a *redis.Client, *redis.ClusterClient,
// *redis.Ring or a failover client. Create the client with ContextTimeoutEnabled: true, so that a
// publish that outlives its deadline is cut short on the socket and the replies already read still
// count; with a client that ignores context deadlines, Publish still returns at the deadline but
// counts the whole batch as failed, and the abandoned pipeline ends within the client's read and
// write timeouts (Close waits for it).
func New(client redis.UniversalClient, opts ...Option) (*Publisher, error) {
	if client == nil {
		return nil, fmt.Errorf("outboxredis: New: %w: nil client", outboxplugin.ErrInvalidOption)
	}
	cfg := config{stream: DefaultStream}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&cfg); err != nil {
			return nil, fmt.Errorf("outboxredis: New: %w", err)
		}
	}
	return &Publisher{client: client, cfg: cfg, boundsIO: boundsIO(client)}, nil
}

// boundsIO reports whether the client's socket reads and writes end at a context's deadline.
func boundsIO(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Publish appends each message to its stream with one XADD, all of them pipelined in one round trip
// (one per node on Redis Cluster), and returns once every reply is in. Entries of one stream are
// appended in the order of msgs. It returns nil when Redis accepted every message; an
// *outboxplugin.PublishError naming the messages that failed, when some did; and one error for the
// batch when every message failed for want of Redis: the connection was lost or
// refused, or ctx ended before a reply was read.
//
// The error of a message Redis did not get, or did not answer for — a network error, a timeout, a
// closed client, or a reply that speaks of the server's state rather than of the command (LOADING,
// READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, NOREPLICAS, OOM, too many clients) — wraps
// outboxplugin.ErrBrokerUnavailable, and so does the error of a batch that failed whole that way:
// the worker retries those messages without spending an attempt. The error of a message that fails
// for a configuration error — WRONGTYPE (the stream's key holds another type), NOAUTH, WRONGPASS,
// NOPERM, ErrNoStream — wraps outboxplugin.ErrMisconfigured instead, naming the key and the server:
// no attempt is spent either, and the worker reports it at error and in Worker.Health. The error of
// a message Redis refused otherwise (ErrNoStreamName, a syntax error, ...) wraps neither: its retry
// spends an attempt, and a message that can never be appended ends dead.
//
// When the pipeline breaks part way (a lost connection, the deadline), the messages whose reply was
// read count as published and the others fail, so that the worker's retry re-sends only those.
// Entries Redis appended but whose reply was lost are appended again, and go-redis itself re-sends a
// broken pipeline as a whole, up to the client's MaxRetries (MaxRetries: -1 leaves retrying to the
// worker): consumers de-duplicate on the outbox-id field.
func (p *Publisher) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	if p.isClosed() {
		return ErrClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outboxredis: publish %d messages: %w", len(msgs), err)
	}
	pipe := p.client.Pipeline()
	type appended struct {
		msg    *outboxplugin.Message
		stream string
		cmd    *redis.StringCmd
	}
	sent := make([]appended, 0, len(msgs))
	var failed map[string]error
	fail := func(id string, err error) {
		if failed == nil {
			failed = map[string]error{}
		}
		failed[id] = err
	}
	for i := range msgs {
		m := &msgs[i]
		stream := p.cfg.stream(*m)
		if stream == "" {
			fail(m.ID, ErrNoStreamName)
			continue
		}
		cmd := redis.NewStringCmd(ctx, p.xaddArgs(stream, m)...)
		_ = pipe.Process(ctx, cmd) // queues the command; its error is read after Exec
		sent = append(sent, appended{msg: m, stream: stream, cmd: cmd})
	}
	if len(sent) == 0 {
		return outboxplugin.FailedMessages(failed)
	}

	settled, err := p.exec(ctx, pipe)
	switch {
	case !settled && errors.Is(err, ErrClosed):
		return fmt.Errorf("outboxredis: publish %d messages: %w", len(msgs), err)
	case !settled: // ctx ended before the replies, on a client that does not bound its I/O by it
		return fmt.Errorf("outboxredis: publish %d messages: %w: %w", len(msgs), outboxplugin.ErrBrokerUnavailable, err)
	}
	for _, s := range sent {
		cerr := s.cmd.Err()
		if cerr == nil && s.cmd.Val() == "" {
			// No reply at all: the pipeline failed before it was sent — go-redis leaves the
			// commands untouched when the connection cannot be made or its login is refused — and
			// an XADD that succeeded always replies with the entry's ID.
			cerr = err
			if cerr == nil {
				cerr = errors.New("no reply")
			}
		}
		switch {
		case cerr == nil:
		case s.cmd.Val() != "":
			// Redis replied with the entry's ID before the pipeline broke (a lost connection, the
			// deadline): go-redis stamps the pipeline's error on every command, but this one was
			// appended, and counting it failed would only append it again.
		case errors.Is(cerr, redis.Nil): // XADD NOMKSTREAM replies nil when the stream is missing
			fail(s.msg.ID, fmt.Errorf("%w: %w: %s (server %s)", ErrNoStream, outboxplugin.ErrMisconfigured, s.stream, p.addr()))
		case misconfigured(cerr):
			fail(s.msg.ID, fmt.Errorf("outboxredis: XADD %s: %w (server %s): %w", s.stream, outboxplugin.ErrMisconfigured, p.addr(), cerr))
		case unavailable(cerr):
			fail(s.msg.ID, fmt.Errorf("outboxredis: XADD %s: %w: %w", s.stream, outboxplugin.ErrBrokerUnavailable, cerr))
		default:
			fail(s.msg.ID, fmt.Errorf("outboxredis: XADD %s: %w", s.stream, cerr))
		}
	}
	// A batch that failed as a whole for want of Redis or of time is one error, not a list.
	if err != nil && len(failed) == len(msgs) && allUnavailable(failed) {
		if cerr := contextErr(ctx); cerr != nil && !errors.Is(err, cerr) {
			// The deadline cut the socket short: say so in a way callers can match.
			return fmt.Errorf("outboxredis: publish %d messages: %w: %w (%v)", len(msgs), outboxplugin.ErrBrokerUnavailable, cerr, err)
		}
		return fmt.Errorf("outboxredis: publish %d messages: %w: %w", len(msgs), outboxplugin.ErrBrokerUnavailable, err)
	}
	return outboxplugin.FailedMessages(failed)
}

// allUnavailable reports whether every error of failed wraps outboxplugin.ErrBrokerUnavailable.
func allUnavailable(failed map[string]error) bool {
	for _, err := range failed {
		if !errors.Is(err, outboxplugin.ErrBrokerUnavailable) {
			return false
		}
	}
	return true
}

// exec runs the pipeline and reports whether its commands hold their replies (settled). A client
// that bounds its I/O by ctx returns at the deadline with the replies read so far; with one that
// does not, the pipeline runs in a goroutine of its own, which Publish abandons, unsettled, when ctx
// ends first.
func (p *Publisher) exec(ctx context.Context, pipe redis.Pipeliner) (settled bool, err error) {
	if p.boundsIO {
		_, err := pipe.Exec(ctx)
		return true, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false, ErrClosed
	}
	p.abandoned.Add(1)
	p.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		defer p.abandoned.Done()
		_, err := pipe.Exec(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		return true, err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// contextErr is ctx.Err(), or context.DeadlineExceeded as soon as ctx's deadline has passed: a
// socket deadline set to the same instant may fire before ctx's own timer.
func contextErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// xaddArgs returns the XADD command that appends m to stream:
//
//	XADD stream [NOMKSTREAM] [MAXLEN ~ n] * payload <payload> <header> <value> ...
//
// It builds the argument list in one allocation, where redis.XAddArgs would build it twice.
func (p *Publisher) xaddArgs(stream string, m *outboxplugin.Message) []any {
	headers := m.HeaderList()
	args := make([]any, 0, 9+2*len(headers))
	args = append(args, "xadd", stream)
	if p.cfg.noMkStream {
		args = append(args, "nomkstream")
	}
	if p.cfg.maxLen > 0 {
		args = append(args, "maxlen", "~", p.cfg.maxLen)
	}
	args = append(args, "*", FieldPayload, m.Payload)
	for _, h := range headers {
		if h.Key != FieldPayload {
			args = append(args, h.Key, h.Value)
		}
	}
	return args
}

func (p *Publisher) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Close waits until the pipelines that Publish stopped waiting for at a context's end have ended
// (only a client that ignores context deadlines leaves any; they end within its read and write
// timeouts). Publish returns ErrClosed afterwards. Close does not close the client.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.abandoned.Wait()
	return nil
}
