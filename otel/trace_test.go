package outboxotel_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorm-outbox/outboxplugin"
	outboxotel "github.com/gorm-outbox/outboxplugin/otel"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
)

// One trace runs from a handler's span, through the GORM write that captures the event, to the
// publish to JetStream and the consumer that reads it there.
func TestTraceFromHandlerToConsumer(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			exporter := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			tracer := tp.Tracer("test")

			db := openDB(t, d, outboxplugin.WithContextHeaders(outboxotel.ContextHeaders()))
			js, stream, subject := jetStream(t)
			natsPub, err := outboxnats.New(js, outboxnats.WithSubject(subject))
			require.NoError(t, err)
			pub := outboxotel.WrapPublisher(natsPub, outboxotel.WithTracerProvider(tp),
				outboxotel.WithMessagingSystem("nats"), outboxotel.WithDestination(subject))

			// The handler: its span is in the context of the GORM call.
			ctx, handler := tracer.Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
			order := Order{Total: 42}
			require.NoError(t, db.WithContext(ctx).Create(&order).Error)
			handler.End()

			var stored outboxplugin.OutboxEvent
			require.NoError(t, db.Where("event_type = ?", "Order_create").First(&stored).Error)
			var storedHeaders map[string]string
			require.NoError(t, json.Unmarshal(stored.Headers, &storedHeaders))
			assert.Contains(t, storedHeaders["traceparent"], handler.SpanContext().SpanID().String(),
				"the event stores the handler's span as its trace parent")

			stopWorker := runWorker(t, db, pub)

			// The consumer: continues the trace from the message's headers.
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cons, err := stream.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{})
			require.NoError(t, err)
			msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
			require.NoError(t, err)
			remote := propagation.TraceContext{}.Extract(context.Background(), natsHeaders(msg.Headers()))
			_, consumer := tracer.Start(remote, "process "+msg.Subject(), trace.WithSpanKind(trace.SpanKindConsumer))
			consumer.End()
			// The consumer may get the message before the publish's acknowledgement ends its span: once
			// the worker has stopped, its Publish calls have returned.
			stopWorker()

			spans := exporter.GetSpans()
			byName := map[string]tracetest.SpanStub{}
			for _, s := range spans {
				byName[s.Name] = s
			}
			require.Len(t, spans, 3, "handler, publish, consumer: %v", byName)
			publishName := "publish " + msg.Subject()
			require.Contains(t, byName, publishName)
			publish := byName[publishName]
			consume := byName["process "+msg.Subject()]

			traceID := handler.SpanContext().TraceID()
			for _, s := range spans {
				assert.Equal(t, traceID, s.SpanContext.TraceID(), "span %q is in the handler's trace", s.Name)
			}
			assert.Equal(t, handler.SpanContext().SpanID(), publish.Parent.SpanID(), "the publish is a child of the handler's span")
			assert.True(t, publish.Parent.IsRemote(), "read back from the event's headers")
			assert.Equal(t, trace.SpanKindProducer, publish.SpanKind)
			assert.Equal(t, publish.SpanContext.SpanID(), consume.Parent.SpanID(), "the consumer is a child of the publish")

			attrs := attribute.NewSet(publish.Attributes...)
			for key, want := range map[attribute.Key]string{
				"messaging.system":           "nats",
				"messaging.operation.type":   "send",
				"messaging.operation.name":   "publish",
				"messaging.destination.name": msg.Subject(),
				"messaging.message.id":       msg.Headers().Get(outboxplugin.HeaderID),
				"outbox.event.type":          "Order_create",
			} {
				got, ok := attrs.Value(key)
				if assert.True(t, ok, "attribute %s", key) {
					assert.Equal(t, want, got.Emit(), "attribute %s", key)
				}
			}
			assert.Equal(t, stored.MessageID, msg.Headers().Get(outboxplugin.HeaderID))
		})
	}
}
