package outboxrabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// brokerURL is the RabbitMQ the tests use: OUTBOX_RABBITMQ_URL, or the CI service.
func brokerURL() string {
	if u := os.Getenv("OUTBOX_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// brokerAddr is the host:port of brokerURL.
func brokerAddr(tb testing.TB) string {
	u, err := amqp.ParseURI(brokerURL())
	if err != nil {
		tb.Fatal(err)
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

// viaProxy is brokerURL with its address replaced by addr.
func viaProxy(tb testing.TB, addr string) string {
	u, err := amqp.ParseURI(brokerURL())
	if err != nil {
		tb.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	u.Host = host
	u.Port = atoi(tb, port)
	return u.String()
}

func atoi(tb testing.TB, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// unique returns prefix with a random suffix, for names no other test or run uses.
func unique(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "." + hex.EncodeToString(b)
}

// openDB opens a fresh SQLite outbox database in the test's temporary directory.
func openDB(tb testing.TB) *gorm.DB {
	tb.Helper()
	db, err := gorm.Open(sqlite.Open(filepath.Join(tb.TempDir(), "outbox.db")+"?_busy_timeout=5000&_journal_mode=WAL"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	if err := outboxplugin.AutoMigrate(db); err != nil {
		tb.Fatal(err)
	}
	return db
}

// broker is a connection of the test's own to RabbitMQ, to declare, inspect and consume.
type broker struct {
	tb   testing.TB
	conn *amqp.Connection
	ch   *amqp.Channel
}

func newBroker(tb testing.TB) *broker {
	tb.Helper()
	outboxtest.RequireBroker(tb, "RabbitMQ", brokerAddr(tb))
	conn, err := amqp.Dial(brokerURL())
	if err != nil {
		tb.Fatalf("RabbitMQ at %s: %v", brokerURL(), err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		tb.Fatal(err)
	}
	b := &broker{tb: tb, conn: conn, ch: ch}
	tb.Cleanup(func() { conn.Close() })
	return b
}

// channel opens another channel, for an operation that may close it.
func (b *broker) channel() *amqp.Channel {
	b.tb.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		b.tb.Fatal(err)
	}
	return ch
}

// exchange names a fresh topic exchange, deleted when the test ends. It is not declared: the
// publisher's default topology does that.
func (b *broker) exchange() string {
	name := rabbitName("exchange")
	b.tb.Cleanup(func() {
		b.delete(func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) }, "exchange "+name)
	})
	return name
}

// delete runs del on a channel of its own (the broker closes a channel on an error, and the test's
// may be closed by now), failing the test if it fails. The connection is closed after: newBroker
// registered its closing first, and cleanups run last first.
func (b *broker) delete(del func(*amqp.Channel) error, what string) {
	ch, err := b.conn.Channel()
	if err == nil {
		err = del(ch)
		ch.Close()
	}
	if err != nil {
		b.tb.Errorf("delete %s: %v", what, err)
	}
}

// queue declares a fresh durable queue with args bound to exchange (declared as a durable topic
// exchange, as the default topology does) by each pattern; both are deleted when the test ends.
func (b *broker) queue(exchange string, args amqp.Table, patterns ...string) string {
	b.tb.Helper()
	if err := b.ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		b.tb.Fatal(err)
	}
	name := rabbitName("queue")
	b.tb.Cleanup(func() {
		b.delete(func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(name, false, false, false)
			return err
		}, "queue "+name)
	})
	q, err := b.ch.QueueDeclare(name, true, false, false, false, args)
	if err != nil {
		b.tb.Fatal(err)
	}
	for _, p := range patterns {
		if err := b.ch.QueueBind(q.Name, p, exchange, false, nil); err != nil {
			b.tb.Fatal(err)
		}
	}
	return q.Name
}

// receive consumes n deliveries from queue, failing the test when they do not arrive in time.
func (b *broker) receive(queue string, n int, within time.Duration) []amqp.Delivery {
	b.tb.Helper()
	ch := b.channel()
	defer ch.Close()
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		b.tb.Fatal(err)
	}
	var got []amqp.Delivery
	timeout := time.After(within)
	for len(got) < n {
		select {
		case d := <-deliveries:
			got = append(got, d)
		case <-timeout:
			b.tb.Fatalf("received %d of %d messages from %s", len(got), n, queue)
		}
	}
	return got
}

// count returns the number of messages ready in queue.
func (b *broker) count(queue string) int {
	b.tb.Helper()
	q, err := b.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		b.tb.Fatal(err)
	}
	return q.Messages
}

// ids returns the message ids of deliveries.
func ids(deliveries []amqp.Delivery) []string {
	out := make([]string, len(deliveries))
	for i, d := range deliveries {
		out[i] = d.MessageId
	}
	return out
}

// testMessages returns n messages of aggregateType with fresh IDs.
func testMessages(n int, aggregateType string) []outboxplugin.Message {
	msgs := make([]outboxplugin.Message, n)
	now := time.Now().UTC()
	for i := range msgs {
		id := strconv.Itoa(i)
		msgs[i] = outboxplugin.Message{
			ID:            unique("msg"),
			EventType:     aggregateType + "_create",
			Key:           aggregateType + ":" + id,
			AggregateType: aggregateType,
			AggregateID:   id,
			Payload:       []byte(`{"id":` + id + `}`),
			CreatedAt:     now,
			Attempt:       1,
		}
	}
	return msgs
}

// withTimeout is a context for one test step.
func withTimeout(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}
