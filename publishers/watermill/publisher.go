// Package outboxwatermill publishes outbox events through any Watermill publisher
// (github.com/ThreeDotsLabs/watermill): AMQP, Kafka, NATS, SQL, Google Cloud Pub/Sub, the in-process
// gochannel and the rest of Watermill's backends.
//
// Each message becomes a Watermill message whose UUID is the event's ID, whose metadata is
// outboxplugin.Message.HeaderList and whose payload is the event's payload. A batch is grouped by
// topic, keeping the batch's order within a topic, and each group goes to the backend in one
// variadic Publish call; the groups run concurrently.
//
// Options, delivery guarantees and measured throughput:
// https://github.com/gorm-outbox/outboxplugin/blob/main/publishers/watermill/README.md
// How the publishers compare: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/publishers.md.
package outboxwatermill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/gorm-outbox/outboxplugin"
)

// Errors a caller can act on; match them with errors.Is.
var (
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("outboxwatermill: publisher closed")

	// ErrEmptyTopic fails a message for which the topic function returned "".
	ErrEmptyTopic = errors.New("outboxwatermill: empty topic")
)

// Publisher is an outboxplugin.Publisher that hands batches to a Watermill message.Publisher. It
// is safe for concurrent use.
type Publisher struct {
	pub   message.Publisher
	cfg   config
	slots chan struct{} // one token per running Watermill Publish call (WithConcurrency)

	mu      sync.Mutex
	closed  bool
	running int           // group goroutines started and not yet ended
	idle    chan struct{} // closed once closed and running == 0
}

var _ outboxplugin.Publisher = (*Publisher)(nil)

// New returns a Publisher that publishes through pub. pub stays the caller's: Close does not close
// it. Invalid options are reported as an error wrapping outboxplugin.ErrInvalidOption.
func New(pub message.Publisher, opts ...Option) (*Publisher, error) {
	if pub == nil {
		return nil, fmt.Errorf("outboxwatermill: %w: nil Watermill publisher", outboxplugin.ErrInvalidOption)
	}
	cfg := config{topic: DefaultTopic, concurrency: DefaultConcurrency}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("outboxwatermill: %w: nil option", outboxplugin.ErrInvalidOption)
		}
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	return &Publisher{
		pub:   pub,
		cfg:   cfg,
		slots: make(chan struct{}, cfg.concurrency),
		idle:  make(chan struct{}),
	}, nil
}

// topicGroup is the messages of one batch bound for one topic, in batch order.
type topicGroup struct {
	topic string
	ids   []string
	msgs  []*message.Message
}

// groupResult is the outcome of one topicGroup's Publish call.
type groupResult struct {
	group int
	err   error
}

// Publish groups msgs by topic and publishes each group with one call of the Watermill publisher's
// Publish, the groups concurrently (at most WithConcurrency at once). It returns nil when every call
// succeeded, and otherwise an *outboxplugin.PublishError in which every message of a failed group
// (a Watermill Publish returns one error for all its messages) and every message without a topic is
// failed; the other messages count as published.
//
// The error of a group whose call did not finish before ctx ended, or failed with an error that
// says the broker did not get the messages (see WithUnavailable: by default the end of ctx, a
// network error of the standard library, an error wrapping outboxplugin.ErrBrokerUnavailable),
// wraps outboxplugin.ErrBrokerUnavailable: the worker retries those messages without spending an
// attempt. Any other error of the Watermill publisher, a panic of it and ErrEmptyTopic are
// refusals: the retry spends an attempt.
//
// Watermill's Publish takes no context, so ctx is given to each message (message.SetContext), where
// backends that honour it see it, and Publish returns as soon as ctx ends: the messages of every
// group whose call has not returned by then are reported failed with ctx's error, and are published
// again on the worker's next attempt. A call still running is not stopped: it goes on in the
// background until the Watermill publisher returns, and whatever it manages to deliver is delivered
// a second time by that retry (at least once; consumers de-duplicate on the message UUID). Such a
// call keeps its concurrency slot until it returns; Close waits for it.
func (p *Publisher) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outboxwatermill: publish: %w", err)
	}

	var failed map[string]error
	fail := func(id string, err error) {
		if failed == nil {
			failed = make(map[string]error)
		}
		failed[id] = err
	}
	var groups []topicGroup
	index := make(map[string]int)
	for i := range msgs {
		m := &msgs[i]
		topic := p.cfg.topic(*m)
		if topic == "" {
			fail(m.ID, fmt.Errorf("%w for message %s", ErrEmptyTopic, m.ID))
			continue
		}
		g, ok := index[topic]
		if !ok {
			g = len(groups)
			index[topic] = g
			groups = append(groups, topicGroup{topic: topic})
		}
		groups[g].ids = append(groups[g].ids, m.ID)
		groups[g].msgs = append(groups[g].msgs, toWatermill(ctx, m))
	}
	if len(groups) == 0 {
		return outboxplugin.FailedMessages(failed)
	}
	if !p.begin(len(groups)) {
		return ErrClosed
	}

	// Buffered for every group, so that a call that returns after Publish gave up never blocks.
	done := make(chan groupResult, len(groups))
	for g := range groups {
		go p.publishGroup(ctx, g, groups[g].topic, groups[g].msgs, done)
	}
	finished := make([]bool, len(groups))
	record := func(r groupResult) {
		finished[r.group] = true
		if r.err != nil {
			for _, id := range groups[r.group].ids {
				fail(id, r.err)
			}
		}
	}
	for pending := len(groups); pending > 0; pending-- {
		select {
		case r := <-done:
			record(r)
		case <-ctx.Done():
			// Take the results that arrived together with the deadline before failing the rest,
			// so that a group the broker acknowledged is not published twice without need.
			for drained := false; !drained; {
				select {
				case r := <-done:
					record(r)
				default:
					drained = true
				}
			}
			for g, ok := range finished {
				if !ok {
					err := fmt.Errorf("outboxwatermill: publish to topic %q not finished: %w: %w", groups[g].topic, outboxplugin.ErrBrokerUnavailable, ctx.Err())
					for _, id := range groups[g].ids {
						fail(id, err)
					}
				}
			}
			return outboxplugin.FailedMessages(failed)
		}
	}
	return outboxplugin.FailedMessages(failed)
}

// toWatermill converts m into a Watermill message: UUID = ID, metadata = HeaderList, payload as is,
// context = ctx.
func toWatermill(ctx context.Context, m *outboxplugin.Message) *message.Message {
	headers := m.HeaderList()
	meta := make(message.Metadata, len(headers))
	for _, h := range headers {
		meta[h.Key] = h.Value
	}
	wm := message.NewMessage(m.ID, m.Payload)
	wm.Metadata = meta
	wm.SetContext(ctx)
	return wm
}

// publishGroup waits for a concurrency slot (or the end of ctx, and then publishes nothing), calls
// the Watermill publisher for one group and sends the result to done.
func (p *Publisher) publishGroup(ctx context.Context, group int, topic string, msgs []*message.Message, done chan<- groupResult) {
	defer p.end()
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		done <- groupResult{group, fmt.Errorf("outboxwatermill: publish to topic %q not started: %w: %w", topic, outboxplugin.ErrBrokerUnavailable, ctx.Err())}
		return
	}
	defer func() { <-p.slots }()
	// A slot and the end of ctx may have been ready together.
	if err := ctx.Err(); err != nil {
		done <- groupResult{group, fmt.Errorf("outboxwatermill: publish to topic %q not started: %w: %w", topic, outboxplugin.ErrBrokerUnavailable, err)}
		return
	}
	done <- groupResult{group, p.call(topic, msgs)}
}

// call runs the Watermill publisher's Publish, turning a panic into an error so that a faulty
// backend fails its group instead of the process.
func (p *Publisher) call(topic string, msgs []*message.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("outboxwatermill: publish to topic %q panicked: %v", topic, r)
		}
	}()
	if err := p.pub.Publish(topic, msgs...); err != nil {
		if !errors.Is(err, outboxplugin.ErrBrokerUnavailable) && p.unavailable(err) {
			return fmt.Errorf("outboxwatermill: publish to topic %q: %w: %w", topic, outboxplugin.ErrBrokerUnavailable, err)
		}
		return fmt.Errorf("outboxwatermill: publish to topic %q: %w", topic, err)
	}
	return nil
}

// unavailable reports whether err, the error of a Watermill Publish call (that does not wrap
// outboxplugin.ErrBrokerUnavailable already), says the broker did not get the messages rather than
// refused them. Watermill's backends share no error values, so only what the standard library
// defines is known here: the end of the messages' context (a backend that honours it stopped), a
// network error; WithUnavailable adds the backend's own. Everything else is taken for a refusal,
// which at worst spends attempts on an outage the Publisher cannot recognise — what every failure
// did before publishers told the two apart — rather than retrying without end a message the broker
// refuses.
func (p *Publisher) unavailable(err error) bool {
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &netErr), errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	}
	return p.cfg.unavailable != nil && p.cfg.unavailable(err)
}

// begin registers n group goroutines about to start, unless the Publisher is closed.
func (p *Publisher) begin(n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.running += n
	return true
}

// end records that a group goroutine ended.
func (p *Publisher) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running--
	if p.closed && p.running == 0 {
		close(p.idle)
	}
}

// Close makes later Publish calls fail with ErrClosed and waits until every Watermill Publish call
// the Publisher started has returned — including calls that a Publish left running when its
// context ended — or until ctx ends, which it reports with an error wrapping ctx's. It does not
// close the Watermill publisher, which belongs to the caller: close that after Close returns (or
// before, to make calls that hang return). Close may be called more than once.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		if p.running == 0 {
			close(p.idle)
		}
	}
	p.mu.Unlock()
	select {
	case <-p.idle:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		running := p.running
		p.mu.Unlock()
		return fmt.Errorf("outboxwatermill: close: %d Watermill Publish call(s) still running: %w", running, ctx.Err())
	}
}
