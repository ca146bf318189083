package outboxrabbitmq_test

import (
	"context"
	"log"

	"github.com/gorm-outbox/outboxplugin/inbox"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"
)

// A queue consumer whose handler takes effect once per event, however often RabbitMQ delivers it.
func ExampleMessageID() {
	var db *gorm.DB      // the consumer's database, with the inbox table (inbox.New(db).AutoMigrate)
	var ch *amqp.Channel // a channel of the consumer's connection
	ctx := context.Background()

	deliveries, err := ch.Consume("billing", "billing", false, false, false, false, nil) // manual acknowledgements
	if err != nil {
		log.Fatal(err)
	}
	for d := range deliveries {
		id, err := outboxrabbitmq.MessageID(d)
		if err != nil {
			_ = d.Reject(false) // not an outbox message: to the queue's dead-letter exchange, if it has one
			continue
		}
		_, err = inbox.Handle(ctx, db, "billing", id, func(tx *gorm.DB) error {
			return tx.Exec(`INSERT INTO invoices (order_event) VALUES (?)`, d.Body).Error
		})
		if err != nil { // inbox.ErrInProgress, or the handler failed: back to the queue
			_ = d.Nack(false, true)
			continue
		}
		_ = d.Ack(false) // handled now, or by an earlier delivery
	}
}
