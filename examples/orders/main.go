// Command orders is an example service built on the outbox: an HTTP API over GORM with the plugin
// on PostgreSQL, the relay worker in the same process publishing to NATS JetStream, and a consumer
// that records a notification for each order event exactly once, de-duplicating by message id.
// Metrics are served on /metrics, traces are written to stdout, one JSON span a line.
//
//	go run ./examples/orders
//
// Flags (each with an environment variable as fallback):
//
//	-db        PostgreSQL DSN (ORDERS_DB)
//	-nats      NATS server URL (ORDERS_NATS)
//	-http      listen address (ORDERS_HTTP)
//	-stream    JetStream stream (ORDERS_STREAM)
//	-subjects  subject prefix, ending with "." (ORDERS_SUBJECTS)
//	-consumer  durable consumer name (ORDERS_CONSUMER)
//
// SIGINT or SIGTERM shuts it down gracefully; it exits 0 then.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
)

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		os.Exit(2) // flag has printed the error and the usage
	}
	cfg.Logger = logger
	// Pretty printing off: one span per line, easy to grep for a trace id.
	if cfg.Spans, err = stdouttrace.New(stdouttrace.WithWriter(os.Stdout)); err != nil {
		logger.Error("orders: trace exporter", "error", err)
		os.Exit(1)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := newApp(ctx, cfg)
	if err != nil {
		logger.Error("orders: start", "error", err)
		os.Exit(1)
	}
	if err := a.run(ctx); err != nil {
		logger.Error("orders: stopped", "error", err)
		os.Exit(1)
	}
	logger.Info("orders: stopped")
}

// parseFlags reads the flags, each defaulting to its environment variable when that is set.
func parseFlags(args []string, getenv func(string) string, output io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	fs.SetOutput(output)
	str := func(p *string, name, env, def, usage string) {
		if v := getenv(env); v != "" {
			def = v
		}
		fs.StringVar(p, name, def, fmt.Sprintf("%s (env %s)", usage, env))
	}
	str(&cfg.DB, "db", "ORDERS_DB", "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable", "PostgreSQL DSN")
	str(&cfg.NATS, "nats", "ORDERS_NATS", "nats://127.0.0.1:4222", "NATS server URL")
	str(&cfg.HTTP, "http", "ORDERS_HTTP", "127.0.0.1:8080", "HTTP listen address")
	str(&cfg.Stream, "stream", "ORDERS_STREAM", "ORDERS_EXAMPLE", "JetStream stream, created over the subject prefix")
	str(&cfg.SubjectPrefix, "subjects", "ORDERS_SUBJECTS", "orders.", "prefix of every subject published to, ending with '.'")
	str(&cfg.Consumer, "consumer", "ORDERS_CONSUMER", "orders-notifier", "durable consumer name")
	err := fs.Parse(args)
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected arguments: %q", fs.Args())
		fmt.Fprintln(output, err)
	}
	return cfg, err
}
