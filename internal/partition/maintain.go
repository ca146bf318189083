package partition

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Result is what one Maintain did and found.
type Result struct {
	// Every is the width of the table's partitions.
	Every time.Duration
	// Created are the partitions made; Skipped the ranges not made because the default partition
	// holds rows of them (PostgreSQL: those rows stay there, and the range's writes go on landing
	// there, until they are past the retention).
	Created, Skipped []string
	// Dropped are the partitions dropped, and DroppedRows the rows they held as the catalog
	// estimated them (PostgreSQL: as of their last VACUUM or ANALYZE).
	Dropped     []string
	DroppedRows int64
	// Kept are the partitions past the retention that hold unfinished events, and stay until those
	// are published, requeued and published, or discarded.
	Kept []Kept
	// Busy are the partitions past the retention whose drop did not get its lock in time (the
	// table's transactions held it): tried again at the next run.
	Busy []string
	// DefaultRows is how many rows the default partition held (counted up to DefaultCountLimit),
	// and DefaultDeleted how many processed ones past the retention this run deleted from it.
	DefaultRows, DefaultDeleted int64
	// MakeTook is the time spent making partitions (planning included), DropTook the time spent
	// retiring them (the checks, the drops and their retries; not the default partition's cleanup).
	MakeTook, DropTook time.Duration
}

// Kept is a partition kept past the retention, and what it holds that keeps it (each counted up to
// KeptCountLimit).
type Kept struct {
	Name          string
	To            time.Time
	Pending, Dead int64
}

// Counting limits: a count reads at most this many rows.
const (
	KeptCountLimit    = 1000
	DefaultCountLimit = 100000
)

// LockTimeout bounds how long a partition's DDL waits for its lock (PostgreSQL: a drop's ACCESS
// EXCLUSIVE lock of the parent table, which the application's writes queue behind; an attach's of
// the default partition, which claims queue behind; MySQL: the metadata lock, at least a second
// there), and so how long what queues behind it can wait: past it the DDL gives up and is tried
// again (dropAttempts times per run, then at the next run; Result.Busy names it meanwhile).
var LockTimeout = 100 * time.Millisecond

const dropAttempts = 3

// Guard takes the maintainers' lock without waiting, for one step of a Maintain (the partitions made
// at once; one partition dropped; one chunk of the default partition's cleanup): the step's statements
// run on held, which on PostgreSQL must be a transaction (the lock lasts as long as it: a transaction
// pooler keeps it with the transaction), and release ends it, keeping the step's work when keep is
// true. got is false, and nothing is held, when another maintainer holds the lock.
type Guard func(ctx context.Context) (held Execer, release func(keep bool) error, got bool, err error)

// Maintain makes the partitions t lacks at now and, when drop is true, drops those whose range ended
// before cutoff and that hold no unfinished event (pending, scheduled, leased, waiting or dead), and
// deletes the processed rows created before cutoff from the default partition (PostgreSQL; MySQL's
// MAXVALUE partition holds only rows newer than its partitions, which its split moves out). Each step
// runs under guard, and reads what it acts on again under it: another maintainer may have made or
// dropped a partition between two steps. ran is false when another maintainer held the lock at the
// first step; a run that finds it held later stops there. It leaves conn as it found it.
func (t Table) Maintain(ctx context.Context, conn *sql.Conn, now, cutoff time.Time, drop bool, guard Guard) (r Result, ran bool, err error) {
	start := time.Now()
	var made []string
	busy, err := retryLock(ctx, func() error {
		var got bool
		made, r.Skipped, got, err = t.make(ctx, now, guard)
		if err == nil && !got {
			return errHeld
		}
		return err
	})
	if errors.Is(err, errHeld) {
		return r, false, nil
	}
	if err != nil {
		return r, true, err
	}
	if busy {
		r.Busy = append(r.Busy, "(the partitions to make)")
	}
	r.Created = made
	r.MakeTook = time.Since(start)
	l, err := t.Read(ctx, conn)
	if err != nil {
		return r, true, err
	}
	r.Every = l.Every
	if drop {
		start = time.Now()
		for _, p := range l.Partitions {
			if p.Default || p.To.IsZero() || p.To.After(cutoff) {
				continue
			}
			if err := t.retire(ctx, conn, p, guard, &r); err != nil {
				if errors.Is(err, errHeld) {
					return r, true, nil // another maintainer took over
				}
				return r, true, err
			}
		}
		r.DropTook = time.Since(start)
	}
	if d, ok := l.Default(); ok {
		if drop && t.Dialect == Postgres {
			n, err := t.cleanDefault(ctx, d, cutoff, guard)
			r.DefaultDeleted = n
			if errors.Is(err, errHeld) {
				return r, true, nil
			}
			if err != nil {
				return r, true, fmt.Errorf("clean the default partition: %w", err)
			}
		}
		if r.DefaultRows, err = t.Rows(ctx, conn, d, DefaultCountLimit); err != nil {
			return r, true, err
		}
	}
	return r, true, nil
}

// errHeld: another maintainer holds the lock.
var errHeld = errors.New("another maintainer holds the lock")

// make makes, in one step under guard, the partitions t lacks at now, as the catalog says under the
// lock. On PostgreSQL the step is one transaction: all of them or none.
func (t Table) make(ctx context.Context, now time.Time, guard Guard) (made, skipped []string, got bool, err error) {
	held, release, got, err := guard(ctx)
	if err != nil || !got {
		return nil, nil, got, err
	}
	keep := false
	defer func() {
		if rerr := release(keep); err == nil && rerr != nil {
			made, err = nil, rerr
		}
	}()
	l, err := t.Read(ctx, held)
	if err != nil {
		return nil, nil, true, err
	}
	if !l.Partitioned {
		return nil, nil, true, fmt.Errorf("%s is not partitioned", t.Quoted())
	}
	steps, skipped, err := t.Plan(ctx, held, l, now)
	if err != nil || len(steps) == 0 {
		return nil, skipped, true, err
	}
	restore, err := t.setLockTimeout(ctx, held)
	if err != nil {
		return nil, nil, true, err
	}
	defer restore()
	for _, st := range steps {
		for _, q := range st.SQL {
			if _, err := held.ExecContext(ctx, q); err != nil {
				return nil, nil, true, fmt.Errorf("make partitions %s: %w", strings.Join(st.Partitions, ", "), err)
			}
		}
		made = append(made, st.Partitions...)
	}
	keep = true
	return made, skipped, true, nil
}

// setLockTimeout bounds, for the step on held, how long a DDL waits for its lock (LockTimeout):
// PostgreSQL's lock_timeout for the transaction; MySQL's lock_wait_timeout for the session, set back
// by restore.
func (t Table) setLockTimeout(ctx context.Context, held Execer) (restore func(), err error) {
	if t.Dialect == Postgres {
		_, err = held.ExecContext(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", LockTimeout.Milliseconds()))
		return func() {}, err
	}
	secs := max(int64(LockTimeout/time.Second), 1)
	if _, err := held.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", secs)); err != nil {
		return nil, err
	}
	return func() {
		_, _ = held.ExecContext(context.WithoutCancel(ctx), "SET SESSION lock_wait_timeout = DEFAULT") // the connection goes back to the pool either way
	}, nil
}

// retire drops p unless it holds an unfinished event. A check without the lock spares the drop's lock
// for a partition that is kept. Under the lock the partition is looked up again, then on PostgreSQL
// detached, checked and dropped in one transaction that holds the parent's lock from the DETACH on: no
// event can enter p between the check and the drop. On MySQL, where DDL commits, the check comes just
// before the drop: only a row written in between with a created_at older than the retention (a writer
// whose clock is that far behind) could be lost.
func (t Table) retire(ctx context.Context, conn *sql.Conn, p Partition, guard Guard, r *Result) error {
	pending, dead, err := t.Unfinished(ctx, conn, p, KeptCountLimit)
	if err != nil {
		// The layout was read without the lock: another maintainer may have dropped p since
		// (PostgreSQL: relation does not exist; MySQL: unknown partition). Gone is what retire wants.
		if l, rerr := t.Read(ctx, conn); rerr == nil && !l.has(p) {
			return nil
		}
		return fmt.Errorf("check partition %s: %w", p.Name, err)
	}
	if pending > 0 || dead > 0 {
		r.Kept = append(r.Kept, Kept{Name: p.Name, To: p.To, Pending: pending, Dead: dead})
		return nil
	}
	estimate, err := t.estimate(ctx, conn, p)
	if err != nil {
		return err
	}
	var outcome string
	busy, err := retryLock(ctx, func() error {
		var err error
		outcome, err = t.dropStep(ctx, p, guard, r)
		return err
	})
	switch {
	case err != nil:
		return err
	case busy:
		r.Busy = append(r.Busy, p.Name)
	case outcome == "dropped":
		r.Dropped = append(r.Dropped, p.Name)
		r.DroppedRows += estimate
	}
	return nil
}

// dropStep is one attempt at dropping p under guard: outcome is "dropped", "kept" (it holds an
// unfinished event: recorded in r) or "gone" (another maintainer dropped it).
func (t Table) dropStep(ctx context.Context, p Partition, guard Guard, r *Result) (outcome string, err error) {
	held, release, got, err := guard(ctx)
	if err != nil {
		return "", err
	}
	if !got {
		return "", errHeld
	}
	keep := false
	defer func() {
		if rerr := release(keep); err == nil && rerr != nil {
			outcome, err = "", rerr
		}
	}()
	l, err := t.Read(ctx, held)
	if err != nil {
		return "", err
	}
	if !l.has(p) {
		return "gone", nil
	}
	restore, err := t.setLockTimeout(ctx, held)
	if err != nil {
		return "", err
	}
	defer restore()
	if t.Dialect == Postgres {
		if _, err := held.ExecContext(ctx, "ALTER TABLE "+t.Quoted()+" DETACH PARTITION "+t.qualify(p.Name)); err != nil {
			return "", err
		}
	}
	pending, dead, err := t.Unfinished(ctx, held, p, KeptCountLimit)
	if err != nil {
		return "", err
	}
	if pending > 0 || dead > 0 {
		r.Kept = append(r.Kept, Kept{Name: p.Name, To: p.To, Pending: pending, Dead: dead})
		return "kept", nil // rolled back: the partition stays attached
	}
	drop := "DROP TABLE " + t.qualify(p.Name)
	if t.Dialect != Postgres {
		drop = "ALTER TABLE " + t.Quoted() + " DROP PARTITION " + t.quote(p.Name)
	}
	if _, err := held.ExecContext(ctx, drop); err != nil {
		return "", err
	}
	keep = true
	return "dropped", nil
}

// retryLock runs fn until it does not fail for want of a lock, dropAttempts times at most, pausing
// longer after each; busy reports that the last attempt failed so.
func retryLock(ctx context.Context, fn func() error) (busy bool, err error) {
	for attempt := 1; ; attempt++ {
		err = fn()
		if err == nil || !lockTimedOut(err) {
			return false, err
		}
		if attempt == dropAttempts {
			return true, nil
		}
		timer := time.NewTimer(time.Duration(attempt) * LockTimeout)
		select {
		case <-ctx.Done():
			timer.Stop()
			return false, ctx.Err()
		case <-timer.C:
		}
	}
}

// lockTimedOut reports a DDL that gave up waiting for its lock: PostgreSQL's lock_not_available
// (55P03), MySQL's ER_LOCK_WAIT_TIMEOUT (1205).
func lockTimedOut(err error) bool {
	s := err.Error()
	return strings.Contains(s, "55P03") || strings.Contains(s, "Error 1205") || strings.Contains(s, "lock timeout")
}

// estimate is the catalog's estimate of p's rows (0 when it has none).
func (t Table) estimate(ctx context.Context, q Querier, p Partition) (int64, error) {
	var query string
	var args []any
	if t.Dialect == Postgres {
		query, args = `SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass($1)`, []any{t.qualify(p.Name)}
	} else {
		query, args = `SELECT COALESCE(table_rows, 0) FROM information_schema.partitions WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE())`+
			` AND table_name = ? AND partition_name = ?`, []any{t.Schema, t.Name, p.Name}
	}
	var n int64
	if err := queryRow(ctx, q, query, args, &n); err != nil {
		return 0, fmt.Errorf("estimate partition %s: %w", p.Name, err)
	}
	return n, nil
}

// CleanChunk is how many rows one statement of the default partition's cleanup deletes.
const CleanChunk = 1000

// cleanDefault deletes the processed rows created before cutoff from PostgreSQL's default partition,
// CleanChunk at a time, each chunk a step under guard. The default partition only fills when
// partitions were not made ahead (the relays were stopped for longer than Ahead intervals); its rows
// cannot be dropped with a partition.
func (t Table) cleanDefault(ctx context.Context, d Partition, cutoff time.Time, guard Guard) (int64, error) {
	ref := "ONLY " + t.qualify(d.Name)
	var deleted int64
	for {
		held, release, got, err := guard(ctx)
		if err != nil {
			return deleted, err
		}
		if !got {
			return deleted, errHeld
		}
		res, err := held.ExecContext(ctx, `DELETE FROM `+ref+` WHERE ctid = ANY(ARRAY(SELECT ctid FROM `+ref+
			` WHERE processed = true AND created_at < $1 LIMIT `+fmt.Sprint(CleanChunk)+`))`, cutoff)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if rerr := release(err == nil); err == nil {
			err = rerr
		}
		if err != nil {
			return deleted, err
		}
		deleted += n
		if n < CleanChunk {
			return deleted, nil
		}
	}
}
