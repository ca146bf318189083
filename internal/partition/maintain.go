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

// Maintain makes the partitions t lacks at now and, when drop is true, drops those whose range ended
// before cutoff and that hold no unfinished event (pending, scheduled, leased, waiting or dead), and
// deletes the processed rows created before cutoff from the default partition (PostgreSQL; MySQL's
// MAXVALUE partition holds only rows newer than its partitions, which its split moves out). It runs
// on conn, which it leaves as it found it. The caller makes sure only one maintainer runs at a time.
func (t Table) Maintain(ctx context.Context, conn *sql.Conn, now, cutoff time.Time, drop bool) (r Result, err error) {
	l, err := t.Read(ctx, conn)
	if err != nil {
		return r, err
	}
	if !l.Partitioned {
		return r, fmt.Errorf("%s is not partitioned", t.Quoted())
	}
	r.Every = l.Every
	start := time.Now()
	steps, skipped, err := t.Plan(ctx, conn, l, now)
	if err != nil {
		return r, fmt.Errorf("plan partitions: %w", err)
	}
	r.Skipped = skipped
	for _, st := range steps {
		busy, err := retryLock(ctx, func() error { return t.run(ctx, conn, st.SQL, LockTimeout) })
		if err != nil {
			return r, fmt.Errorf("make partitions %s: %w", strings.Join(st.Partitions, ", "), err)
		}
		if busy {
			r.Busy = append(r.Busy, st.Partitions...)
			continue
		}
		r.Created = append(r.Created, st.Partitions...)
	}
	if len(steps) > 0 {
		if l, err = t.Read(ctx, conn); err != nil {
			return r, err
		}
	}
	r.MakeTook = time.Since(start)
	if drop {
		start = time.Now()
		for _, p := range l.Partitions {
			if p.Default || p.To.IsZero() || p.To.After(cutoff) {
				continue
			}
			if err := t.retire(ctx, conn, p, &r); err != nil {
				return r, err
			}
		}
		r.DropTook = time.Since(start)
	}
	if d, ok := l.Default(); ok {
		if drop && t.Dialect == Postgres {
			n, err := t.cleanDefault(ctx, conn, d, cutoff)
			r.DefaultDeleted = n
			if err != nil {
				return r, fmt.Errorf("clean the default partition: %w", err)
			}
		}
		if r.DefaultRows, err = t.Rows(ctx, conn, d, DefaultCountLimit); err != nil {
			return r, err
		}
	}
	return r, nil
}

// retire drops p unless it holds an unfinished event. On PostgreSQL the check and the drop are one
// transaction that holds the parent's lock from the DETACH on: no event can enter p between them. On
// MySQL, where DDL commits, the check comes first: only a row written in between with a created_at
// older than the retention (a writer whose clock is that far behind) could be lost.
func (t Table) retire(ctx context.Context, conn *sql.Conn, p Partition, r *Result) error {
	pending, dead, err := t.Unfinished(ctx, conn, p, KeptCountLimit)
	if err != nil {
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
	var stmts []string
	if t.Dialect == Postgres {
		stmts = []string{"ALTER TABLE " + t.Quoted() + " DETACH PARTITION " + t.qualify(p.Name), "", "DROP TABLE " + t.qualify(p.Name)}
	} else {
		stmts = []string{"ALTER TABLE " + t.Quoted() + " DROP PARTITION " + t.quote(p.Name)}
	}
	busy, err := retryLock(ctx, func() error { return t.runChecked(ctx, conn, stmts, p, r) })
	if busy {
		r.Busy = append(r.Busy, p.Name)
		return nil
	}
	if errors.Is(err, errKept) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("drop partition %s: %w", p.Name, err)
	}
	r.Dropped = append(r.Dropped, p.Name)
	r.DroppedRows += estimate
	return nil
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

// errKept: the check under the drop's lock found an unfinished event.
var errKept = errors.New("kept")

// runChecked runs a drop's statements; an empty one (PostgreSQL) is the check under the lock, which
// rolls the whole back when p holds an unfinished event.
func (t Table) runChecked(ctx context.Context, conn *sql.Conn, stmts []string, p Partition, r *Result) error {
	if t.Dialect != Postgres {
		return t.run(ctx, conn, stmts, LockTimeout)
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit, ErrTxDone
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", LockTimeout.Milliseconds())); err != nil {
		return err
	}
	for _, s := range stmts {
		if s == "" {
			pending, dead, err := t.Unfinished(ctx, tx, p, KeptCountLimit)
			if err != nil {
				return err
			}
			if pending > 0 || dead > 0 {
				r.Kept = append(r.Kept, Kept{Name: p.Name, To: p.To, Pending: pending, Dead: dead})
				return errKept
			}
			continue
		}
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// run runs stmts: on PostgreSQL in one transaction (with lock_timeout set when lockTimeout > 0), on
// MySQL one after the other (each DDL commits), with lock_wait_timeout set for them when
// lockTimeout > 0 (whole seconds: at least one) and set back after.
func (t Table) run(ctx context.Context, conn *sql.Conn, stmts []string, lockTimeout time.Duration) error {
	if t.Dialect == Postgres {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // after Commit, ErrTxDone
		if lockTimeout > 0 {
			if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", lockTimeout.Milliseconds())); err != nil {
				return err
			}
		}
		for _, s := range stmts {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return err
			}
		}
		return tx.Commit()
	}
	if lockTimeout > 0 {
		secs := max(int64(lockTimeout/time.Second), 1)
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", secs)); err != nil {
			return err
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION lock_wait_timeout = DEFAULT") //nolint:errcheck // the connection goes back to the pool either way
	}
	for _, s := range stmts {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	return nil
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
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("estimate partition %s: %w", p.Name, err)
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		if err := rows.Scan(&n); err != nil {
			return 0, err
		}
	}
	return n, rows.Err()
}

// CleanChunk is how many rows one statement of the default partition's cleanup deletes.
const CleanChunk = 1000

// cleanDefault deletes the processed rows created before cutoff from PostgreSQL's default partition,
// CleanChunk at a time. The default partition only fills when partitions were not made ahead (the
// relays were stopped for longer than Ahead intervals); its rows cannot be dropped with a partition.
func (t Table) cleanDefault(ctx context.Context, conn *sql.Conn, d Partition, cutoff time.Time) (int64, error) {
	ref := "ONLY " + t.qualify(d.Name)
	var deleted int64
	for {
		res, err := conn.ExecContext(ctx, `DELETE FROM `+ref+` WHERE ctid = ANY(ARRAY(SELECT ctid FROM `+ref+
			` WHERE processed = true AND created_at < $1 LIMIT `+fmt.Sprint(CleanChunk)+`))`, cutoff)
		if err != nil {
			return deleted, err
		}
		n, err := res.RowsAffected()
		deleted += n
		if err != nil || n < CleanChunk {
			return deleted, err
		}
	}
}
