package outboxwatermill_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/gorm-outbox/outboxplugin/inbox"
	outboxwatermill "github.com/gorm-outbox/outboxplugin/publishers/watermill"
	"gorm.io/gorm"
)

// A router handler that takes effect once per event, however often the backend delivers it.
func ExampleMessageID() {
	var db *gorm.DB                   // the consumer's database, with the inbox table (inbox.New(db).AutoMigrate)
	var subscriber message.Subscriber // watermill-amqp's, or any backend's
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddConsumerHandler("billing", "outbox.Order", subscriber, func(msg *message.Message) error {
		id, err := outboxwatermill.MessageID(msg)
		if err != nil {
			return err // not an outbox message: with middleware.PoisonQueue, set aside
		}
		_, err = inbox.Handle(msg.Context(), db, "billing", id, func(tx *gorm.DB) error {
			return tx.Exec(`INSERT INTO invoices (order_event) VALUES (?)`, []byte(msg.Payload)).Error
		})
		return err // inbox.ErrInProgress, or the handler failed: nacked, delivered again
	})
	if err := router.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
