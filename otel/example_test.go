package outboxotel_test

import (
	"context"
	"fmt"
	"log"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	outboxotel "github.com/gorm-outbox/outboxplugin/otel"
)

// The worker's metrics go to the global MeterProvider, which the application sets up with the SDK and
// an exporter (Prometheus, OTLP) before making the Observer.
func ExampleNewObserver() {
	var (
		db  *gorm.DB               // with the plugin registered
		pub outboxplugin.Publisher // outboxnats.New(js), outboxkafka.New(client) …
	)
	obs, err := outboxotel.NewObserver(outboxotel.WithMessagingSystem("nats"))
	if err != nil {
		log.Fatal(err)
	}
	worker, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	_ = worker.Run(context.Background())
}

// The plugin stores the trace context of each write's context in its events; the wrapped publisher
// publishes each event in a span of that trace, and sends the span's context on to the consumer.
func ExampleWrapPublisher() {
	var (
		db  *gorm.DB
		pub outboxplugin.Publisher
	)
	if err := db.Use(outboxplugin.New(outboxplugin.WithContextHeaders(outboxotel.ContextHeaders()))); err != nil {
		log.Fatal(err)
	}
	worker, err := outboxplugin.NewWorker(db, outboxotel.WrapPublisher(pub, outboxotel.WithMessagingSystem("nats")))
	if err != nil {
		log.Fatal(err)
	}
	_ = worker.Run(context.Background())
}

// ContextHeaders gives the headers of the span in a context.
func ExampleContextHeaders() {
	otel.SetTracerProvider(sdktrace.NewTracerProvider())
	ctx, span := otel.Tracer("handler").Start(context.Background(), "POST /orders")
	defer span.End()

	headers := outboxotel.ContextHeaders()(ctx)
	for name := range headers {
		fmt.Println(name)
	}
	fmt.Println(len(outboxotel.ContextHeaders()(context.Background())))
	// Output:
	// traceparent
	// 0
}
