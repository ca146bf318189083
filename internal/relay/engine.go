package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/failure"
	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// The relay's engine: the loop that claims a batch, publishes it, decides what became of each message
// and records it, with the state it keeps between turns (loop.go), the leases it renews while it holds
// a batch (lease.go) and the rows it publishes one by one after a crash (unfinished.go). The root
// package's Worker is its public face: it makes the engine from its options, and gives it the
// publisher, the observer and the logger's summaries as Hooks.
//
// The engine is generic in the message type M the publisher takes (outboxplugin.Message), so that a
// batch's messages are made once, as the publisher wants them, and handed to it and to the observer
// without a copy; it never looks inside an M.

// Config is what the engine needs of the worker's options.
type Config struct {
	Owner           string        // the worker's id, stamped on the rows it claims (locked_by)
	BatchSize       int           // the most rows a claim takes
	Lease           time.Duration // how long a claim or a renewal leases its rows
	PublishTimeout  time.Duration // the bound of one batch's publish
	PollInterval    time.Duration // the pause after a batch that was not full
	MaxAttempts     int           // deliveries before an event is dead
	Backoff         func(attempt int) time.Duration
	KeyOrdering     bool // per-key ordering: no claim ahead, no mark carried to the next claim
	DeleteOnPublish bool // published rows are deleted instead of marked processed
	Logger          *slog.Logger
}

// Hooks are what the engine calls of the worker that owns it.
type Hooks[M any] struct {
	// Message makes the message the publisher takes of a claimed row.
	Message func(store.Message) M
	// Publish publishes a batch (a panic is turned into an error).
	Publish func(ctx context.Context, msgs []M) error
	// Answers reads the publisher's errors.
	Answers Answers
	// Prepare runs before each claim (the worker's one-time table check); an error fails the claim.
	Prepare func(ctx context.Context) error
	// Claimed is told the result of each claim: its error, or how many rows it took.
	Claimed func(err error, n int)
	// BatchDone is told each recorded batch: for the logs, the counts, health and the observer.
	BatchDone func(ctx context.Context, r Result[M])
	// Buried is told the events made dead at claim, before any delivery (buryUnpublishable).
	Buried func(ctx context.Context, dead []Failed[M])
}

// Result is what happened to one batch (outboxplugin.BatchResult has its fields, documented).
type Result[M any] struct {
	Claimed                                        int
	Published                                      []M
	Failed                                         []Failed[M]
	NotDelivered                                   []Failed[M]
	Released                                       int
	LeaseLost                                      int
	ClaimDuration, PublishDuration, FinishDuration time.Duration
}

// Failed is a message whose delivery failed (outboxplugin.FailedMessage has its fields, documented).
type Failed[M any] struct {
	Message     M
	Err         error
	Dead        bool
	NextAttempt time.Time
}

// Engine claims, publishes and records batches for one worker. It runs one Run or ProcessOnce at a
// time: its owner makes sure of that.
type Engine[M any] struct {
	cfg    Config
	h      Hooks[M]
	sql    *store.Store
	leases leaseKeeper
	// pipeline: Run claims the next batch while it publishes a full one. Not with per-key ordering.
	pipeline bool
	// skew is added to the worker's wall clock, the time it gives statements that take it (SQLite's,
	// and attempt histories): set by tests, to play a host whose clock is off.
	skew time.Duration
}

// New returns the engine of a worker that records through s.
func New[M any](s *store.Store, cfg Config, h Hooks[M]) *Engine[M] {
	return &Engine[M]{cfg: cfg, h: h, sql: s, pipeline: !cfg.KeyOrdering}
}

// SetClockSkew sets the engine's wall clock off by skew, as on a host whose clock is wrong.
func (e *Engine[M]) SetClockSkew(skew time.Duration) { e.skew = skew }

// wallClock is the worker's wall-clock time of t, in UTC, as it gives it to statements.
func (e *Engine[M]) wallClock(t time.Time) time.Time { return t.UTC().Add(e.skew) }

// FinishTimeout bounds the statements that record a batch's outcome, which run even when the worker
// is stopping, and a claim, which is not cut short by shutdown (its rows would stay leased, unseen).
const FinishTimeout = 30 * time.Second

// claimTries is how many times a claim is run when the database rolls it back as a deadlock's victim
// (store.Retryable) before the failure goes to Run's error path.
const claimTries = 3

// Run relays batches until ctx ends, waiting between them as pause says; a receive on wake cuts a wait
// short unless the worker is backing off. It renews the leases of the batches it holds meanwhile, and
// when ctx ends hands back the batch claimed ahead and marks the carried one before it returns.
func (e *Engine[M]) Run(ctx context.Context, wake <-chan struct{}) {
	defer e.KeepLeases(context.WithoutCancel(ctx))()
	l := &loop[M]{e: e}
	defer l.stop(ctx)
	for {
		if ctx.Err() != nil {
			return
		}
		n, outage, err := l.turn(ctx)
		if ctx.Err() != nil {
			return
		}
		wait, wakeable := l.pause(ctx, n, outage, err)
		if wait == 0 {
			continue
		}
		var woken <-chan struct{}
		if wakeable {
			woken = wake
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-woken:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// ProcessOnce claims one batch, publishes it and records the outcome; it returns the number of events
// published (see outboxplugin.Worker.ProcessOnce).
func (e *Engine[M]) ProcessOnce(ctx context.Context) (int, error) {
	defer e.KeepLeases(context.WithoutCancel(ctx))()
	c, err := e.claimBatch(ctx, nil)
	if err != nil || len(c.rows) == 0 {
		return 0, err
	}
	if c.alone {
		return e.deliverAlone(ctx, c)
	}
	e.publishBatch(ctx, c)
	n, _, _, err := e.completeBatch(ctx, c, false)
	return n, err
}

// carriedBatch is a fully published batch whose rows Run marks done with its next claim. Its lease is
// renewed until then.
type carriedBatch[M any] struct {
	rows   []store.Row
	lease  *heldLease
	now    time.Time // when it was published
	res    Result[M]
	marked bool // the claim that was to mark it committed
}

// done stops renewing the batch's lease and returns its rows as the mark needs them.
func (e *Engine[M]) done(b *carriedBatch[M]) store.Done {
	e.drop(b.lease, b.rows)
	return store.Done{IDs: store.RowIDs(b.rows), Ctids: store.RowCtids(b.rows), Now: b.now}
}

// claimedBatch is a batch as claimed, with its outcome so far.
type claimedBatch[M any] struct {
	rows  []store.Row
	msgs  []M
	lease *heldLease
	out   []Delivery // what the publish did with each message
	res   Result[M]
	// alone: the rows were taken over from unfinished deliveries; each is published and recorded on
	// its own (deliverAlone).
	alone bool
	// handBack: the lease ran out before or during the publish; what was not published is handed
	// back without counting the attempt.
	handBack bool
}

// claimBatch claims the next batch, marking prev done in the same statement or transaction (and
// reporting prev once it is). Once the claim is sent it runs to its end, even when ctx ends meanwhile:
// a committed claim whose rows the worker dropped would leave them leased, unpublished, for a lease.
func (e *Engine[M]) claimBatch(ctx context.Context, prev *carriedBatch[M]) (*claimedBatch[M], error) {
	if err := e.h.Prepare(ctx); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := &claimedBatch[M]{}
	start := time.Now()
	var prevDone *store.Done
	if prev != nil {
		d := e.done(prev)
		prevDone = &d
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
	defer cancel()
	var (
		rows   []store.Row
		marked int64
		err    error
		sent   time.Time
	)
	for try := 1; ; try++ {
		// The lease the database stamps starts no earlier than the claim is sent: on this worker's
		// monotonic clock, it ends no earlier than sent plus the lease, whatever the clocks of the
		// database and of other relays say, and however late the answer comes.
		sent = time.Now()
		rows, marked, err = e.sql.Claim(cctx, e.cfg.Owner, e.wallClock(sent), prevDone, e.cfg.DeleteOnPublish)
		if err == nil || try == claimTries || !e.sql.Retryable(err) || cctx.Err() != nil {
			break
		}
		e.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "outboxplugin: claim rolled back as a deadlock's victim; claiming again",
			slog.String("worker", e.cfg.Owner), slog.Int("try", try))
	}
	c.res.ClaimDuration = time.Since(start)
	if err != nil {
		err = fmt.Errorf("outboxplugin: claim: %w", err)
		e.h.Claimed(err, 0)
		return nil, err
	}
	e.h.Claimed(nil, len(rows))
	if prev != nil {
		prev.marked = true
		prev.res.FinishDuration = c.res.ClaimDuration
		e.noteLeaseLost(ctx, &prev.res, len(prevDone.IDs), marked)
		e.h.BatchDone(ctx, prev.res)
	}
	c.res.Claimed = len(rows)
	rows, c.alone = e.isolateUnfinished(ctx, e.buryUnpublishable(ctx, rows))
	c.rows = rows
	if len(rows) == 0 {
		return c, nil
	}
	c.lease = e.hold(rows, sent, sent.Add(e.cfg.Lease))
	c.msgs = make([]M, len(rows))
	for i, r := range rows {
		c.msgs[i] = e.h.Message(r.Msg)
	}
	return c, nil
}

// buryUnpublishable takes out of a claimed batch, and marks dead, the rows that no delivery can
// publish: those that cannot be made into messages (headers or a creation time that a row written by
// hand with raw SQL got wrong; fix the row and requeue it), and those whose every delivery so far
// started and never finished — a publish that kills the process (out of memory, a crash in a cgo
// client) would otherwise take the relay and the event's batch-mates down after every lease, for
// ever. It returns the rest.
func (e *Engine[M]) buryUnpublishable(ctx context.Context, rows []store.Row) []store.Row {
	if !slices.ContainsFunc(rows, e.unpublishable) {
		return rows // the usual case: no copy on the hot path
	}
	var good []store.Row
	var buried []Failed[M]
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
	defer cancel()
	now := e.wallClock(time.Now())
	for _, r := range rows {
		if !e.unpublishable(r) {
			good = append(good, r)
			continue
		}
		var err error
		if r.Undecodable != nil {
			err = fmt.Errorf("outboxplugin: event cannot be read: %w", r.Undecodable)
		} else {
			err = errNotFinished(r.Msg.Attempt - 1)
		}
		if merr := e.sql.Bury(fctx, e.sql.DB(), e.cfg.Owner, []int64{r.ID}, failure.LastError(err), now); merr != nil {
			// It stays leased, and is claimed — and buried — again when the lease runs out.
			e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: could not mark an unpublishable event dead",
				slog.String("worker", e.cfg.Owner), slog.String("message_id", r.Msg.ID), slog.Any("error", merr))
			continue
		}
		buried = append(buried, Failed[M]{Message: e.h.Message(r.Msg), Err: err, Dead: true})
	}
	if len(buried) > 0 {
		e.h.Buried(ctx, buried)
	}
	return good
}

// unpublishable: the row cannot be read, or this claim is one delivery more than the maximum (every
// earlier one started and none recorded an outcome).
func (e *Engine[M]) unpublishable(r store.Row) bool {
	return r.Undecodable != nil || r.Msg.Attempt > e.cfg.MaxAttempts
}

// errNotFinished is the last error of an event given up on at claim: it has had its maximum of
// deliveries, and the last of them recorded no outcome — the publish killed the process, or the process
// died meanwhile (or the maximum was lowered since).
func errNotFinished(attempts int) error {
	return fmt.Errorf("outboxplugin: gave up after %d deliveries that did not finish", attempts)
}

// releaseAhead hands back a batch that was claimed ahead but not published: when Run stops, or backs
// off.
func (e *Engine[M]) releaseAhead(ctx context.Context, c *claimedBatch[M]) {
	e.drop(c.lease, nil)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
	defer cancel()
	if err := e.sql.Release(fctx, e.sql.DB(), e.cfg.Owner, store.RowIDs(c.rows), ""); err != nil {
		// The rows come back when their lease runs out.
		e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "outboxplugin: could not hand back claimed events; they wait for their lease to run out",
			slog.String("worker", e.cfg.Owner), slog.Int("events", len(c.rows)), slog.Any("error", err))
		return
	}
	c.res.Released = len(c.rows)
	e.h.BatchDone(ctx, c.res)
}

// publishBatch publishes a claimed batch, recording what became of each message. A batch whose lease
// has run out on the worker's clock — its claim's answer came late, or its renewals failed — is not
// published, and a publish is cut short when the lease runs out meanwhile: another relay may have
// taken the rows over. Such a batch is handed back, its attempt not counted (handBack).
func (e *Engine[M]) publishBatch(ctx context.Context, c *claimedBatch[M]) {
	start := time.Now()
	defer func() { c.res.PublishDuration = time.Since(start) }()
	if !e.leaseLive(c.lease) {
		c.out = make([]Delivery, len(c.msgs))
		MarkUnsent(c.out, errLeaseRanOutFirst)
		c.handBack = true
		e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: the lease of a claimed batch ran out before its publish started (the claim's answer came late, or renewals failed); handing it back unpublished",
			slog.String("worker", e.cfg.Owner), slog.Int("events", len(c.msgs)))
		return
	}
	lctx, stop := e.leaseContext(ctx, c.lease)
	c.out = e.deliver(lctx, c.rows, c.msgs)
	if errors.Is(context.Cause(lctx), errLeaseRanOut) {
		c.handBack = true
		e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: the lease of a batch ran out during its publish (renewals failed); handing back what was not published",
			slog.String("worker", e.cfg.Owner), slog.Int("events", len(c.msgs)))
	}
	stop()
}

// errLeaseRanOutFirst is the outcome of the messages of a batch whose lease ran out before its
// publish started.
var errLeaseRanOutFirst = errors.New("outboxplugin: the lease ran out before the publish started")

// deliver publishes msgs (those of rows) within one publish timeout and returns the outcome of each.
// Ids a publisher's error named that were not in the call's messages are ignored, and logged.
func (e *Engine[M]) deliver(ctx context.Context, rows []store.Row, msgs []M) []Delivery {
	pctx, cancel := context.WithTimeout(ctx, e.cfg.PublishTimeout)
	defer cancel()
	start := time.Now()
	out, unknown := SplitPublish(pctx, len(msgs), func(i int) string { return rows[i].Msg.ID },
		func(ctx context.Context, lo, hi int) error { return e.call(ctx, msgs[lo:hi]) }, e.h.Answers)
	// One duration for the whole publish: a message's verdict is known when the publish that split
	// its batch ends, and the messages of a statement (RetryGroup) share one history entry.
	took := time.Since(start)
	for i := range out {
		out[i].Took = took
	}
	if len(unknown) > 0 {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: the publisher named messages that are not in its batch; ignored",
			slog.String("worker", e.cfg.Owner), slog.Any("message_ids", unknown[:min(len(unknown), 5)]), slog.Int("count", len(unknown)))
	}
	return out
}

// call is one call of the publisher, with a panic turned into an error.
func (e *Engine[M]) call(ctx context.Context, msgs []M) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("publisher panicked: %v", r)
		}
	}()
	return e.h.Publish(ctx, msgs)
}
