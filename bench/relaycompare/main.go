// Command relaycompare measures how fast outboxplugin's relay drains an outbox backlog, against a
// hand-written SKIP LOCKED loop and against watermill-sql's forwarder in its default and its tuned
// configuration, on PostgreSQL and MariaDB/MySQL. See README.md.
//
//	go run ./bench/relaycompare -db both -events 20000 -rounds 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	var (
		which     = flag.String("db", "both", "servers to run on: postgres, mysql or both")
		events    = flag.Int("events", 20000, "events in each backlog")
		rounds    = flag.Int("rounds", 3, "rounds; each runs every variant once")
		consumers = flag.Int("workers", 1, "raw loops, workers or forwarders draining at once")
		batch     = flag.Int("worker-batch", 0, "when not 0, also run the worker with WithBatchSize of this many events (variant worker_batch<N>)")
		pgDSN     = flag.String("postgres-dsn", envOr("OUTBOX_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"),
			"PostgreSQL server (a database of this run is created on it); also OUTBOX_POSTGRES_DSN")
		myDSN = flag.String("mysql-dsn", envOr("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/"),
			"MariaDB/MySQL server (a database of this run is created on it); also OUTBOX_MYSQL_DSN")
	)
	flag.Parse()
	targets := map[string][]target{
		"postgres": {{postgresKind, *pgDSN}},
		"mysql":    {{mysqlKind, *myDSN}},
		"both":     {{postgresKind, *pgDSN}, {mysqlKind, *myDSN}},
	}[*which]
	if targets == nil {
		fmt.Fprintf(os.Stderr, "relaycompare: -db %q: want postgres, mysql or both\n", *which)
		os.Exit(2)
	}
	cfg := config{events: *events, rounds: *rounds, consumers: *consumers, workerBatch: *batch}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "relaycompare:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C ends the program at once, without dropping the databases
	}()
	if err := run(ctx, targets, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "relaycompare:", err)
		os.Exit(1)
	}
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

// target is one server to run on.
type target struct {
	kind string
	dsn  string
}

func (c config) validate() error {
	switch {
	case c.events < 1:
		return fmt.Errorf("-events %d: want at least 1", c.events)
	case c.rounds < 1:
		return fmt.Errorf("-rounds %d: want at least 1", c.rounds)
	case c.consumers < 1:
		return fmt.Errorf("-workers %d: want at least 1", c.consumers)
	case c.workerBatch < 0:
		return fmt.Errorf("-worker-batch %d: want a batch size, or 0 for none", c.workerBatch)
	}
	return nil
}

// run compares on each target in turn and prints each one's report as it ends. A server that fails
// does not stop the others; the errors are returned together.
func run(ctx context.Context, targets []target, cfg config, out io.Writer) error {
	var errs []error
	for _, t := range targets {
		res, err := runOn(ctx, t, cfg)
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		writeReport(out, res)
	}
	return errors.Join(errs...)
}

// runOn runs the comparison in a database of its own on the target's server, and drops it.
func runOn(ctx context.Context, t target, cfg config) (_ *result, err error) {
	s, err := openServer(ctx, t.kind, t.dsn)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, s.close()) }()
	return compare(ctx, s, cfg)
}
