package outboxotel

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
)

// ContextHeaders returns the function for outboxplugin.WithContextHeaders that writes the trace
// context of the GORM call's context into the headers of the events it writes: with the default
// propagator, traceparent and (when the context has trace state) tracestate, in the W3C Trace Context
// format. A context without a valid span context gives no headers. Only WithPropagator applies.
func ContextHeaders(opts ...Option) func(context.Context) map[string]string {
	prop := newConfig(opts).propagator
	return func(ctx context.Context) map[string]string {
		carrier := propagation.MapCarrier{}
		prop.Inject(ctx, carrier)
		if len(carrier) == 0 {
			return nil
		}
		return carrier
	}
}
