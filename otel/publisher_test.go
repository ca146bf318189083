package outboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorm-outbox/outboxplugin"
	outboxotel "github.com/gorm-outbox/outboxplugin/otel"
)

func newTracer(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exporter
}

func TestContextHeaders(t *testing.T) {
	tp, _ := newTracer(t)
	ctx, span := tp.Tracer("test").Start(context.Background(), "handler")
	defer span.End()
	state, err := trace.ParseTraceState("vendor=value")
	require.NoError(t, err)

	t.Run("trace context", func(t *testing.T) {
		h := outboxotel.ContextHeaders()(ctx)
		sc := span.SpanContext()
		assert.Equal(t, map[string]string{"traceparent": fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())}, h)
	})
	t.Run("trace state", func(t *testing.T) {
		withState := trace.ContextWithSpanContext(ctx, span.SpanContext().WithTraceState(state))
		assert.Equal(t, "vendor=value", outboxotel.ContextHeaders()(withState)["tracestate"])
	})
	t.Run("no span", func(t *testing.T) {
		assert.Nil(t, outboxotel.ContextHeaders()(context.Background()), "no headers for a context without a span")
	})
	t.Run("propagator", func(t *testing.T) {
		member, err := baggage.NewMember("tenant", "7")
		require.NoError(t, err)
		bag, err := baggage.New(member)
		require.NoError(t, err)
		h := outboxotel.ContextHeaders(outboxotel.WithPropagator(propagation.Baggage{}))(baggage.ContextWithBaggage(ctx, bag))
		assert.Equal(t, map[string]string{"baggage": "tenant=7"}, h)
	})
}

// recording is a Publisher that keeps the messages it was given and returns err.
type recording struct {
	got []outboxplugin.Message
	err error
}

func (r *recording) Publish(_ context.Context, msgs []outboxplugin.Message) error {
	r.got = msgs
	return r.err
}

func TestWrapPublisher(t *testing.T) {
	tp, exporter := newTracer(t)
	writer, writeSpan := tp.Tracer("test").Start(context.Background(), "write")
	writeSpan.End()
	stored := outboxotel.ContextHeaders()(writer)
	stored["other"] = "kept"
	msgs := []outboxplugin.Message{
		{ID: "m1", EventType: "A", Headers: stored, Attempt: 1},
		{ID: "m2", EventType: "B", Attempt: 2},
	}

	cases := map[string]struct {
		err       error
		wantError map[string]string // message id -> error.type of its span
	}{
		"accepted":            {},
		"one refused":         {err: &outboxplugin.PublishError{Failed: map[string]error{"m2": errors.New("too large")}}, wantError: map[string]string{"m2": outboxotel.ErrorRefused}},
		"one unavailable":     {err: outboxplugin.FailedMessages(map[string]error{"m1": fmt.Errorf("x: %w", outboxplugin.ErrBrokerUnavailable)}), wantError: map[string]string{"m1": outboxotel.ErrorNotDelivered}},
		"whole batch":         {err: errors.New("connection lost"), wantError: map[string]string{"m1": outboxotel.ErrorNotDelivered, "m2": outboxotel.ErrorNotDelivered}},
		"naming none of them": {err: outboxplugin.FailedMessages(map[string]error{"zz": errors.New("?")}), wantError: map[string]string{"m1": outboxotel.ErrorNotDelivered, "m2": outboxotel.ErrorNotDelivered}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			exporter.Reset()
			inner := &recording{err: tc.err}
			pub := outboxotel.WrapPublisher(inner, outboxotel.WithTracerProvider(tp), outboxotel.WithMessagingSystem("nats"),
				outboxotel.WithDestination(func(m outboxplugin.Message) string { return "orders." + m.EventType }))
			err := pub.Publish(context.Background(), msgs)
			assert.Equal(t, tc.err, err, "the wrapped publisher's error, unchanged")

			spans := exporter.GetSpans()
			require.Len(t, spans, 2)
			require.Len(t, inner.got, 2)
			for i, s := range spans {
				m := msgs[i]
				assert.Equal(t, "publish orders."+m.EventType, s.Name)
				assert.Equal(t, trace.SpanKindProducer, s.SpanKind)
				attrs := attribute.NewSet(s.Attributes...)
				id, _ := attrs.Value("messaging.message.id")
				assert.Equal(t, m.ID, id.AsString())
				count, _ := attrs.Value("messaging.batch.message_count")
				assert.EqualValues(t, 2, count.AsInt64())

				// The span's context goes on in the headers; the caller's headers are untouched.
				sent := inner.got[i].Headers
				assert.Equal(t, fmt.Sprintf("00-%s-%s-01", s.SpanContext.TraceID(), s.SpanContext.SpanID()), sent["traceparent"])
				if want, failed := tc.wantError[m.ID]; failed {
					assert.Equal(t, codes.Error, s.Status.Code)
					et, _ := attrs.Value("error.type")
					assert.Equal(t, want, et.AsString())
					assert.Len(t, s.Events, 1, "the error recorded")
				} else {
					assert.Equal(t, codes.Unset, s.Status.Code)
					_, has := attrs.Value("error.type")
					assert.False(t, has)
				}
			}
			assert.Equal(t, writeSpan.SpanContext().SpanID(), spans[0].Parent.SpanID(), "child of the stored context")
			assert.Equal(t, writeSpan.SpanContext().TraceID(), spans[0].SpanContext.TraceID())
			assert.False(t, spans[1].Parent.IsValid(), "a message without trace context starts a trace")
			assert.Equal(t, "kept", inner.got[0].Headers["other"])
			assert.Equal(t, outboxotel.ContextHeaders()(writer)["traceparent"], msgs[0].Headers["traceparent"], "the caller's map is not modified")
			assert.Nil(t, msgs[1].Headers)
		})
	}
}
