// Package outboxkafka publishes outbox events to Kafka with franz-go (github.com/twmb/franz-go/pkg/kgo).
//
// Every event becomes one record: key Message.Key, value Message.Payload, headers
// Message.HeaderList(), timestamp Message.CreatedAt, on the topic outbox.<aggregate> unless WithTopic
// says otherwise. A batch is produced asynchronously as a whole and its acknowledgements are awaited
// together; records Kafka did not acknowledge are reported to the worker by message ID, so that only
// they are retried.
//
// Options, delivery guarantees and measured throughput:
// https://github.com/gorm-outbox/outboxplugin/blob/main/publishers/kafka/README.md
// How the publishers compare: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/publishers.md.
package outboxkafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Publisher publishes outbox messages as Kafka records with a *kgo.Client. It is safe for concurrent
// use by several workers; the caller owns the client and closes it after the workers have stopped.
type Publisher struct {
	client      *kgo.Client
	topic       func(outboxplugin.Message) string
	flush       bool   // the client lingers or flushes by hand: Publish flushes while it waits
	brokers     string // the client's seed brokers, for errors
	checkTopics []string
}

var _ outboxplugin.Publisher = (*Publisher)(nil)

// Option configures a Publisher.
type Option func(*Publisher) error

// WithTopic sets the topic of each message (default DefaultTopic). The function runs once per
// message on the publishing goroutine and must be fast. An empty topic sends the record to the
// client's kgo.DefaultProduceTopic; without one, the message fails.
//
// Kafka orders records per partition only: keep every event of one key on one topic, or their
// order is lost.
func WithTopic(fn func(outboxplugin.Message) string) Option {
	return func(p *Publisher) error {
		if fn == nil {
			return fmt.Errorf("outboxkafka: %w: nil topic function", outboxplugin.ErrInvalidOption)
		}
		p.topic = fn
		return nil
	}
}

// DefaultTopic is the topic of m unless WithTopic is given: outbox.<aggregate>, with the aggregate
// type as outboxplugin.RouteTokens cleans it ("_" when empty), such as outbox.User. All event types
// of one aggregate share one topic, so that the events of one key land on one partition, in order.
func DefaultTopic(m outboxplugin.Message) string {
	aggregate, _ := outboxplugin.RouteTokens(m)
	return "outbox." + aggregate
}

// New returns a Publisher that produces with client. Configure the client for an outbox with:
//   - acknowledgement by all in-sync replicas and the idempotent producer, both kgo defaults: a retry
//     inside the client then neither loses, duplicates nor reorders records;
//   - kgo.AllowIdempotentProduceCancellation(): the records of a publish that timed out are dropped
//     by the client instead of being retried by it beside the worker's own retry, which would
//     deliver them once per failed attempt when the broker comes back.
//
// The linger may stay at kgo's default (10 ms): on a client with a linger, or with
// kgo.ManualFlushing, Publish flushes the client once it has produced its batch, so that the batch
// goes out at once in as few requests as possible. The flush also sends early what other producers
// of a shared client have buffered, and kgo logs its "flushing" line at info level once per batch.
// With kgo.ProducerLinger(0) nothing is flushed and each record is sent as soon as a request can
// take it. A transactional client (kgo.TransactionalID) is rejected: its records need a transaction
// this publisher does not open.
func New(client *kgo.Client, opts ...Option) (*Publisher, error) {
	if client == nil {
		return nil, fmt.Errorf("outboxkafka: %w: nil client", outboxplugin.ErrInvalidOption)
	}
	if id, _ := client.OptValue(kgo.TransactionalID).(string); id != "" {
		return nil, fmt.Errorf("outboxkafka: %w: transactional client %q", outboxplugin.ErrInvalidOption, id)
	}
	linger, _ := client.OptValue(kgo.ProducerLinger).(time.Duration)
	manual, _ := client.OptValue(kgo.ManualFlushing).(bool)
	seeds, _ := client.OptValue(kgo.SeedBrokers).([]string)
	p := &Publisher{client: client, topic: DefaultTopic, flush: linger > 0 || manual, brokers: strings.Join(seeds, ",")}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("outboxkafka: %w: nil option", outboxplugin.ErrInvalidOption)
		}
		if err := opt(p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Publish produces one record per message and waits until Kafka has acknowledged all of them or
// ctx ends. It returns nil when every record was acknowledged, and an *outboxplugin.PublishError
// naming the messages that failed otherwise, each with an error that wraps the kgo error (such as a
// kerr.Error) or, for a record not acknowledged when ctx ended, ctx.Err(). A record reported failed
// on a deadline may still reach Kafka later; the worker then publishes it again, which is a
// duplicate, never a loss.
//
// The error of a record Kafka did not get — not acknowledged in time (ctx, kgo.ErrRecordTimeout),
// its retries used up (kgo.ErrRecordRetries), a retriable broker error (kerr.IsRetriable: no leader,
// not enough replicas, ...), a network error, a closed client — also wraps
// outboxplugin.ErrBrokerUnavailable: the worker retries it without spending an attempt. The error
// of a record that fails for a configuration error — a topic that does not exist
// (UNKNOWN_TOPIC_OR_PARTITION), TOPIC_AUTHORIZATION_FAILED, a SASL login refused — wraps
// outboxplugin.ErrMisconfigured instead, naming the topic and the seed brokers: no attempt is spent
// either, and the worker reports it at error and in Worker.Health. The error of a record Kafka or
// the client refused (MESSAGE_TOO_LARGE, CORRUPT_MESSAGE, no topic at all, ...) wraps neither: its
// retry spends an attempt.
//
// The client retries lost connections and retriable broker errors by itself, within ctx; a broker
// that stays away fails the batch, as not delivered, when ctx ends, and a later Publish uses the
// reconnected client. The records a client still holds for a partition when an earlier publish
// timed out fail with that publish's context error once the broker answers (kgo never fails one
// record and sends a later one of its partition); they are reported as not delivered "with an
// earlier record of its partition" and the worker retries them.
func (p *Publisher) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outboxkafka: publish: %w", err)
	}
	records := buildRecords(msgs, p.topic)
	b := &pendingBatch{brokers: p.brokers, left: len(records), results: make([]recordResult, len(records)), done: make(chan struct{})}
	for i := range records {
		b.results[i].topic = records[i].Topic
	}
	for i := range records {
		p.client.Produce(ctx, &records[i], b.promise(i))
	}
	if p.flush {
		// Without a flush the batch would wait out the linger of each partition (or, flushing by
		// hand, forever). Flush returns when nothing is buffered, which on a shared client may be
		// later than this batch is done: it is cancelled then. Its goroutine ends before Publish
		// returns.
		fctx, stop := context.WithCancel(ctx)
		flushed := make(chan struct{})
		go func() {
			defer close(flushed)
			_ = p.client.Flush(fctx) // its error is ctx's, which the select below sees
		}()
		defer func() {
			stop()
			<-flushed
		}()
	}
	select {
	case <-b.done:
	case <-ctx.Done():
	}
	return b.failures(msgs, ctx.Err())
}

// buildRecords turns msgs into records. The bytes of every key and header value of the batch share
// one buffer, and the headers one slice, so that a batch costs a handful of allocations beyond the
// HeaderList of each message.
func buildRecords(msgs []outboxplugin.Message, topic func(outboxplugin.Message) string) []kgo.Record {
	lists := make([][]outboxplugin.Header, len(msgs))
	var nHeaders, nBytes int
	for i := range msgs {
		lists[i] = msgs[i].HeaderList()
		nHeaders += len(lists[i])
		nBytes += len(msgs[i].Key)
		for _, h := range lists[i] {
			nBytes += len(h.Value)
		}
	}
	buf := make([]byte, 0, nBytes)
	headers := make([]kgo.RecordHeader, 0, nHeaders)
	// bytesOf copies s into buf and returns its copy, capped so that an append cannot reach the next.
	bytesOf := func(s string) []byte {
		start := len(buf)
		buf = append(buf, s...)
		return buf[start:len(buf):len(buf)]
	}
	records := make([]kgo.Record, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		r := &records[i]
		r.Topic = topic(*m)
		if m.Key != "" {
			r.Key = bytesOf(m.Key)
		}
		r.Value = m.Payload
		r.Timestamp = m.CreatedAt
		start := len(headers)
		for _, h := range lists[i] {
			headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: bytesOf(h.Value)})
		}
		r.Headers = headers[start:len(headers):len(headers)]
	}
	return records
}

// pendingBatch collects the acknowledgements of one Publish. kgo calls the promises serially on its
// own goroutine, possibly after Publish has returned on a deadline; the mutex orders them with the
// read of the results.
type pendingBatch struct {
	brokers string // the seed brokers, for errors
	mu      sync.Mutex
	left    int
	results []recordResult
	done    chan struct{} // closed when every record has its result
}

// recordResult is what became of one record: its topic is set before it is produced, acked or err
// by its promise.
type recordResult struct {
	topic string
	acked bool
	err   error
}

// promise returns the kgo promise of record i.
func (b *pendingBatch) promise(i int) func(*kgo.Record, error) {
	return func(_ *kgo.Record, err error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.results[i].acked, b.results[i].err = err == nil, err
		b.left--
		if b.left == 0 {
			close(b.done)
		}
	}
}

// failures returns nil when every record was acknowledged, or a PublishError with the error of each
// message whose record failed or, on ctxErr, was not acknowledged yet.
func (b *pendingBatch) failures(msgs []outboxplugin.Message, ctxErr error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var failed map[string]error
	for i, res := range b.results {
		if res.acked {
			continue
		}
		if failed == nil {
			failed = make(map[string]error)
		}
		var err error
		switch {
		case res.err == nil: // not acknowledged yet: Publish stopped waiting because ctx ended
			err = fmt.Errorf("topic %q: %w", res.topic, ctxErr)
		case ctxErr == nil && isContextErr(res.err):
			// kgo fails every record buffered for a partition with the context error of the first,
			// which belonged to an earlier publish that timed out.
			err = fmt.Errorf("topic %q: failed with an earlier record of its partition: %w", res.topic, res.err)
		default:
			err = fmt.Errorf("topic %q: %w", res.topic, res.err)
		}
		if misconfigured(err) {
			err = fmt.Errorf("outboxkafka: %w (brokers %s): %w", outboxplugin.ErrMisconfigured, b.brokers, err)
		} else if unavailable(err) {
			err = fmt.Errorf("outboxkafka: %w: %w", outboxplugin.ErrBrokerUnavailable, err)
		} else {
			err = fmt.Errorf("outboxkafka: %w", err)
		}
		failed[msgs[i].ID] = err
	}
	return outboxplugin.FailedMessages(failed)
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
