package relay

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// Lease renewal. A claim leases its rows for the lease (WithLease, default 5 s), not for as long as a
// publish may take: while the worker holds a batch — publishing it, waiting for the batch before it,
// or carrying it to the next claim to be marked — the keeper extends the lease every third of it. A
// worker that dies stops renewing, and the other workers take its rows over once the lease runs out:
// failover in about one lease, where a lease sized for the publish timeout waited minutes. Renewal
// is bounded: a batch is renewed only until its claim time plus two publish timeouts (its own, and the
// wait of a batch claimed ahead for the one before it) plus one lease, so that a publisher that ignores
// its context cannot hold rows for ever.
//
// Publishing stays free of locks and connections: a renewal is one short UPDATE of the held rows'
// locked_until, and only batches held longer than a third of the lease are renewed at all — a batch
// that a broker takes in milliseconds never is.

// heldLease is a batch the worker holds a lease on. The renewer never touches the batch's rows, which
// their owner reads meanwhile: where a renewal moved a row (PostgreSQL), its new ctid waits in moved
// until drop hands it over.
type heldLease struct {
	ids   []int64
	moved map[int64]string // id → ctid after the latest renewal
	// until is when the lease runs out at the earliest, on the worker's monotonic clock: the time the
	// latest claim or renewal of it was sent, plus the lease. The database's lease, stamped when the
	// statement ran, ends no earlier.
	until      time.Time
	renewUntil time.Time // renewals stop here
	dropped    bool
	// expire ends the publish under way when until passes with no renewal (leaseContext); nil when
	// no publish is under way.
	expire *time.Timer
}

// leaseKeeper renews the leases of the batches a worker holds.
type leaseKeeper struct {
	mu   sync.Mutex // held while renewing: a batch dropped meanwhile waits for its rows' new ctids
	held []*heldLease
}

// hold starts renewing the lease of rows, claimed at claimed and leased until until.
func (e *Engine[M]) hold(rows []store.Row, claimed, until time.Time) *heldLease {
	h := &heldLease{ids: store.RowIDs(rows), until: until, renewUntil: claimed.Add(2*e.cfg.PublishTimeout + e.cfg.Lease)}
	k := &e.leases
	k.mu.Lock()
	k.held = append(k.held, h)
	k.mu.Unlock()
	return h
}

// leaseEnd returns when h's lease runs out at the earliest, as last claimed or renewed.
func (e *Engine[M]) leaseEnd(h *heldLease) time.Time {
	e.leases.mu.Lock()
	defer e.leases.mu.Unlock()
	return h.until
}

// drop stops renewing h, and gives rows (those of h, or nil) the ctids renewals moved them to; after it
// returns, no renewal touches h's rows. It may be called again.
func (e *Engine[M]) drop(h *heldLease, rows []store.Row) {
	if h == nil {
		return
	}
	k := &e.leases
	k.mu.Lock()
	defer k.mu.Unlock()
	if !h.dropped {
		h.dropped = true
		k.held = slices.DeleteFunc(k.held, func(x *heldLease) bool { return x == h })
	}
	if h.expire != nil {
		h.expire.Stop()
		h.expire = nil
	}
	for i := range rows {
		if ctid, ok := h.moved[rows[i].ID]; ok {
			rows[i].Ctid = ctid
		}
	}
}

// errLeaseRanOut ends a publish whose lease ran out (leaseContext).
var errLeaseRanOut = errors.New("outboxplugin: the lease of the batch ran out before its publish ended (renewals failed)")

// leaseLive reports whether h's lease has not run out yet on the worker's clock.
func (e *Engine[M]) leaseLive(h *heldLease) bool {
	return time.Now().Before(e.leaseEnd(h))
}

// leaseContext returns a context for publishing h's rows: it ends, with errLeaseRanOut as its cause,
// when h's lease runs out on the worker's clock before a renewal extends it — once it has, another
// relay may take the rows over and publish them, and two relays must not publish an event at once.
// stop releases it.
func (e *Engine[M]) leaseContext(ctx context.Context, h *heldLease) (lctx context.Context, stop func()) {
	lctx, cancel := context.WithCancelCause(ctx)
	if h == nil {
		return lctx, func() { cancel(nil) }
	}
	k := &e.leases
	k.mu.Lock()
	h.expire = time.AfterFunc(time.Until(h.until), func() { cancel(errLeaseRanOut) })
	k.mu.Unlock()
	return lctx, func() {
		k.mu.Lock()
		if h.expire != nil {
			h.expire.Stop()
			h.expire = nil
		}
		k.mu.Unlock()
		cancel(nil)
	}
}

// KeepLeases renews held leases until the returned stop is called; stop waits for the renewer to end.
func (e *Engine[M]) KeepLeases(ctx context.Context) (stop func()) {
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		every := e.cfg.Lease / 3
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-t.C:
				e.renewLeases(kctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// renewLeases extends, in one statement, the leases that run out within two thirds of a lease.
func (e *Engine[M]) renewLeases(ctx context.Context) {
	k := &e.leases
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	var due []*heldLease
	var ids []int64
	for _, h := range k.held {
		if h.until.Sub(now) > e.cfg.Lease*2/3 || !now.Before(h.renewUntil) {
			continue
		}
		due = append(due, h)
		ids = append(ids, h.ids...)
	}
	if len(ids) == 0 {
		return
	}
	sent := time.Now()
	until := sent.Add(e.cfg.Lease) // the database's new lease starts no earlier than the renewal is sent
	rctx, cancel := context.WithTimeout(ctx, e.cfg.Lease/3)
	defer cancel()
	moved, n, err := e.sql.Renew(rctx, e.cfg.Owner, ids, e.wallClock(sent))
	if err != nil {
		if ctx.Err() == nil {
			e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: could not renew the lease of events in flight; their publish stops when the lease runs out",
				slog.String("worker", e.cfg.Owner), slog.Int("events", len(ids)), slog.Any("error", err))
		}
		return
	}
	// A renewal that found some rows no longer the worker's came after their lease had run out: which
	// batches they belong to is not known (MySQL reports a count), so no lease is extended, and the
	// publishes under way stop when their leases run out, as the database's did.
	extend := n == int64(len(ids))
	for _, h := range due {
		if extend {
			h.until = until
			if h.expire != nil {
				h.expire.Reset(time.Until(until))
			}
		}
		if moved == nil {
			continue
		}
		if h.moved == nil {
			h.moved = make(map[int64]string, len(h.ids))
		}
		for _, id := range h.ids {
			if ctid, ok := moved[id]; ok {
				h.moved[id] = ctid
			}
		}
	}
	if !extend {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: lost the lease of events in flight to another worker (their lease had run out); their publish stops when the lease runs out",
			slog.String("worker", e.cfg.Owner), slog.Int64("events", int64(len(ids))-n))
	}
}
