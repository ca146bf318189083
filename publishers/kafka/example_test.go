package outboxkafka_test

import (
	"context"
	"log"

	"github.com/gorm-outbox/outboxplugin"
	outboxkafka "github.com/gorm-outbox/outboxplugin/publishers/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"
)

// The client options an outbox wants, and a worker relaying the outbox of db to Kafka.
func ExampleNew() {
	var db *gorm.DB // opened with db.Use(outboxplugin.New()) and migrated with outboxplugin.AutoMigrate
	ctx := context.Background()

	client, err := kgo.NewClient(
		kgo.SeedBrokers("localhost:9092"),
		kgo.RequiredAcks(kgo.AllISRAcks()),       // the default: acknowledged by every in-sync replica
		kgo.AllowIdempotentProduceCancellation(), // a timed-out publish stops retrying; the worker retries it
	)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close() // after the worker has stopped

	pub, err := outboxkafka.New(client)
	if err != nil {
		log.Fatal(err)
	}
	worker, err := outboxplugin.NewWorker(db, pub)
	if err != nil {
		log.Fatal(err)
	}
	if err := worker.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
