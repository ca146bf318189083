package outboxplugin

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"gorm.io/gorm"
)

// ErrUnsupportedDialect is returned by the worker on a database other than PostgreSQL, MySQL/MariaDB
// and SQLite.
var ErrUnsupportedDialect = errors.New("outboxplugin: unsupported database")

// Worker is the relay: it claims committed outbox events, hands them to a Publisher in batches, and
// records the outcome. Delivery is at least once: an event is marked done only after the publisher
// accepted it, so a crash in between publishes it again. Several workers, in one process or many,
// may run against the same table: claiming skips rows another worker holds.
//
// Run it from main with go worker.Run(ctx), or call ProcessOnce from a scheduler of your own.
// docs/relay.md describes the states a row goes through and the guarantees of each mode.
type Worker struct {
	db    *gorm.DB
	pub   Publisher
	cfg   workerConfig
	err   error // an invalid option, returned by every method
	owner string
	sql   *relaySQL
	wake  chan struct{}
	// pipeline: Run claims the next batch while it publishes a full one. Not with per-key ordering,
	// and only when the lease covers a batch that waits one publish timeout before its own.
	pipeline bool

	prepareMu sync.Mutex
	prepared  bool
}

type workerConfig struct {
	table           string
	batchSize       int
	pollInterval    time.Duration
	lease           time.Duration
	publishTimeout  time.Duration
	maxAttempts     int
	retry           RetryPolicy
	keyOrdering     bool
	deleteOnPublish bool
	cleanupEvery    time.Duration
	retention       time.Duration
	listen          bool
	backlogEvery    time.Duration
	logger          *slog.Logger
	observer        Observer
}

// WorkerOption configures a Worker.
type WorkerOption func(*workerConfig) error

// maxPublishBackoff caps Run's pause after a batch the broker took none of (unless the poll interval
// is longer): during an outage the worker tries again at most this often, and after it, new events
// wait at most this long.
const maxPublishBackoff = 10 * time.Second

// Defaults of the worker's options.
const (
	DefaultBatchSize      = 100
	DefaultPollInterval   = time.Second
	DefaultPublishTimeout = 30 * time.Second
	DefaultLease          = 2 * time.Minute
	DefaultMaxAttempts    = 10
	DefaultRetention      = 7 * 24 * time.Hour
	DefaultBacklogEvery   = 15 * time.Second
)

// WithBatchSize sets how many events one batch claims and publishes (default 100, at most 10000).
func WithBatchSize(n int) WorkerOption {
	return func(c *workerConfig) error {
		if n < 1 || n > 10000 {
			return fmt.Errorf("%w: batch size %d not in 1..10000", ErrInvalidOption, n)
		}
		c.batchSize = n
		return nil
	}
}

// WithPollInterval sets how long Run waits after a batch that was not full before it looks again
// (default 1 s). On PostgreSQL a notification wakes it at once when events are committed; polling
// is then only the fallback.
func WithPollInterval(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: poll interval %v", ErrInvalidOption, d)
		}
		c.pollInterval = d
		return nil
	}
}

// WithPublishTimeout bounds each call to the publisher (default 30 s): a broker that hangs costs one
// timeout, after which the batch counts as failed and is retried.
func WithPublishTimeout(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: publish timeout %v", ErrInvalidOption, d)
		}
		c.publishTimeout = d
		return nil
	}
}

// WithLease sets how long a claimed event stays reserved for the worker that claimed it (default 2
// minutes). A worker that dies leaves its events to others after at most this long. It must exceed
// the publish timeout, so that a live worker finishes its batch within its lease.
func WithLease(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: lease %v", ErrInvalidOption, d)
		}
		c.lease = d
		return nil
	}
}

// WithMaxAttempts sets how many deliveries an event gets before it is dead (default 10). Every claim
// counts, including one cut short by a crash.
func WithMaxAttempts(n int) WorkerOption {
	return func(c *workerConfig) error {
		if n < 1 {
			return fmt.Errorf("%w: max attempts %d", ErrInvalidOption, n)
		}
		c.maxAttempts = n
		return nil
	}
}

// WithRetryPolicy sets the wait between deliveries of a failing event (default DefaultRetryPolicy).
func WithRetryPolicy(p RetryPolicy) WorkerOption {
	return func(c *workerConfig) error {
		if p == nil {
			return fmt.Errorf("%w: nil retry policy", ErrInvalidOption)
		}
		c.retry = p
		return nil
	}
}

// WithKeyOrdering turns on strict per-key ordering: the events of one message key (aggregate) are
// published one after another in the order the relay sees them committed, never by two workers at
// once, and an event that fails holds back only the later events of its own key — until it is
// published, or, once dead, until it is requeued. Each batch takes at most one event per key. The
// worker creates the index this needs, (aggregate_type, aggregate_id, id) over unprocessed rows, the
// first time it runs.
func WithKeyOrdering() WorkerOption {
	return func(c *workerConfig) error {
		c.keyOrdering = true
		return nil
	}
}

// WithDeleteOnPublish deletes events once published instead of marking them processed.
func WithDeleteOnPublish() WorkerOption {
	return func(c *workerConfig) error {
		c.deleteOnPublish = true
		return nil
	}
}

// WithCleanup makes Run delete processed events older than the retention (WithRetention, default 7
// days) every interval, in bounded batches.
func WithCleanup(every time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if every <= 0 {
			return fmt.Errorf("%w: cleanup interval %v", ErrInvalidOption, every)
		}
		c.cleanupEvery = every
		return nil
	}
}

// WithRetention sets how long processed events are kept by the periodic cleanup (default 7 days).
func WithRetention(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: retention %v", ErrInvalidOption, d)
		}
		c.retention = d
		return nil
	}
}

// WithTable sets the outbox table the worker reads. By default it is the table of the plugin
// registered on the worker's *gorm.DB, or DefaultTableName.
func WithTable(name string) WorkerOption {
	return func(c *workerConfig) error {
		if !identifierRE.MatchString(name) {
			return fmt.Errorf("%w: %w: %q", ErrInvalidOption, ErrInvalidTableName, name)
		}
		c.table = name
		return nil
	}
}

// WithoutListen turns off the PostgreSQL LISTEN wake-up (for PgBouncer in transaction mode, which
// does not carry notifications); the worker then polls only.
func WithoutListen() WorkerOption {
	return func(c *workerConfig) error {
		c.listen = false
		return nil
	}
}

// WithLogger sets the worker's logger (default slog.Default()).
func WithLogger(l *slog.Logger) WorkerOption {
	return func(c *workerConfig) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// WithObserver sets an Observer that receives batch results, dead events and the backlog.
func WithObserver(o Observer) WorkerOption {
	return func(c *workerConfig) error {
		if o == nil {
			return fmt.Errorf("%w: nil observer", ErrInvalidOption)
		}
		c.observer = o
		return nil
	}
}

// WithBacklogInterval sets how often Run measures the backlog for the Observer (default 15 s).
func WithBacklogInterval(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: backlog interval %v", ErrInvalidOption, d)
		}
		c.backlogEvery = d
		return nil
	}
}

// NewWorker returns a relay that publishes the events of db's outbox table with pub. Invalid options
// make every method of the worker return an error wrapping ErrInvalidOption.
func NewWorker(db *gorm.DB, pub Publisher, opts ...WorkerOption) *Worker {
	w := &Worker{
		db:   db,
		pub:  pub,
		wake: make(chan struct{}, 1),
		cfg: workerConfig{
			table:          DefaultTableName,
			batchSize:      DefaultBatchSize,
			pollInterval:   DefaultPollInterval,
			lease:          DefaultLease,
			publishTimeout: DefaultPublishTimeout,
			maxAttempts:    DefaultMaxAttempts,
			retry:          DefaultRetryPolicy,
			retention:      DefaultRetention,
			listen:         true,
			backlogEvery:   DefaultBacklogEvery,
			logger:         slog.Default(),
			observer:       NopObserver{},
		},
		owner: workerID(),
	}
	if p := pluginOf(db); p != nil {
		w.cfg.table = p.cfg.table
	}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&w.cfg); err != nil && w.err == nil {
			w.err = err
		}
	}
	switch {
	case w.err != nil:
	case db == nil:
		w.err = fmt.Errorf("%w: nil *gorm.DB", ErrInvalidOption)
	case pub == nil:
		w.err = fmt.Errorf("%w: nil Publisher", ErrInvalidOption)
	case w.cfg.lease <= w.cfg.publishTimeout:
		w.err = fmt.Errorf("%w: lease %v must exceed the publish timeout %v", ErrInvalidOption, w.cfg.lease, w.cfg.publishTimeout)
	}
	if w.err == nil {
		w.pipeline = !w.cfg.keyOrdering && w.cfg.lease > 2*w.cfg.publishTimeout
		w.db = db.Session(&gorm.Session{NewDB: true, SkipDefaultTransaction: true})
		w.sql, w.err = newRelaySQL(w.db, w.cfg.table, w.cfg.keyOrdering, w.cfg.batchSize)
	}
	if w.err != nil {
		w.err = fmt.Errorf("outboxplugin: NewWorker: %w", w.err)
	}
	return w
}

// workerID names the worker in locked_by: host, process and a random suffix, within 64 characters.
func workerID() string {
	host, _ := os.Hostname()
	if len(host) > 32 {
		host = host[:32]
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// Owner returns the id the worker stamps on the rows it claims (the locked_by column).
func (w *Worker) Owner() string { return w.owner }

// Run relays events until ctx ends, and then returns nil, after finishing or handing back the batch
// in flight; it leaves no goroutine behind. Database and publisher errors do not stop it: they are
// logged and retried, with growing pauses while they last.
func (w *Worker) Run(ctx context.Context) error {
	if w.err != nil {
		return w.err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	listening := w.cfg.listen && w.sql.dialect == "postgres"
	if listening {
		go func() {
			defer close(done)
			w.listen(runCtx)
		}()
	} else {
		close(done)
	}
	defer func() { stop(); <-done }()

	var (
		failures    int
		nextCleanup = time.Now().Add(w.cfg.cleanupEvery)
		nextBacklog = time.Now()
		carried     *carriedBatch // published, to be marked done by the next claim
		ahead       *claimedBatch // claimed while the batch before it was being published
		pace        batchPace     // how long the latest batch took to claim and to publish
	)
	defer func() {
		if ahead != nil {
			w.releaseAhead(ctx, ahead)
		}
		if carried != nil && !carried.marked {
			w.finishCarried(ctx, carried)
		}
	}()
	for {
		if ctx.Err() != nil {
			return nil
		}
		n, publishFailed, err := w.runBatch(ctx, &carried, &ahead, &pace)
		if ctx.Err() != nil {
			return nil
		}
		wait := w.cfg.pollInterval
		switch {
		case err != nil:
			failures++
			wait = min(w.cfg.pollInterval*time.Duration(1<<min(failures, 6)), 30*time.Second+w.cfg.pollInterval)
			w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: relay batch failed",
				slog.String("worker", w.owner), slog.Int("consecutive_failures", failures), slog.Any("error", err))
		case publishFailed:
			// The broker took none of the batch: it is probably down. Back off (the failed events
			// have their own retry times), ignoring wake-ups meanwhile, so that an outage costs a
			// claim, a write and a log line now and then, not one per commit of the application.
			failures++
			wait = min(w.cfg.pollInterval*time.Duration(1<<min(failures, 6)), max(maxPublishBackoff, w.cfg.pollInterval))
			if ahead != nil {
				w.releaseAhead(ctx, ahead) // its lease would run while the worker waits
				ahead = nil
			}
		case n == w.cfg.batchSize || ahead != nil:
			failures = 0
			wait = 0 // more may be waiting
		default:
			failures = 0
		}
		now := time.Now()
		if w.cfg.cleanupEvery > 0 && !now.Before(nextCleanup) {
			nextCleanup = now.Add(w.cfg.cleanupEvery)
			if _, err := w.Cleanup(ctx, w.cfg.retention); err != nil && ctx.Err() == nil {
				w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: cleanup failed", slog.String("worker", w.owner), slog.Any("error", err))
			}
		}
		if _, nop := w.cfg.observer.(NopObserver); !nop && !now.Before(nextBacklog) {
			nextBacklog = now.Add(w.cfg.backlogEvery)
			if pending, err := w.sql.backlog(ctx); err == nil {
				w.cfg.observer.Backlog(ctx, pending)
			}
		}
		if wait == 0 {
			continue
		}
		wake := w.wake
		if failures > 0 {
			wake = nil // backing off: a notification must not cut the pause short
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-wake:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// runBatch is one turn of Run. It takes the batch claimed ahead, or claims one (marking the carried
// batch done in the same statement), publishes it and records the outcome. When the batch is full and
// the worker pipelines, the next batch is claimed — and this turn's carried batch marked — while the
// publisher works, so that the database and the broker are busy at the same time; that batch is
// published by the next turn.
func (w *Worker) runBatch(ctx context.Context, carried **carriedBatch, ahead **claimedBatch, pace *batchPace) (published int, publishFailed bool, err error) {
	c := *ahead
	*ahead = nil
	if c == nil {
		c, err = w.claimAndMark(ctx, carried)
		if err != nil || len(c.rows) == 0 {
			return 0, false, err
		}
	}
	// failedWhole tells Run that the broker took nothing: a batch that failed as a whole, not
	// one cut short by shutdown.
	failedWhole := func(pubErr error, n int) bool { return pubErr != nil && n == 0 && ctx.Err() == nil }
	// A batch claimed ahead leaves the batch before it carried: the claim made while this one is
	// published marks it, even when this batch is short — unless the publisher has become too fast
	// for the overlap to pay.
	if !w.pipeline || (*carried == nil && len(c.rows) < w.cfg.batchSize) || !pace.overlapPays() {
		if *carried != nil {
			// This batch was claimed ahead, and no claim will run while it is published to mark
			// the one before it: mark that one now.
			w.finishCarried(ctx, *carried)
			*carried = nil
		}
		pubErr := w.publishBatch(ctx, c)
		*pace = batchPace{c.res.ClaimDuration, c.res.PublishDuration}
		n, next, err := w.completeBatch(ctx, c, pubErr, true)
		*carried = next
		return n, failedWhole(pubErr, n), err
	}
	pubDone := make(chan error, 1)
	go func() { pubDone <- w.publishBatch(ctx, c) }()
	next, claimErr := w.claimAndMark(ctx, carried)
	pubErr := <-pubDone
	*pace = batchPace{c.res.ClaimDuration, c.res.PublishDuration}
	if claimErr == nil && len(next.rows) > 0 {
		*ahead = next
	}
	n, done, err := w.completeBatch(ctx, c, pubErr, true)
	*carried = done
	if err == nil && claimErr != nil {
		err = claimErr
	}
	return n, failedWhole(pubErr, n), err
}

// overlapMin is the least share of a claim's time that publishing must take for Run to claim ahead.
// Below it the overlap saves little, and costs the other workers on the table: a batch claimed ahead
// is leased rows that their claims must step over. A publisher that does nothing takes microseconds
// against a claim's milliseconds; a broker's round trip takes far more than an eighth of a claim.
const overlapMin = 8

// batchPace is how long Run's latest batch took to claim and to publish.
type batchPace struct{ claim, publish time.Duration }

// overlapPays reports whether the latest batch took long enough to publish that claiming the next one
// meanwhile pays; before any batch, it assumes so.
func (p batchPace) overlapPays() bool {
	return p.claim == 0 || p.publish*overlapMin >= p.claim
}

// claimAndMark claims a batch, marking *carried done with it; when the claim fails, *carried is
// marked on its own.
func (w *Worker) claimAndMark(ctx context.Context, carried **carriedBatch) (*claimedBatch, error) {
	prev := *carried
	*carried = nil
	c, err := w.claimBatch(ctx, prev)
	if prev != nil && !prev.marked {
		w.finishCarried(ctx, prev) // the claim that was to mark it failed
	}
	return c, err
}

// releaseAhead hands back a batch that was claimed ahead but not published, when Run stops.
func (w *Worker) releaseAhead(ctx context.Context, c *claimedBatch) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := w.sql.release(fctx, w.sql.db, w.owner, rowIDs(c.rows)); err != nil {
		// The rows come back when their lease runs out.
		w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: could not hand back claimed events; they wait for their lease to run out",
			slog.String("worker", w.owner), slog.Int("events", len(c.rows)), slog.Any("error", err))
		return
	}
	c.res.Released = len(c.rows)
	w.cfg.observer.BatchDone(ctx, c.res)
}

// Wake makes a waiting Run look for events at once. Applications that know they just committed
// events (on databases without LISTEN) may call it; it never blocks.
func (w *Worker) Wake() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// ProcessOnce claims one batch, publishes it and records the outcome; it returns the number of events
// published. A batch that fails to publish is not an error of ProcessOnce: its events are scheduled
// for retry (or are dead) and the count is 0. Errors are those of the database. When ctx ends while
// the publisher runs, the events it did not confirm are handed back unpublished.
func (w *Worker) ProcessOnce(ctx context.Context) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	n, _, err := w.processBatch(ctx, nil, false)
	return n, err
}

// carriedBatch is a fully published batch whose rows Run marks done with its next claim.
type carriedBatch struct {
	done   doneBatch
	res    BatchResult
	marked bool // the claim that was to mark it committed
}

// processBatch claims a batch — marking prev done in the same statement or transaction — publishes
// it and records the outcome. When carry is allowed and the batch was full and published completely,
// it is returned for the next claim to mark instead: Run then commits once per batch. Per-key
// ordering never carries, so that a key's next event can follow at once.
func (w *Worker) processBatch(ctx context.Context, prev *carriedBatch, carry bool) (published int, next *carriedBatch, err error) {
	c, err := w.claimBatch(ctx, prev)
	if err != nil || len(c.rows) == 0 {
		return 0, nil, err
	}
	return w.completeBatch(ctx, c, w.publishBatch(ctx, c), carry)
}

// claimedBatch is a batch as claimed, with its outcome so far.
type claimedBatch struct {
	rows []claimedRow
	msgs []Message
	res  BatchResult
}

// claimBatch claims the next batch, marking prev done in the same statement or transaction (and
// reporting prev to the observer once it is).
func (w *Worker) claimBatch(ctx context.Context, prev *carriedBatch) (*claimedBatch, error) {
	if err := w.prepareTable(ctx); err != nil {
		return nil, err
	}
	c := &claimedBatch{}
	start := time.Now()
	now := start.UTC()
	var prevDone *doneBatch
	if prev != nil {
		prevDone = &prev.done
	}
	rows, err := w.sql.claim(ctx, w.owner, now, now.Add(w.cfg.lease), prevDone, w.cfg.deleteOnPublish)
	c.res.ClaimDuration = time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("outboxplugin: claim: %w", err)
	}
	if prev != nil {
		prev.marked = true
		prev.res.FinishDuration = c.res.ClaimDuration
		w.cfg.observer.BatchDone(ctx, prev.res)
	}
	c.res.Claimed = len(rows)
	rows = w.buryUndecodable(ctx, rows)
	c.rows = rows
	c.msgs = make([]Message, len(rows))
	for i, r := range rows {
		c.msgs[i] = r.msg
	}
	return c, nil
}

// buryUndecodable takes the rows that cannot be made into messages (headers or a creation time that
// a row written by hand with raw SQL got wrong) out of a claimed batch and marks them dead, with the
// reason as their last error: one such row must not stop the relay, and retrying it cannot help. Fix
// the row and call RequeueDead to publish it. It returns the rest.
func (w *Worker) buryUndecodable(ctx context.Context, rows []claimedRow) []claimedRow {
	if !slices.ContainsFunc(rows, func(r claimedRow) bool { return r.undecodable != nil }) {
		return rows // the usual case: no copy on the hot path
	}
	var bad, good []claimedRow
	for _, r := range rows {
		if r.undecodable != nil {
			bad = append(bad, r)
		} else {
			good = append(good, r)
		}
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	now := time.Now().UTC()
	for _, r := range bad {
		err := fmt.Errorf("outboxplugin: event cannot be read: %w", r.undecodable)
		if merr := w.sql.markDead(fctx, w.sql.db, w.owner, []int64{r.id}, errorText(err), now); merr != nil {
			// It stays leased, and is claimed — and buried — again when the lease runs out.
			w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: could not mark an unreadable event dead",
				slog.String("worker", w.owner), slog.String("message_id", r.msg.ID), slog.Any("error", merr))
			continue
		}
		w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: event cannot be read; marked dead",
			slog.String("worker", w.owner), slog.String("message_id", r.msg.ID), slog.Any("error", err))
		w.cfg.observer.Dead(ctx, r.msg, err)
	}
	return good
}

// publishBatch publishes a claimed batch and returns the publisher's error.
func (w *Worker) publishBatch(ctx context.Context, c *claimedBatch) error {
	start := time.Now()
	err := w.publish(ctx, c.msgs)
	c.res.PublishDuration = time.Since(start)
	return err
}

// completeBatch records the outcome of a published batch, or — when carry is allowed and the batch
// was full and published completely — returns it for the next claim to mark.
func (w *Worker) completeBatch(ctx context.Context, c *claimedBatch, pubErr error, carry bool) (published int, next *carriedBatch, err error) {
	rows, res := c.rows, c.res
	if carry && pubErr == nil && len(rows) == w.cfg.batchSize && !w.cfg.keyOrdering && ctx.Err() == nil {
		res.Published = c.msgs
		done := doneBatch{ids: rowIDs(rows), ctids: rowCtids(rows), now: time.Now().UTC()}
		return len(rows), &carriedBatch{done: done, res: res}, nil
	}

	start := time.Now()
	err = w.finish(ctx, rows, pubErr, &res)
	res.FinishDuration = time.Since(start)
	if err != nil {
		return 0, nil, fmt.Errorf("outboxplugin: record batch outcome: %w", err)
	}
	w.cfg.observer.BatchDone(ctx, res)
	for _, f := range res.Failed {
		if f.Dead {
			w.cfg.observer.Dead(ctx, f.Message, f.Err)
		}
	}
	return len(res.Published), nil, nil
}

// finishCarried marks a carried batch done on its own, when no further claim will: at shutdown, or
// after the claim that was to mark it failed.
func (w *Worker) finishCarried(ctx context.Context, b *carriedBatch) {
	b.marked = true
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	start := time.Now()
	err := w.sql.markDone(fctx, w.sql.db, w.owner, b.done, w.cfg.deleteOnPublish)
	if err != nil {
		// The rows stay leased and are published again once the lease ends: a duplicate, not a loss.
		w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: could not mark published events done; they will be published again",
			slog.String("worker", w.owner), slog.Int("events", len(b.done.ids)), slog.Any("error", err))
		return
	}
	b.res.FinishDuration = time.Since(start)
	w.cfg.observer.BatchDone(ctx, b.res)
}

// publish calls the publisher within the publish timeout, turning a panic into an error. Events that
// failed before (Attempt > 1) go to the publisher one per call, after the others have gone together:
// an event that makes the publisher fail (or panic on) its whole batch then fails alone on its retry,
// instead of taking its batch-mates to dead with it. All the calls share the one publish timeout, so
// a batch still takes at most that long.
func (w *Worker) publish(ctx context.Context, msgs []Message) error {
	pctx, cancel := context.WithTimeout(ctx, w.cfg.publishTimeout)
	defer cancel()
	if len(msgs) == 1 || !slices.ContainsFunc(msgs, func(m Message) bool { return m.Attempt > 1 }) {
		return w.call(pctx, msgs) // the usual case: one call, no copy
	}
	var fresh, retried []Message
	for _, m := range msgs {
		if m.Attempt > 1 {
			retried = append(retried, m)
		} else {
			fresh = append(fresh, m)
		}
	}
	failed := map[string]error{}
	record := func(part []Message, err error) {
		var partial *PublishError
		switch {
		case err == nil:
		case errors.As(err, &partial):
			for id, e := range partial.Failed {
				failed[id] = e
			}
		default:
			for _, m := range part {
				failed[m.ID] = err
			}
		}
	}
	if len(fresh) > 0 {
		record(fresh, w.call(pctx, fresh))
	}
	for i := range retried {
		one := retried[i : i+1]
		record(one, w.call(pctx, one))
	}
	return FailedMessages(failed)
}

// call is one call of the publisher, with a panic turned into an error.
func (w *Worker) call(ctx context.Context, msgs []Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("publisher panicked: %v", r)
		}
	}()
	return w.pub.Publish(ctx, msgs)
}

// finish records the outcome of a batch: published rows done, failed rows scheduled for retry or
// dead, and — when the worker is stopping — unconfirmed rows handed back. Several statements run in
// one transaction; one runs alone.
func (w *Worker) finish(ctx context.Context, rows []claimedRow, pubErr error, res *BatchResult) error {
	failed := map[string]error{}
	var partial *PublishError
	switch {
	case pubErr == nil:
	case errors.As(pubErr, &partial):
		failed = partial.Failed
	default:
		for _, r := range rows {
			failed[r.msg.ID] = pubErr
		}
	}
	stopping := ctx.Err() != nil

	type retryGroup struct {
		ids  []int64
		next time.Time
		err  string
	}
	type deadRow struct {
		id  int64
		err string
	}
	var (
		done       []claimedRow
		released   []int64
		dead       []deadRow
		retries    = map[string]*retryGroup{}
		retryOrder []string
		now        = time.Now().UTC()
	)
	for _, r := range rows {
		ferr, isFailed := failed[r.msg.ID]
		switch {
		case !isFailed:
			done = append(done, r)
			res.Published = append(res.Published, r.msg)
		case stopping:
			released = append(released, r.id)
		case r.msg.Attempt >= w.cfg.maxAttempts:
			dead = append(dead, deadRow{id: r.id, err: errorText(ferr)})
			res.Failed = append(res.Failed, FailedMessage{Message: r.msg, Err: ferr, Dead: true})
		default:
			// Rows that failed alike at the same attempt share one statement and one next time.
			msg := errorText(ferr)
			key := strconv.Itoa(r.msg.Attempt) + "\x00" + msg
			g := retries[key]
			if g == nil {
				g = &retryGroup{next: now.Add(w.cfg.retry.Backoff(r.msg.Attempt)), err: msg}
				retries[key] = g
				retryOrder = append(retryOrder, key)
			}
			g.ids = append(g.ids, r.id)
			res.Failed = append(res.Failed, FailedMessage{Message: r.msg, Err: ferr, NextAttempt: g.next})
		}
	}
	res.Released = len(released)

	var steps []func(context.Context, execer) error
	if len(done) > 0 {
		steps = append(steps, func(ctx context.Context, ex execer) error {
			return w.sql.markDone(ctx, ex, w.owner, doneBatch{ids: rowIDs(done), ctids: rowCtids(done), now: now}, w.cfg.deleteOnPublish)
		})
	}
	for _, key := range retryOrder {
		g := retries[key]
		steps = append(steps, func(ctx context.Context, ex execer) error {
			return w.sql.markRetry(ctx, ex, w.owner, g.ids, g.err, g.next)
		})
	}
	for _, d := range dead {
		steps = append(steps, func(ctx context.Context, ex execer) error {
			return w.sql.markDead(ctx, ex, w.owner, []int64{d.id}, d.err, now)
		})
	}
	if len(released) > 0 {
		steps = append(steps, func(ctx context.Context, ex execer) error {
			return w.sql.release(ctx, ex, w.owner, released)
		})
	}

	// The outcome must be recorded even when ctx has ended (shutdown): use a context of its own.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var err error
	if len(steps) == 1 {
		err = steps[0](fctx, w.sql.db)
	} else {
		err = w.sql.inTx(fctx, func(tx *sql.Tx) error {
			for _, step := range steps {
				if err := step(fctx, tx); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return err
	}
	if len(res.Failed) > 0 {
		w.logFailures(ctx, res.Failed)
	}
	return nil
}

// logFailures writes one line per batch, not per message, so that an outage does not flood the log.
func (w *Worker) logFailures(ctx context.Context, failed []FailedMessage) {
	deadCount := 0
	for _, f := range failed {
		if f.Dead {
			deadCount++
			w.cfg.logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: event is dead after its last attempt",
				slog.String("worker", w.owner), slog.String("message_id", f.Message.ID),
				slog.String("event_type", f.Message.EventType), slog.Int("attempts", f.Message.Attempt),
				slog.Any("error", f.Err))
		}
	}
	if retried := len(failed) - deadCount; retried > 0 {
		w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: publish failed, events will be retried",
			slog.String("worker", w.owner), slog.Int("events", retried), slog.Any("error", failed[0].Err))
	}
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	const maxLen = 2000
	if len(s) > maxLen {
		s = s[:maxLen]
	}
	return s
}

// Cleanup deletes processed events created more than olderThan ago, in batches of 1000 rows, so that
// no single statement locks much of the table; it returns how many it deleted. Pending and dead
// events are never deleted.
func (w *Worker) Cleanup(ctx context.Context, olderThan time.Duration) (int64, error) {
	if w.err != nil {
		return 0, w.err
	}
	if olderThan < 0 {
		return 0, fmt.Errorf("outboxplugin: Cleanup: %w: negative age %v", ErrInvalidOption, olderThan)
	}
	const chunk = 1000
	cutoff := time.Now().UTC().Add(-olderThan)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := w.sql.cleanupChunk(ctx, cutoff, chunk)
		total += n
		if err != nil {
			return total, fmt.Errorf("outboxplugin: cleanup: %w", err)
		}
		if n < chunk {
			return total, nil
		}
	}
}

// RequeueDead makes dead events pending again, with their attempts reset: those with the given
// message ids, or every dead event when none is given. It returns how many it requeued.
func (w *Worker) RequeueDead(ctx context.Context, messageIDs ...string) (int64, error) {
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.sql.requeue(ctx, messageIDs)
	if err != nil {
		return n, fmt.Errorf("outboxplugin: requeue dead events: %w", err)
	}
	w.Wake()
	return n, nil
}
