package outboxplugin

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
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
	ids        []int64
	moved      map[int64]string // id → ctid after the latest renewal
	until      time.Time        // when the lease runs out, as last stamped
	renewUntil time.Time        // renewals stop here
	dropped    bool
}

// leaseKeeper renews the leases of the batches a worker holds.
type leaseKeeper struct {
	mu   sync.Mutex // held while renewing: a batch dropped meanwhile waits for its rows' new ctids
	held []*heldLease
}

// hold starts renewing the lease of rows, claimed at claimed and leased until until.
func (w *Worker) hold(rows []claimedRow, claimed, until time.Time) *heldLease {
	h := &heldLease{ids: rowIDs(rows), until: until, renewUntil: claimed.Add(2*w.cfg.publishTimeout + w.cfg.lease)}
	k := &w.leases
	k.mu.Lock()
	k.held = append(k.held, h)
	k.mu.Unlock()
	return h
}

// leaseEnd returns when h's lease runs out, as last stamped.
func (w *Worker) leaseEnd(h *heldLease) time.Time {
	w.leases.mu.Lock()
	defer w.leases.mu.Unlock()
	return h.until
}

// drop stops renewing h, and gives rows (those of h, or nil) the ctids renewals moved them to; after it
// returns, no renewal touches h's rows. It may be called again.
func (w *Worker) drop(h *heldLease, rows []claimedRow) {
	if h == nil {
		return
	}
	k := &w.leases
	k.mu.Lock()
	defer k.mu.Unlock()
	if !h.dropped {
		h.dropped = true
		k.held = slices.DeleteFunc(k.held, func(x *heldLease) bool { return x == h })
	}
	for i := range rows {
		if ctid, ok := h.moved[rows[i].id]; ok {
			rows[i].ctid = ctid
		}
	}
}

// keepLeases renews held leases until the returned stop is called; stop waits for the renewer to end.
func (w *Worker) keepLeases(ctx context.Context) (stop func()) {
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		every := w.cfg.lease / 3
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-t.C:
				w.renewLeases(kctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// renewLeases extends, in one statement, the leases that run out within two thirds of a lease.
func (w *Worker) renewLeases(ctx context.Context) {
	k := &w.leases
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now().UTC()
	var due []*heldLease
	var ids []int64
	for _, h := range k.held {
		if h.until.Sub(now) > w.cfg.lease*2/3 || !now.Before(h.renewUntil) {
			continue
		}
		due = append(due, h)
		ids = append(ids, h.ids...)
	}
	if len(ids) == 0 {
		return
	}
	until := now.Add(w.cfg.lease)
	rctx, cancel := context.WithTimeout(ctx, w.cfg.lease/3)
	defer cancel()
	moved, n, err := w.sql.renew(rctx, w.owner, ids, until)
	if err != nil {
		if ctx.Err() == nil {
			w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: could not renew the lease of events in flight; another worker may publish them too",
				slog.String("worker", w.owner), slog.Int("events", len(ids)), slog.Any("error", err))
		}
		return
	}
	for _, h := range due {
		h.until = until
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
	if n < int64(len(ids)) {
		w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: lost the lease of events in flight to another worker; they will be published twice",
			slog.String("worker", w.owner), slog.Int64("events", int64(len(ids))-n))
	}
}
