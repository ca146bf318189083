package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// telemetry is the service's OpenTelemetry SDK: a tracer provider that sends spans to one exporter
// (stdout in main, in memory in the test), and a meter provider read by a Prometheus registry of the
// service's own, served on /metrics. Neither is installed as the global provider: each part of the
// service is given the one it uses, so two services in one process (as in the test) stay apart.
type telemetry struct {
	tracer  *sdktrace.TracerProvider
	meter   *sdkmetric.MeterProvider
	metrics http.Handler
}

func newTelemetry(spans sdktrace.SpanExporter) (*telemetry, error) {
	res := resource.NewSchemaless(semconv.ServiceName("orders"))
	registry := prometheus.NewRegistry()
	reader, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	return &telemetry{
		// Batches sent every second rather than every 5 s (the default), so that a request's spans
		// show up on stdout soon after it.
		tracer:  sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(spans, sdktrace.WithBatchTimeout(time.Second))),
		meter:   sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(reader)),
		metrics: promhttp.HandlerFor(registry, promhttp.HandlerOpts{}),
	}, nil
}

// shutdown exports the spans still buffered and stops both providers.
func (t *telemetry) shutdown(ctx context.Context) error {
	return errors.Join(t.tracer.Shutdown(ctx), t.meter.Shutdown(ctx))
}
