package outboxkafka_test

import (
	"context"
	"log"

	"github.com/gorm-outbox/outboxplugin/inbox"
	outboxkafka "github.com/gorm-outbox/outboxplugin/publishers/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"
)

// A member of a consumer group whose handler takes effect once per event, however often the group
// reads it.
func ExampleMessageID() {
	var db *gorm.DB // the consumer's database, with the inbox table (inbox.New(db).AutoMigrate)
	ctx := context.Background()

	cl, err := kgo.NewClient(
		kgo.SeedBrokers("localhost:9092"),
		kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("outbox.Order"),
		kgo.DisableAutoCommit(), // commit only what was handled
	)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		var failed error
		fetches.EachRecord(func(r *kgo.Record) {
			if failed != nil {
				return
			}
			id, err := outboxkafka.MessageID(r)
			if err != nil {
				return // not an outbox record: skip it (or copy it to a dead-letter topic)
			}
			_, failed = inbox.Handle(ctx, db, "billing", id, func(tx *gorm.DB) error {
				return tx.Exec(`INSERT INTO invoices (order_event) VALUES (?)`, r.Value).Error
			})
		})
		if failed != nil {
			// Kafka cannot redeliver one record, and committing past it would skip it: stop without
			// committing. The group re-reads from its last commit, and the inbox skips what was handled.
			log.Fatal(failed)
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			log.Fatal(err)
		}
	}
}
