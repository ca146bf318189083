package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
)

// watermill-sql's outbox: an application publishes through forwarder.NewPublisher, which wraps each
// message in an envelope naming its destination topic and writes it, through a watermill-sql
// Publisher, to the forwarder topic's table; the forwarder reads that table with a watermill-sql
// Subscriber and publishes each unwrapped message to the destination. Here the backlog is written
// that way before the timer starts, and the timed part is the forwarder delivering it to a publisher
// that only counts.

// destinationTopic is where the forwarder publishes: the event type of the outbox variants.
const destinationTopic = "Bench_create"

// fillChunk is how many messages one Publish call writes (one multi-row INSERT of its own).
const fillChunk = 1000

// watermillSetup is one configuration of the forwarder's subscriber.
type watermillSetup struct {
	name string
	// topic is the forwarder topic; watermill-sql keeps its messages in watermill_<topic>.
	topic   string
	schema  wmsql.SchemaAdapter
	offsets wmsql.OffsetsAdapter
	// pollInterval is SubscriberConfig.PollInterval; zero leaves watermill's default (1 s).
	pollInterval time.Duration
	// tables are the tables the schema and offsets adapters create, dropped before each fill.
	tables []string
	// describe is the configuration as the report prints it.
	describe string
}

// watermillSetups returns the default configuration for the kind of server, and the tuned one: the
// queue schema, acked rows marked rather than deleted (its offsets adapter's DeleteOnAck false), 1000
// messages per query and a 10 ms poll interval.
func watermillSetups(kind string) (def, tuned watermillSetup) {
	const defTopic, tunedTopic = "cmp_default", "cmp_tuned"
	def = watermillSetup{
		name:   "watermill_default",
		topic:  defTopic,
		tables: []string{"watermill_" + defTopic, "watermill_offsets_" + defTopic},
	}
	tuned = watermillSetup{
		name:         "watermill_tuned",
		topic:        tunedTopic,
		pollInterval: 10 * time.Millisecond,
		tables:       []string{"watermill_" + tunedTopic},
	}
	if kind == postgresKind {
		def.schema = wmsql.DefaultPostgreSQLSchema{}
		def.offsets = wmsql.DefaultPostgreSQLOffsetsAdapter{}
		def.describe = "sql.DefaultPostgreSQLSchema{} (SubscribeBatchSize 0 = 100), sql.DefaultPostgreSQLOffsetsAdapter{}, " +
			"SubscriberConfig{SchemaAdapter, OffsetsAdapter} (ConsumerGroup \"\", PollInterval 0 = 1 s, AckDeadline nil = 30 s)"
		tuned.schema = wmsql.PostgreSQLQueueSchema{SubscribeBatchSize: 1000}
		tuned.offsets = wmsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: false}
		tuned.describe = "sql.PostgreSQLQueueSchema{SubscribeBatchSize: 1000}, sql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: false}, " +
			"SubscriberConfig{SchemaAdapter, OffsetsAdapter, PollInterval: 10 * time.Millisecond}"
	} else {
		def.schema = wmsql.DefaultMySQLSchema{}
		def.offsets = wmsql.DefaultMySQLOffsetsAdapter{}
		def.describe = "sql.DefaultMySQLSchema{} (SubscribeBatchSize 0 = 100), sql.DefaultMySQLOffsetsAdapter{}, " +
			"SubscriberConfig{SchemaAdapter, OffsetsAdapter} (ConsumerGroup \"\", PollInterval 0 = 1 s, AckDeadline nil = 30 s)"
		tuned.schema = wmsql.MySQLQueueSchema{SubscribeBatchSize: 1000}
		tuned.offsets = wmsql.MySQLQueueOffsetsAdapter{DeleteOnAck: false}
		tuned.describe = "sql.MySQLQueueSchema{SubscribeBatchSize: 1000}, sql.MySQLQueueOffsetsAdapter{DeleteOnAck: false}, " +
			"SubscriberConfig{SchemaAdapter, OffsetsAdapter, PollInterval: 10 * time.Millisecond}"
	}
	return def, tuned
}

func (w watermillSetup) subscriberConfig() wmsql.SubscriberConfig {
	return wmsql.SubscriberConfig{SchemaAdapter: w.schema, OffsetsAdapter: w.offsets, PollInterval: w.pollInterval}
}

// watermillVariant is the forwarder in one configuration, that many forwarders (each with a
// Subscriber of its own) on the same topic at once.
func watermillVariant(s *server, w watermillSetup) variant {
	db := wmsql.BeginnerFromStdSQL(s.pool)
	log := &countingLogger{}
	return variant{
		name:     w.name,
		describe: w.describe,
		prepare:  func(ctx context.Context, n int) error { return fillWatermill(ctx, s, db, w, n) },
		drain: func(ctx context.Context, n, consumers int) (drained, error) {
			delivered := newCounter(n)
			log.drain.Store(delivered)
			out := countingPublisher{delivered}
			forwarders := make([]consumer, consumers)
			for i := range forwarders {
				sub, err := wmsql.NewSubscriber(db, w.subscriberConfig(), log)
				if err != nil {
					return drained{}, fmt.Errorf("watermill subscriber: %w", err)
				}
				fwd, err := forwarder.NewForwarder(sub, out, log, forwarder.Config{ForwarderTopic: w.topic})
				if err != nil {
					return drained{}, fmt.Errorf("watermill forwarder: %w", err)
				}
				forwarders[i] = consumer{run: fwd.Run, stop: fwd.Close}
			}
			return deliver(ctx, delivered, forwarders)
		},
		notes: log.notes,
	}
}

// fillWatermill re-creates the setup's tables (the subscriber's SubscribeInitialize, as
// InitializeSchema would at Subscribe) and writes n enveloped messages {"id": <n>} to the forwarder
// topic, fillChunk per INSERT.
func fillWatermill(ctx context.Context, s *server, db wmsql.Beginner, w watermillSetup, n int) error {
	if err := s.dropTables(ctx, w.tables...); err != nil {
		return err
	}
	sub, err := wmsql.NewSubscriber(db, w.subscriberConfig(), nil)
	if err != nil {
		return fmt.Errorf("watermill subscriber: %w", err)
	}
	if err := sub.SubscribeInitialize(w.topic); err != nil {
		return fmt.Errorf("watermill schema: %w", err)
	}
	if err := sub.Close(); err != nil {
		return err
	}
	sqlPub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{SchemaAdapter: w.schema}, nil)
	if err != nil {
		return fmt.Errorf("watermill publisher: %w", err)
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: w.topic})
	defer pub.Close()
	for first := 1; first <= n; first += fillChunk {
		msgs := make([]*message.Message, 0, fillChunk)
		for id := first; id < first+fillChunk && id <= n; id++ {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{"id":`+strconv.Itoa(id)+`}`))
			m.Metadata.Set("aggregate_type", "Bench")
			m.Metadata.Set("aggregate_id", strconv.Itoa(id))
			m.SetContext(ctx)
			msgs = append(msgs, m)
		}
		if err := pub.Publish(destinationTopic, msgs...); err != nil {
			return fmt.Errorf("watermill fill: %w", err)
		}
	}
	return s.afterFill(ctx, w.tables[0])
}

// countingPublisher is the forwarder's out-publisher: it counts and does nothing else.
type countingPublisher struct{ delivered *counter }

func (p countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.delivered.add(len(msgs))
	return nil
}

func (countingPublisher) Close() error { return nil }

// countingLogger discards watermill's logs but counts what explains a slow drain: queries the
// subscriber retried at once after a lock conflict ("deadlock" or "concurrent update" in the error:
// its default backoff manager's test), and errors, which cost a pause of RetryInterval (1 s). It
// counts only while the drain runs: the errors of stopping the forwarders (a cancelled query, a
// connection closed mid-statement) are not the drain's.
type countingLogger struct {
	drain   atomic.Pointer[counter] // the drain under way
	retried atomic.Int64
	errors  atomic.Int64
	mu      sync.Mutex
	first   []string // the first few distinct error messages
}

// counting reports whether the drain under way has yet to deliver its last event.
func (l *countingLogger) counting() bool {
	c := l.drain.Load()
	return c != nil && c.count() < c.target
}

func (l *countingLogger) Error(msg string, err error, _ watermill.LogFields) {
	if !l.counting() {
		return
	}
	l.errors.Add(1)
	text := msg
	if err != nil {
		text += ": " + err.Error()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.first {
		if f == text {
			return
		}
	}
	if len(l.first) < 3 {
		l.first = append(l.first, text)
	}
}

func (l *countingLogger) Debug(msg string, _ watermill.LogFields) {
	if strings.HasPrefix(msg, "Deadlock during querying message") && l.counting() {
		l.retried.Add(1)
	}
}

func (*countingLogger) Info(string, watermill.LogFields)  {}
func (*countingLogger) Trace(string, watermill.LogFields) {}

func (l *countingLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *countingLogger) notes() []string {
	var out []string
	if r := l.retried.Load(); r > 0 {
		out = append(out, fmt.Sprintf("%d subscriber queries failed on a lock conflict and were retried at once (all rounds)", r))
	}
	if e := l.errors.Load(); e > 0 {
		l.mu.Lock()
		defer l.mu.Unlock()
		out = append(out, fmt.Sprintf("%d errors logged (all rounds), e.g. %s", e, strings.Join(l.first, "; ")))
	}
	return out
}
