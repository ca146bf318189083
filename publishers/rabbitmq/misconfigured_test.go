package outboxrabbitmq_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
)

// An exchange that does not exist is a configuration error: the start check says so, naming the
// exchange and the broker; the worker's batches spend no attempt and kill no event, and its Health
// names the cause. Once the exchange exists (and a queue is bound), the events go out on their first
// attempt and Health is nil again.
func TestMissingExchange(t *testing.T) {
	ctx := withTimeout(t, 60*time.Second)
	b := newBroker(t)
	exchange := b.exchange() // not declared yet
	pub := dial(t, brokerURL(), outboxrabbitmq.WithExchange(exchange),
		outboxrabbitmq.WithTopology(func(*amqp.Channel) error { return nil })) // declares nothing

	err := pub.Check(ctx)
	require.ErrorIs(t, err, outboxplugin.ErrMisconfigured)
	assert.ErrorContains(t, err, exchange, "names the exchange")
	assert.ErrorContains(t, err, brokerAddr(t), "names the broker")

	db := openDB(t)
	require.NoError(t, db.Use(outboxplugin.New()))
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		for range 3 {
			if err := outboxplugin.Emit(tx, "Placed", map[string]int{"n": 1}, outboxplugin.WithAggregate("Order", "1")); err != nil {
				return err
			}
		}
		return nil
	}))
	w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithoutListen(), outboxplugin.WithMaxAttempts(2),
		outboxplugin.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	for range 3 { // more rounds than attempts
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&rows).Error)
	for _, r := range rows {
		assert.False(t, r.Processed)
		assert.Nil(t, r.DeadAt, "not dead")
		assert.Zero(t, r.Attempts, "no attempt spent")
	}
	require.ErrorIs(t, w.Health(), outboxplugin.ErrMisconfigured)
	assert.ErrorContains(t, w.Health(), exchange)

	queue := b.queue(exchange, nil, "#") // declares the exchange, and binds a queue
	require.NoError(t, pub.Check(ctx))
	n, err := w.ProcessOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.NoError(t, w.Health())
	require.NoError(t, db.Order("id").Find(&rows).Error)
	for _, r := range rows {
		assert.True(t, r.Processed)
		assert.Equal(t, 1, r.Attempts, "published on its first attempt")
	}
	assert.Len(t, b.receive(queue, 3, 5*time.Second), 3)
}

// A password the broker refuses is a configuration error, said as such and naming the broker, without
// the password.
func TestWrongPassword(t *testing.T) {
	newBroker(t) // skips or fails without RabbitMQ
	u, err := amqp.ParseURI(brokerURL())
	require.NoError(t, err)
	u.Password = "wrong-" + strings.ReplaceAll(unique("pw"), "-", "")
	_, err = outboxrabbitmq.Dial(u.String())
	require.Error(t, err)
	assert.ErrorIs(t, err, outboxplugin.ErrMisconfigured)
	assert.NotErrorIs(t, err, outboxplugin.ErrBrokerUnavailable)
	assert.ErrorContains(t, err, "refused the credentials")
	assert.ErrorContains(t, err, brokerAddr(t))
	assert.NotContains(t, err.Error(), u.Password)
}
