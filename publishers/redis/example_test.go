package outboxredis_test

import (
	"context"
	"log"

	"github.com/gorm-outbox/outboxplugin"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// A relay that appends the events of db's outbox to Redis streams outbox:<aggregate>, each capped at
// about a million entries.
func ExampleNew() {
	var db *gorm.DB // opened by the application, with db.Use(outboxplugin.New())
	ctx := context.Background()

	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	pub, err := outboxredis.New(client, outboxredis.WithMaxLen(1_000_000))
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	worker, err := outboxplugin.NewWorker(db, pub)
	if err != nil {
		log.Fatal(err)
	}
	if err := worker.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Routing by event type instead of aggregate, and only into streams provisioned beforehand.
func ExampleWithStream() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	_, err := outboxredis.New(client,
		outboxredis.WithStream(func(m outboxplugin.Message) string {
			_, event := outboxplugin.RouteTokens(m)
			return "events:" + event
		}),
		outboxredis.WithNoMkStream())
	if err != nil {
		log.Fatal(err)
	}
}
