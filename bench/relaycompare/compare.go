package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The method: for each round, every variant in turn (round i starts at variant i mod n) gets a fresh
// backlog of the same events, untimed, and then drains it, timed, into a publisher that only
// counts; the timer stops when the publisher has counted every event.

// config is what one comparison runs.
type config struct {
	events    int // backlog per drain
	rounds    int
	consumers int // raw loops, workers or forwarders draining at once
	// workerBatch, when not 0, adds a variant worker_batch<N>: the worker with WithBatchSize(N), beside
	// the worker with its defaults.
	workerBatch int
}

// variant is one way of relaying the outbox.
type variant struct {
	name string
	// describe is the variant's configuration, for the report; empty for the raw loop and the worker.
	describe string
	// prepare drops and re-creates the variant's tables and fills them with n events (not timed).
	prepare func(ctx context.Context, n int) error
	// drain relays the backlog with that many consumers at once until all n were delivered.
	drain func(ctx context.Context, n, consumers int) (drained, error)
	// notes reports what the variant counted besides its rate (retried claims, say), or nothing.
	notes func() []string
}

// drained is what one drain did.
type drained struct {
	// events is how many events the publisher received, counted after every consumer stopped: more
	// than the backlog is a duplicate delivery.
	events int64
	// spent is the time from the start of the consumers to the delivery of the last event; stopping
	// them afterwards is not timed.
	spent time.Duration
}

// result is one database's comparison.
type result struct {
	server string
	cfg    config
	rows   []resultRow
	notes  []string
}

type resultRow struct {
	variant  string
	describe string
	rates    []float64 // events per second, one per round
}

// compare runs the comparison on one server.
func compare(ctx context.Context, s *server, cfg config) (*result, error) {
	variants, err := variantsFor(s, cfg)
	if err != nil {
		return nil, err
	}
	res := &result{server: serverLabel(s.kind), cfg: cfg, rows: make([]resultRow, len(variants))}
	for k, v := range variants {
		res.rows[k] = resultRow{variant: v.name, describe: v.describe}
	}
	for round := range cfg.rounds {
		for j := range variants {
			k := (round + j) % len(variants)
			v := variants[k]
			if err := v.prepare(ctx, cfg.events); err != nil {
				return nil, fmt.Errorf("%s: prepare %s: %w", res.server, v.name, err)
			}
			d, err := v.drain(ctx, cfg.events, cfg.consumers)
			if err != nil {
				return nil, fmt.Errorf("%s: %s, round %d: %w", res.server, v.name, round+1, err)
			}
			if d.events < int64(cfg.events) || (d.events > int64(cfg.events) && !strings.HasPrefix(v.name, "watermill")) {
				return nil, fmt.Errorf("%s: %s, round %d: delivered %d of %d events", res.server, v.name, round+1, d.events, cfg.events)
			}
			if d.events > int64(cfg.events) {
				// At-least-once: two consumers of watermill's queue schema can both deliver a row now
				// and then. Reported, not a failure; the rate counts each event once.
				res.notes = append(res.notes, fmt.Sprintf("%s, round %d: %d deliveries of %d events (duplicates)",
					v.name, round+1, d.events, cfg.events))
			}
			res.rows[k].rates = append(res.rows[k].rates, float64(cfg.events)/d.spent.Seconds())
		}
	}
	for _, v := range variants {
		if v.notes != nil {
			for _, n := range v.notes() {
				res.notes = append(res.notes, v.name+": "+n)
			}
		}
	}
	return res, nil
}

// variantsFor returns the variants in the order of the report: raw, worker, watermill_default,
// watermill_tuned, and worker_batch<N> when cfg asks for it.
func variantsFor(s *server, cfg config) ([]variant, error) {
	db, err := openGorm(s)
	if err != nil {
		return nil, err
	}
	def, tuned := watermillSetups(s.kind)
	vs := []variant{rawVariant(s, db), workerVariant(s, db, 0), watermillVariant(s, def), watermillVariant(s, tuned)}
	if cfg.workerBatch != 0 {
		vs = append(vs, workerVariant(s, db, cfg.workerBatch))
	}
	return vs, nil
}

// counter counts delivered messages and closes done once it reaches its target.
type counter struct {
	n      atomic.Int64
	target int64
	done   chan struct{}
	once   sync.Once
}

func newCounter(target int) *counter {
	return &counter{target: int64(target), done: make(chan struct{})}
}

func (c *counter) add(k int) {
	if c.n.Add(int64(k)) >= c.target {
		c.once.Do(func() { close(c.done) })
	}
}

func (c *counter) count() int64 { return c.n.Load() }

// consumer is one relay instance: run blocks until its context ends or stop is called (stop may be
// nil when cancelling the context is enough).
type consumer struct {
	run  func(ctx context.Context) error
	stop func() error
}

// errStoppedEarly is a consumer that returned before every event was delivered.
var errStoppedEarly = errors.New("a consumer stopped before every event was delivered")

// deliver runs the consumers until delivered reaches its target, ctx ends or a consumer returns;
// then it stops them all and waits for each to return.
func deliver(ctx context.Context, delivered *counter, consumers []consumer) (drained, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(consumers))
	start := time.Now()
	for _, c := range consumers {
		go func() { errs <- c.run(runCtx) }()
	}
	var first error
	pending := len(consumers)
	select {
	case <-delivered.done:
	case <-ctx.Done():
		first = fmt.Errorf("after %d of %d events: %w", delivered.count(), delivered.target, ctx.Err())
	case err := <-errs:
		pending--
		first = errStoppedEarly
		if err != nil {
			first = err
		}
	}
	spent := time.Since(start)
	cancel()
	var stopErrs []error
	for _, c := range consumers {
		if c.stop != nil {
			stopErrs = append(stopErrs, c.stop())
		}
	}
	for ; pending > 0; pending-- {
		if err := <-errs; err != nil && first == nil && !errors.Is(err, context.Canceled) {
			first = err
		}
	}
	return drained{events: delivered.count(), spent: spent}, errors.Join(first, errors.Join(stopErrs...))
}
