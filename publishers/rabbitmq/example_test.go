package outboxrabbitmq_test

import (
	"context"
	"log"

	"github.com/gorm-outbox/outboxplugin"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"
)

// A worker publishing every event to the exchange "orders", one routing key per aggregate and event
// (Order.Order_create), into a queue declared with the exchange.
func ExampleDial() {
	var db *gorm.DB // opened with db.Use(outboxplugin.New())
	pub, err := outboxrabbitmq.Dial("amqp://guest:guest@localhost:5672/",
		outboxrabbitmq.WithExchange("orders"),
		outboxrabbitmq.WithTopology(func(ch *amqp.Channel) error {
			if err := ch.ExchangeDeclare("orders", amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
				return err
			}
			if _, err := ch.QueueDeclare("billing", true, false, false, false, nil); err != nil {
				return err
			}
			return ch.QueueBind("billing", "Order.*", "orders", false, nil)
		}))
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	worker, err := outboxplugin.NewWorker(db, pub)
	if err != nil {
		log.Print(err)
		return
	}
	if err := worker.Run(context.Background()); err != nil {
		log.Print(err)
	}
}
