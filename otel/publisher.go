package outboxotel

import (
	"context"
	"errors"
	"maps"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorm-outbox/outboxplugin"
)

// Attributes of this package's own, beside the messaging semantic conventions.
const (
	// EventTypeKey is the event's type (outboxplugin.Message.EventType), on spans and metrics.
	EventTypeKey = attribute.Key("outbox.event.type")
	// AttemptKey is the delivery's attempt (outboxplugin.Message.Attempt, 1 on the first), on spans.
	AttemptKey = attribute.Key("outbox.attempt")
)

// Values of the error.type attribute, on spans and metrics: what the worker makes of a failure.
const (
	// ErrorRefused: the broker refused the message; the retry spends an attempt, and after the last
	// the event is dead.
	ErrorRefused = "refused"
	// ErrorNotDelivered: the broker did not get the message (unavailable, a lost connection, a
	// timeout, or the whole batch failed); it is retried without spending an attempt.
	ErrorNotDelivered = "not_delivered"
)

// operationName is the messaging.operation.name of a publish, and the first word of its span's name.
const operationName = "publish"

// WrapPublisher returns a Publisher that traces each message pub publishes. For every message of a
// batch it starts a span of kind PRODUCER, named "publish" (or "publish <destination>" with
// WithDestination), whose parent is the trace context in the message's headers — the one
// ContextHeaders stored when the event was written — or, for a message without one, the span of the
// worker's context, if any. It then hands pub the messages with that span's context written into a
// copy of their headers (traceparent and tracestate with the default propagator), so that a consumer
// that extracts it continues the trace as a child of the publish. The messages and header maps of the
// caller are not modified.
//
// The spans end when pub returns; a message pub failed (named in an *outboxplugin.PublishError, or
// every message when the whole batch failed) ends with status Error, the error recorded, and
// error.type ErrorRefused or ErrorNotDelivered. pub's error is returned unchanged.
//
// One span per message, not one per batch with links: a batch holds events written by many requests,
// each its own trace, and only a span inside each trace lets its consumer continue that trace (a batch
// span would start a new trace, and every consumer would continue that one instead). The spans of a
// batch all last the batch's publish.
//
// WithTracerProvider, WithPropagator, WithMessagingSystem and WithDestination apply.
func WrapPublisher(pub outboxplugin.Publisher, opts ...Option) outboxplugin.Publisher {
	c := newConfig(opts)
	p := &tracingPublisher{
		next:        pub,
		tracer:      c.tracerProvider.Tracer(ScopeName),
		propagator:  c.propagator,
		destination: c.destination,
		attrs: []attribute.KeyValue{
			semconv.MessagingOperationName(operationName),
			semconv.MessagingOperationTypeSend,
		},
	}
	if c.system != "" {
		p.attrs = append(p.attrs, semconv.MessagingSystemKey.String(c.system))
	}
	return p
}

type tracingPublisher struct {
	next        outboxplugin.Publisher
	tracer      trace.Tracer
	propagator  propagation.TextMapPropagator
	destination func(outboxplugin.Message) string
	attrs       []attribute.KeyValue // of every span
}

// Publish publishes msgs through the wrapped publisher, one span per message.
func (p *tracingPublisher) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	out := make([]outboxplugin.Message, len(msgs))
	spans := make([]trace.Span, len(msgs))
	for i, m := range msgs {
		parent := p.propagator.Extract(ctx, propagation.MapCarrier(m.Headers))
		attrs := append(make([]attribute.KeyValue, 0, len(p.attrs)+5), p.attrs...)
		attrs = append(attrs, semconv.MessagingMessageID(m.ID), EventTypeKey.String(m.EventType), AttemptKey.Int(m.Attempt))
		if len(msgs) > 1 {
			attrs = append(attrs, semconv.MessagingBatchMessageCount(len(msgs)))
		}
		name := operationName
		if p.destination != nil {
			if dest := p.destination(m); dest != "" {
				name += " " + dest
				attrs = append(attrs, semconv.MessagingDestinationName(dest))
			}
		}
		spanCtx, span := p.tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		headers := make(map[string]string, len(m.Headers)+2)
		maps.Copy(headers, m.Headers)
		p.propagator.Inject(spanCtx, propagation.MapCarrier(headers))
		m.Headers = headers
		out[i], spans[i] = m, span
	}

	err := p.next.Publish(ctx, out)

	failed, whole := failures(err, msgs)
	for i, span := range spans {
		e := err
		if !whole {
			e = failed[msgs[i].ID]
		}
		if e != nil {
			kind := ErrorRefused
			if whole || errors.Is(e, outboxplugin.ErrBrokerUnavailable) {
				kind = ErrorNotDelivered
			}
			span.RecordError(e)
			span.SetStatus(codes.Error, e.Error())
			span.SetAttributes(semconv.ErrorTypeKey.String(kind))
		}
		span.End()
	}
	return err
}

// failures reads err as the worker does (outboxplugin.Publisher): nil is no failure, a PublishError
// that names a message of the batch fails those it names, anything else fails the whole batch.
func failures(err error, msgs []outboxplugin.Message) (failed map[string]error, whole bool) {
	if err == nil {
		return nil, false
	}
	var pe *outboxplugin.PublishError
	if !errors.As(err, &pe) {
		return nil, true
	}
	for _, m := range msgs {
		if _, ok := pe.Failed[m.ID]; ok {
			return pe.Failed, false
		}
	}
	return nil, true
}
