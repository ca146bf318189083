package outboxnats_test

import (
	"context"
	"log"
	"time"

	"github.com/gorm-outbox/outboxplugin/inbox"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/gorm"
)

// A durable consumer whose handler takes effect once per event, however often JetStream delivers it.
func ExampleMessageID() {
	var db *gorm.DB             // the consumer's database, with the inbox table (inbox.New(db).AutoMigrate)
	var stream jetstream.Stream // a stream capturing the publisher's subjects, outbox.>
	ctx := context.Background()

	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 10,
	})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		id, err := outboxnats.MessageID(msg)
		if err != nil {
			_ = msg.TermWithReason("no message id") // not an outbox message: never redeliver it
			return
		}
		_, err = inbox.Handle(ctx, db, "billing", id, func(tx *gorm.DB) error {
			return tx.Exec(`INSERT INTO invoices (order_event) VALUES (?)`, msg.Data()).Error
		})
		if err != nil { // inbox.ErrInProgress, or the handler failed: deliver it again later
			_ = msg.NakWithDelay(time.Second)
			return
		}
		_ = msg.Ack() // handled now, or by an earlier delivery
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
	<-ctx.Done()
}
