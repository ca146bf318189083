// Package outboxtest helps test and benchmark publishers: it fills an outbox table with pending events
// and drains it through a Worker, counting what was published. It depends on the core module alone;
// open the database with the driver of your choice.
package outboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
)

// FillOptions shapes the events Fill writes. The zero value writes events of 10 aggregates of type
// "Bench" with a payload of about 100 bytes into the default outbox table.
type FillOptions struct {
	Table         string            // outbox table; default outboxplugin.DefaultTableName
	AggregateType string            // default "Bench"
	EventType     string            // default "<AggregateType>_create"
	Keys          int               // distinct aggregate ids, cycled; default 10
	PayloadSize   int               // approximate payload size in bytes; default 100
	Headers       map[string]string // headers of every event; default none
}

// Fill writes n pending events, 1 000 per INSERT, and returns them in the order written (which is
// creation order). The table must exist (outboxplugin.AutoMigrate).
func Fill(ctx context.Context, db *gorm.DB, n int, o FillOptions) ([]outboxplugin.OutboxEvent, error) {
	if n < 0 {
		return nil, fmt.Errorf("outboxtest: Fill: negative count %d", n)
	}
	if o.Table == "" {
		o.Table = outboxplugin.DefaultTableName
	}
	if o.AggregateType == "" {
		o.AggregateType = "Bench"
	}
	if o.EventType == "" {
		o.EventType = o.AggregateType + "_create"
	}
	if o.Keys <= 0 {
		o.Keys = 10
	}
	if o.PayloadSize <= 0 {
		o.PayloadSize = 100
	}
	var headers outboxplugin.JSON
	if o.Headers != nil {
		h, err := json.Marshal(o.Headers)
		if err != nil {
			return nil, fmt.Errorf("outboxtest: Fill: headers: %w", err)
		}
		headers = h
	}
	pad := strings.Repeat("x", max(0, o.PayloadSize-30))
	start := time.Now().UTC()
	events := make([]outboxplugin.OutboxEvent, n)
	for i := range events {
		events[i] = outboxplugin.OutboxEvent{
			EventType:     o.EventType,
			AggregateType: o.AggregateType,
			AggregateID:   strconv.Itoa(i % o.Keys),
			Payload:       outboxplugin.JSON(`{"n":` + strconv.Itoa(i) + `,"pad":"` + pad + `"}`),
			Headers:       headers,
			CreatedAt:     start.Add(time.Duration(i) * time.Microsecond),
		}
	}
	tx := db.WithContext(outboxplugin.WithoutCapture(ctx)).Table(o.Table)
	if err := tx.CreateInBatches(events, 1000).Error; err != nil {
		return nil, fmt.Errorf("outboxtest: Fill: %w", err)
	}
	return events, nil
}

// Drain runs one Worker over db with pub until n events have been published (counted from the batches
// it reports), stops it and returns the time taken. The worker polls every millisecond and does not
// LISTEN; opts come after those defaults, and must not include WithObserver: Drain counts through an
// observer of its own, which that would replace. It fails when ctx ends first.
func Drain(ctx context.Context, db *gorm.DB, pub outboxplugin.Publisher, n int, opts ...outboxplugin.WorkerOption) (time.Duration, error) {
	return DrainWith(ctx, db, pub, n, 1, opts...)
}

// DrainWith is Drain with the given number of workers running at once.
func DrainWith(ctx context.Context, db *gorm.DB, pub outboxplugin.Publisher, n, workers int, opts ...outboxplugin.WorkerOption) (time.Duration, error) {
	if workers < 1 {
		return 0, fmt.Errorf("outboxtest: Drain: %d workers", workers)
	}
	c := &counter{target: n, all: make(chan struct{})}
	if n == 0 {
		close(c.all)
	}
	base := []outboxplugin.WorkerOption{
		outboxplugin.WithPollInterval(time.Millisecond),
		outboxplugin.WithoutListen(),
		outboxplugin.WithObserver(c),
	}
	ws := make([]*outboxplugin.Worker, workers)
	for i := range ws {
		w, err := outboxplugin.NewWorker(db, pub, append(base, opts...)...)
		if err != nil {
			return 0, fmt.Errorf("outboxtest: Drain: %w", err)
		}
		ws[i] = w
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(runCtx); err != nil {
				errs <- err
			}
		}()
	}
	var err error
	select {
	case <-c.all:
	case err = <-errs:
	case <-ctx.Done():
		err = ctx.Err()
	}
	took := time.Since(start)
	stop()
	wg.Wait()
	close(errs)
	for e := range errs {
		err = errors.Join(err, e)
	}
	if err != nil {
		return took, fmt.Errorf("outboxtest: Drain: %d of %d published: %w", c.published(), n, err)
	}
	return took, nil
}

// counter counts published events and closes all when target is reached.
type counter struct {
	outboxplugin.NopObserver
	mu     sync.Mutex
	n      int
	target int
	all    chan struct{}
}

func (c *counter) BatchDone(_ context.Context, r outboxplugin.BatchResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	before := c.n
	c.n += len(r.Published)
	if before < c.target && c.n >= c.target {
		close(c.all)
	}
}

func (c *counter) published() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// BenchBatchSize is the worker batch size a publisher's benchmark uses: OUTBOX_BENCH_BATCH when it is
// set to a positive count, def otherwise. Every publisher module reads the same variable, so that
// one setting runs them all alike.
func BenchBatchSize(tb testing.TB, def int) int {
	tb.Helper()
	v := os.Getenv("OUTBOX_BENCH_BATCH")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("OUTBOX_BENCH_BATCH=%q: want a positive count", v)
	}
	return n
}

// Messages returns the messages a worker hands its publisher for freshly filled events (their first
// attempt): for a benchmark's native loop, or to compare with what a broker received.
func Messages(events []outboxplugin.OutboxEvent) ([]outboxplugin.Message, error) {
	msgs := make([]outboxplugin.Message, len(events))
	for i, e := range events {
		var headers map[string]string
		if len(e.Headers) > 0 && string(e.Headers) != "null" {
			if err := json.Unmarshal(e.Headers, &headers); err != nil {
				return nil, fmt.Errorf("outboxtest: Messages: headers of %s: %w", e.MessageID, err)
			}
		}
		key := ""
		if e.AggregateType != "" || e.AggregateID != "" {
			key = e.AggregateType + ":" + e.AggregateID
		}
		msgs[i] = outboxplugin.Message{
			ID: e.MessageID, EventType: e.EventType, Key: key,
			AggregateType: e.AggregateType, AggregateID: e.AggregateID,
			Payload: e.Payload, Headers: headers, CreatedAt: e.CreatedAt.UTC(), Attempt: 1,
		}
	}
	return msgs, nil
}
