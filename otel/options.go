package outboxotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorm-outbox/outboxplugin"
)

// ScopeName is the instrumentation scope of the meter and tracer this package uses.
const ScopeName = "github.com/gorm-outbox/outboxplugin/otel"

// Option configures NewObserver, ContextHeaders and WrapPublisher. Each reads the options that
// concern it and ignores the others, so that one list can be passed to all three.
type Option func(*config)

type config struct {
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
	propagator     propagation.TextMapPropagator
	system         string
	destination    func(outboxplugin.Message) string
}

func newConfig(opts []Option) config {
	c := config{propagator: propagation.TraceContext{}}
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	// The global providers are read when the observer or publisher is made, not when the package is
	// loaded, so that an SDK installed before that call is the one used.
	if c.meterProvider == nil {
		c.meterProvider = otel.GetMeterProvider()
	}
	if c.tracerProvider == nil {
		c.tracerProvider = otel.GetTracerProvider()
	}
	return c
}

// WithMeterProvider sets the MeterProvider of NewObserver (default otel.GetMeterProvider() at the
// time of the call). A nil provider keeps the default.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// WithTracerProvider sets the TracerProvider of WrapPublisher (default otel.GetTracerProvider() at
// the time of the call). A nil provider keeps the default.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// WithPropagator sets how ContextHeaders writes a context into the event's headers and how
// WrapPublisher reads it back and writes its span's context (default propagation.TraceContext{}:
// the traceparent and tracestate headers). The default is not the global propagator, which is a
// no-op until the application sets one: events would silently carry no trace. A nil propagator keeps
// the default.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) {
		if p != nil {
			c.propagator = p
		}
	}
}

// WithMessagingSystem sets the messaging.system attribute of the metrics and spans ("kafka",
// "rabbitmq", "nats", "redis" …). Without it the attribute is left out.
func WithMessagingSystem(name string) Option {
	return func(c *config) { c.system = name }
}

// WithDestination gives WrapPublisher the destination a message is published to (the same function
// the publisher routes with, such as outboxnats.DefaultSubject): it becomes the span's
// messaging.destination.name attribute and the end of its name ("publish outbox.User.User_create").
// The function must be safe for concurrent use. Without it the span is named "publish" and has no
// destination.
func WithDestination(fn func(outboxplugin.Message) string) Option {
	return func(c *config) { c.destination = fn }
}
