package outboxredis_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/gorm-outbox/outboxplugin/inbox"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// A consumer of a consumer group whose handler takes effect once per event, however often the group
// delivers it.
func ExampleMessageID() {
	var db *gorm.DB // the consumer's database, with the inbox table (inbox.New(db).AutoMigrate)
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	ctx := context.Background()
	stream, group := "outbox:Order", "billing"

	for ctx.Err() == nil {
		res, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: group, Consumer: "billing-1", Streams: []string{stream, ">"}, Count: 100, Block: 5 * time.Second,
		}).Result()
		if errors.Is(err, redis.Nil) {
			continue // nothing new within Block
		}
		if err != nil {
			log.Fatal(err)
		}
		for _, m := range res[0].Messages { // and, periodically, the pending entries XAUTOCLAIM hands over
			id, err := outboxredis.MessageID(m)
			if err == nil {
				payload, _ := m.Values[outboxredis.FieldPayload].(string)
				_, err = inbox.Handle(ctx, db, group, id, func(tx *gorm.DB) error {
					return tx.Exec(`INSERT INTO invoices (order_event) VALUES (?)`, payload).Error
				})
			}
			if err != nil && !errors.Is(err, outboxredis.ErrNoMessageID) {
				continue // inbox.ErrInProgress, or the handler failed: it stays pending, to be claimed again
			}
			_ = client.XAck(ctx, stream, group, m.ID).Err() // handled now, before, or not an outbox entry
		}
	}
}
