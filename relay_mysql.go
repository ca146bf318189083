package outboxplugin

import (
	"context"
	"database/sql"
	"strings"
	"time"
)

// mysqlRelay is the relay's SQL on MySQL and MariaDB, which have no UPDATE … RETURNING and cannot
// UPDATE a table through a LIMIT subquery on itself: a claim is a short transaction, SELECT (due run)
// UNION ALL (fresh run) FOR UPDATE SKIP LOCKED, then UPDATE of the rows found.
type mysqlRelay struct {
	claimSelect, claimStamp string

	// tx are the options of a claim's transaction: nil, the server's default (REPEATABLE READ). At
	// REPEATABLE READ a claim whose scan reaches the end of the claim index's fresh run locks the gap
	// where the application's next events go, so their inserts wait for it; READ COMMITTED would not.
	// Measured on MariaDB (docs/relay.md): READ COMMITTED brought the application's median Create
	// during claims to 0.84-0.95 of its latency, and cut one worker's throughput to about 0.55 of its
	// rate at REPEATABLE READ — a bad trade, so claims keep the default. BenchmarkInsertDuringClaims
	// and BenchmarkRelayThroughput compare the two (UseClaimIsolation).
	tx *sql.TxOptions
}

func (d *mysqlRelay) build(q *relaySQL, p claimParts) {
	// Read before the stamp: the unfinished-delivery mark as the stamp will set it. MariaDB runs both
	// runs of a UNION to the end of their LIMIT, so a claim locks up to the due rows more than it
	// takes, until its transaction commits a moment later; other relays skip them meanwhile. It sorts
	// when an ORDER BY names the columns the predicate fixes, so each run names only the others.
	cols := strings.Replace(prefixColumns("c.", returnedColumns), "c.last_error",
		`CASE WHEN c.locked_by IS NOT NULL THEN '`+unfinishedDelivery+`' ELSE c.last_error END AS last_error`, 1)
	d.claimSelect = `(` + p.run(cols, p.due, `c.next_attempt_at, c.created_at, c.id`) + `) UNION ALL (` +
		p.run(cols, p.fresh, `c.created_at, c.id`) + `)` + p.limit
	d.claimStamp = p.stamp // + id IN (...)
}

func (d *mysqlRelay) claim(ctx context.Context, q *relaySQL, owner string, now, leaseUntil time.Time, prev *doneBatch, deleteDone bool) (claimed []claimedRow, marked int64, err error) {
	err = q.inTxAt(ctx, d.tx, func(tx *sql.Tx) error {
		if prev != nil {
			var err error
			if marked, err = q.markDone(ctx, tx, owner, *prev, deleteDone); err != nil {
				return err
			}
		}
		rows, err := tx.QueryContext(ctx, d.claimSelect, q.pickArgs(now)...)
		if err != nil {
			return err
		}
		// Read before the stamp, which adds the attempt.
		if claimed, err = q.scanClaimed(rows, 1, false, nil); err != nil || len(claimed) == 0 {
			return err
		}
		in, ids := d.idList(rowIDs(claimed))
		_, err = tx.ExecContext(ctx, d.claimStamp+in, append([]any{owner, leaseUntil}, ids...)...)
		return err
	})
	return claimed, marked, err
}

func (*mysqlRelay) bind(query string) string { return query }

func (*mysqlRelay) idList(ids []int64) (string, []any) { return inList(ids) }

func (*mysqlRelay) rowsMatch(ids []int64, _ []string) (string, []any) { return inList(ids) }

func (*mysqlRelay) renew(ctx context.Context, db *sql.DB, query string, args []any) (map[int64]string, int64, error) {
	return execRenew(ctx, db, query, args)
}

// cleanupQuery: MySQL takes LIMIT on DELETE, but not in a subquery of the table it deletes from.
func (*mysqlRelay) cleanupQuery(table string) string {
	return `DELETE FROM ` + table + ` WHERE processed = true AND created_at < ? LIMIT ?`
}

// tryLock takes a GET_LOCK lock. Its names are server-wide: the name holds the database's, hashed to
// fit its 64 characters.
func (*mysqlRelay) tryLock(ctx context.Context, conn *sql.Conn, name string) (func(), bool, error) {
	const lockName = `CONCAT('outboxplugin.cleanup.', SHA1(CONCAT(DATABASE(), '.', ?)))`
	var n sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+lockName+`, 0)`, name).Scan(&n); err != nil || n.Int64 != 1 {
		return nil, false, err
	}
	return func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(`+lockName+`)`, name)
	}, true, nil
}

// clock drops the nanoseconds: go-sql-driver sends a time with them, and MariaDB then bounds no index
// range on a DATETIME(6) column by it (the due run would be scanned to its end).
func (*mysqlRelay) clock(now time.Time) time.Time { return now.Truncate(time.Microsecond) }

func (*mysqlRelay) listens() bool { return false }
