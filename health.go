package outboxplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// What a worker knows of its own health, for a readiness probe: whether its claims succeed, and
// whether the broker takes its batches or refuses them all for a configuration error.

// CheckingPublisher is a Publisher that can tell, before it is given any event, whether what it
// publishes to exists and whether the broker accepts its credentials: a JetStream stream for its
// subjects, a RabbitMQ exchange, a Kafka topic, a Redis login. Run calls Check when it starts, beside
// its publishing loop (never delaying a claim), with the publish timeout as its bound, and logs what
// it says:
//
//   - an error wrapping ErrMisconfigured is logged at error and reported by Health until a check
//     passes or the broker takes a batch; Run checks again every recheckInterval meanwhile;
//   - any other error (the broker does not answer) is logged at warn, and checked again likewise;
//   - nil is logged at debug, and Run checks no more.
//
// Run does not stop for a failed check: a relay that waits, says why, and recovers by itself once the
// stream is created or the password fixed is what an orchestrator can work with, where a relay that
// exits would restart in a loop, its readiness probe saying nothing more.
type CheckingPublisher interface {
	Publisher
	Check(ctx context.Context) error
}

// recheckInterval is how often Run checks a CheckingPublisher again while its check fails.
const recheckInterval = 5 * time.Second

// workerHealth is what Health reports. Its three causes are kept apart because each clears on its
// own evidence: a claim's failure by the next claim, a batch's configuration error by the next batch
// the broker takes (or a claim that finds nothing left to publish), a failed start check by a check
// that passes or a batch the broker takes.
type workerHealth struct {
	mu       sync.Mutex
	claimErr error // the latest claim failed
	pubErr   error // the broker took nothing of the latest batch, for a configuration error
	checkErr error // the latest start check found a configuration error
}

// Health returns nil while the worker works, or an error saying why it does not:
//
//   - its latest claim failed (the database does not answer, the outbox table was dropped): until a
//     claim succeeds;
//   - the broker took nothing of its latest batch and refused it for a configuration error (the
//     error wraps ErrMisconfigured, and names the destination and the broker): until the broker
//     takes a batch, or a claim finds nothing to publish;
//   - its publisher's start check (CheckingPublisher) found a configuration error: until a check
//     passes or the broker takes a batch.
//
// An ordinary outage of the broker is not reported here: it spends nothing and the worker recovers
// from it by itself; ask the broker's client whether it is connected. Health is nil before Run or
// ProcessOnce has run. It is safe to call from any goroutine, for instance from a readiness probe
// (outbox relay's /readyz serves it).
func (w *Worker) Health() error {
	h := &w.health
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.claimErr != nil:
		return h.claimErr
	case h.pubErr != nil:
		return h.pubErr
	}
	return h.checkErr
}

// noteClaim records a claim's result for Health: err, or success with n rows.
func (w *Worker) noteClaim(err error, n int) {
	h := &w.health
	h.mu.Lock()
	defer h.mu.Unlock()
	h.claimErr = err
	if err == nil && n == 0 {
		h.pubErr = nil // nothing left that the broker refuses
	}
}

// noteBatch records for Health what the broker did with a batch.
func (w *Worker) noteBatch(res BatchResult) {
	h := &w.health
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case len(res.Published) > 0:
		h.pubErr, h.checkErr = nil, nil
	case len(res.Failed) == 0:
		for _, f := range res.NotDelivered {
			if errors.Is(f.Err, ErrMisconfigured) {
				h.pubErr = f.Err
				return
			}
		}
	}
}

// checkPublisher runs the publisher's start check once (see CheckingPublisher) and reports whether
// it should run again.
func (w *Worker) checkPublisher(ctx context.Context, checker CheckingPublisher, failedBefore bool) (again bool) {
	if w.counts.published.Load() > 0 {
		return false // the broker took a batch: the configuration works
	}
	cctx, cancel := context.WithTimeout(ctx, w.cfg.publishTimeout)
	err := checker.Check(cctx)
	cancel()
	if ctx.Err() != nil {
		return false
	}
	h := &w.health
	switch {
	case err == nil:
		h.mu.Lock()
		h.checkErr = nil
		h.mu.Unlock()
		if failedBefore {
			w.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "outboxplugin: the publisher's start check passes now",
				slog.String("worker", w.owner))
		} else {
			w.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "outboxplugin: the publisher's start check passed",
				slog.String("worker", w.owner))
		}
		return false
	case errors.Is(err, ErrMisconfigured):
		err = fmt.Errorf("outboxplugin: start check: %w", err)
		h.mu.Lock()
		h.checkErr = err
		h.mu.Unlock()
		w.logMisconfigured(ctx, "outboxplugin: the publisher's start check found a configuration error; the relay runs, not ready, and checks again",
			err, slog.Duration("retry_in", recheckInterval))
	default:
		w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: the broker did not answer the publisher's start check; checking again",
			slog.String("worker", w.owner), slog.Duration("retry_in", recheckInterval), slog.Any("error", err))
	}
	return true
}

// misconfiguredLogEvery is how often one configuration error is logged at error while it lasts; in
// between, it is logged at debug.
const misconfiguredLogEvery = time.Minute

// misconfiguredLog remembers when each configuration error was last logged at error.
type misconfiguredLog struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// due reports whether the error of text is to be logged at error now, and records it if so.
func (m *misconfiguredLog) due(text string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t, ok := m.last[text]; ok && now.Sub(t) < misconfiguredLogEvery {
		return false
	}
	if m.last == nil || len(m.last) >= 256 { // bounded: a cause per subject could be many
		m.last = map[string]time.Time{}
	}
	m.last[text] = now
	return true
}

// logMisconfigured logs a configuration error at error, or at debug when the same error was logged
// at error within misconfiguredLogEvery.
func (w *Worker) logMisconfigured(ctx context.Context, msg string, err error, attrs ...slog.Attr) {
	level := slog.LevelError
	if !w.misconfigured.due(err.Error(), time.Now()) {
		level = slog.LevelDebug
	}
	w.cfg.logger.LogAttrs(ctx, level, msg, append([]slog.Attr{slog.String("worker", w.owner), slog.Any("error", err)}, attrs...)...)
}
