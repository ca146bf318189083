// Package outboxotel instruments the outbox with OpenTelemetry: metrics of the relay, and a trace
// that runs from the code that wrote an event, through its publish, to the consumer that reads it.
//
// Metrics come from an Observer for the worker:
//
//	obs, err := outboxotel.NewObserver(outboxotel.WithMessagingSystem("nats"))
//	worker, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithObserver(obs))
//
// Traces take two pieces. ContextHeaders makes the plugin store the W3C trace context of each GORM
// call's context (db.WithContext(ctx)) in the headers of the events the call writes; WrapPublisher
// starts a producer span per message, a child of that stored context, and passes the span's own
// context on in the message's headers, which every publisher in publishers/ sends to the broker:
//
//	db.Use(outboxplugin.New(outboxplugin.WithContextHeaders(outboxotel.ContextHeaders())))
//	worker, err := outboxplugin.NewWorker(db, outboxotel.WrapPublisher(pub, outboxotel.WithMessagingSystem("nats")))
//
// A consumer extracts the context from the message's headers with the same propagator
// (propagation.TraceContext{} by default) and starts its span from it.
//
// The package uses the OpenTelemetry API only: the application installs the SDK (or passes its
// providers with WithMeterProvider and WithTracerProvider).
//
// Every metric, its unit and its attributes: https://github.com/gorm-outbox/outboxplugin/blob/main/otel/README.md. Alerts and runbooks built on
// them: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/operations.md.
package outboxotel
