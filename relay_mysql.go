package outboxplugin

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// mysqlRelay is the relay's SQL on MySQL and MariaDB, which have no UPDATE … RETURNING and cannot
// UPDATE a table through a LIMIT subquery on itself: a claim is a short transaction that reads the
// rows with FOR UPDATE SKIP LOCKED, then UPDATEs the rows found.
//
// The due run is first read without locks, and only the rows it finds are then locked, by primary key.
// At REPEATABLE READ a locking read takes a next-key lock on the first record past its range, and past
// the due run (which is empty most of the time) comes the gap after the last fresh event, where every
// new event goes: a locking read of it would hold up the application's inserts during every claim, and
// deadlocked two relays whose marks move rows into the processed part of the index. The fresh run is
// read with locks; its scan stops at the batch, and reaches the end of the run only when the relay
// has caught up (see tx).
type mysqlRelay struct {
	dueProbe, dueLock, freshSelect, claimStamp string
	// claimStampFresh is claimStamp for a batch of which no row was taken over from an expired lease:
	// it leaves attempt_history alone, where claimStamp assigns it (to itself, but for such rows) in
	// every row it stamps.
	claimStampFresh string

	// tx are the options of a claim's transaction: nil, the server's default (REPEATABLE READ). At
	// REPEATABLE READ a claim whose scan reaches the end of the claim index's fresh run locks the gap
	// where the application's next events go, so their inserts wait for it; READ COMMITTED would not.
	// Measured on MariaDB (docs/relay.md): READ COMMITTED brought the application's median Create
	// during claims to 0.84-0.95 of its latency, and cut one worker's throughput to about 0.55 of its
	// rate at REPEATABLE READ — a bad trade, so claims keep the default. BenchmarkInsertDuringClaims
	// and BenchmarkRelayThroughput compare the two (UseClaimIsolation).
	tx *sql.TxOptions

	db    *sql.DB
	times timeLiterals
}

func (d *mysqlRelay) build(q *relaySQL, p claimParts) {
	// Read before the stamp: the unfinished-delivery mark as the stamp will set it. MariaDB sorts when
	// an ORDER BY names the columns the predicate fixes, so each run names only the others.
	cols := strings.Replace(prefixColumns("c.", returnedColumns), "c.last_error",
		`CASE WHEN c.locked_by IS NOT NULL THEN '`+unfinishedDelivery+`' ELSE c.last_error END AS last_error`, 1)
	const dueOrder = `c.next_attempt_at, c.created_at, c.id`
	d.dueProbe = `SELECT c.id FROM ` + p.table + ` c WHERE ` + p.due + ` ORDER BY ` + dueOrder + p.limit
	d.dueLock = `SELECT ` + cols + ` FROM ` + p.table + ` c WHERE c.id IN (%s) AND ` + p.due + ` ` + p.lock
	// The fresh run takes what the due rows leave of the batch: its LIMIT is bound.
	d.freshSelect = `SELECT ` + cols + ` FROM ` + p.table + ` c WHERE ` + p.fresh + ` ORDER BY c.created_at, c.id LIMIT ? ` + p.lock
	d.claimStamp = p.stamp // + id IN (...)
	d.claimStampFresh = p.stampFresh
}

func (d *mysqlRelay) claim(ctx context.Context, q *relaySQL, owner string, now time.Time, prev *doneBatch, deleteDone bool) (claimed []claimedRow, marked int64, err error) {
	args := q.pickArgs(now)
	dueArgs, freshArgs := args[:len(args)-q.freshArgCount()], args[len(args)-q.freshArgCount():]
	err = q.inTxAt(ctx, d.tx, func(tx *sql.Tx) error {
		claimed = nil
		if prev != nil {
			var err error
			if marked, err = q.markDone(ctx, tx, owner, *prev, deleteDone); err != nil {
				return err
			}
		}
		due, err := d.probeDue(ctx, tx, dueArgs)
		if err != nil {
			return err
		}
		if len(due) > 0 {
			in, ids := inList(due)
			query, args := d.literal(strings.Replace(d.dueLock, "c.id IN (%s)", "c."+in, 1), append(ids, dueArgs...))
			rows, err := tx.QueryContext(ctx, query, args...)
			if err != nil {
				return err
			}
			// Read before the stamp, which adds the attempt.
			if claimed, err = q.scanClaimed(rows, 1, false, nil); err != nil {
				return err
			}
		}
		if left := q.batchSize - len(claimed); left > 0 {
			query, args := d.literal(d.freshSelect, append(freshArgs, left))
			rows, err := tx.QueryContext(ctx, query, args...)
			if err != nil {
				return err
			}
			fresh, err := q.scanClaimed(rows, 1, false, nil)
			if err != nil {
				return err
			}
			claimed = append(claimed, fresh...)
		}
		if len(claimed) == 0 {
			return nil
		}
		sortClaimed(claimed)
		in, ids := d.idList(rowIDs(claimed))
		// The rows were read under their locks, with the unfinished-delivery mark as the stamp sets
		// it: when none has it, no row's history changes, and the stamp need not touch the column.
		stamp := d.claimStampFresh
		if slices.ContainsFunc(claimed, func(r claimedRow) bool { return r.unfinished }) {
			stamp = d.claimStamp
		}
		head := append([]any{owner}, q.clock.laterArgs(d.clock(now), q.lease, false)...)
		query, args := d.literal(stamp+in, append(head, ids...))
		_, err = tx.ExecContext(ctx, query, args...)
		return err
	})
	return claimed, marked, err
}

// probeDue returns the ids of the due run, read without locks.
func (d *mysqlRelay) probeDue(ctx context.Context, tx *sql.Tx, args []any) ([]int64, error) {
	query, args := d.literal(d.dueProbe, args)
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

func (*mysqlRelay) bind(query string) string { return query }

// literal writes the arguments of the relay's statements into their text. go-sql-driver sends a
// statement with arguments as three commands, PREPARE, EXECUTE and CLOSE, two of them round trips
// (unless the application's DSN sets interpolateParams); written as literals it is one query. A claim
// is five statements, so that is five round trips less per batch (docs/benchmarks.md). Only values
// whose literal is beyond doubt are written: integers, booleans, NULL, strings of plain characters
// (owner ids, the relay's own error texts are passed as arguments), and times once the driver is known
// to send them in UTC (timeLiterals); with any other argument the statement is left as it is.
func (d *mysqlRelay) literal(query string, args []any) (string, []any) {
	if len(args) == 0 {
		return query, args
	}
	utc := d.times.utc(d.db)
	var b strings.Builder
	b.Grow(len(query) + 12*len(args))
	n, quoted := 0, false
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case c == '\'' || c == '\\':
			// The relay's statements quote no backslash; a query that does is left alone.
			if c == '\\' {
				return query, args
			}
			quoted = !quoted // '' inside a literal toggles twice
		case c == '?' && !quoted:
			if n == len(args) || !appendLiteral(&b, args[n], utc) {
				return query, args
			}
			n++
			continue
		}
		b.WriteByte(c)
	}
	if n != len(args) {
		return query, args
	}
	return b.String(), nil
}

// appendLiteral writes v as a MySQL literal, or reports that it would not.
func appendLiteral(b *strings.Builder, v any, utcTimes bool) bool {
	switch x := v.(type) {
	case nil:
		b.WriteString("NULL")
	case int:
		b.WriteString(strconv.Itoa(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case bool:
		if x {
			b.WriteString("TRUE")
		} else {
			b.WriteString("FALSE")
		}
	case time.Time:
		if !utcTimes {
			return false
		}
		b.WriteByte('\'')
		b.WriteString(x.UTC().Format("2006-01-02 15:04:05.000000"))
		b.WriteByte('\'')
	case string:
		for i := 0; i < len(x); i++ {
			if c := x[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
				return false
			}
		}
		b.WriteByte('\'')
		b.WriteString(x)
		b.WriteByte('\'')
	default:
		return false
	}
	return true
}

// timeLiterals finds out, once, whether the driver sends times in UTC (go-sql-driver converts them to
// the DSN's loc, UTC unless it says otherwise): only then does a literal in UTC store what the driver
// would. It asks the server to echo a winter and a summer time; a failed probe is tried again at the
// next statement, and until it succeeds times stay arguments.
type timeLiterals struct {
	mu    sync.Mutex
	known bool
	isUTC bool
}

func (t *timeLiterals) utc(db *sql.DB) bool {
	if db == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	utc, err := t.probe(ctx, db)
	return err == nil && utc
}

// probe is utc with the error of a probe that could not run.
func (t *timeLiterals) probe(ctx context.Context, db *sql.DB) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.known {
		return t.isUTC, nil
	}
	winter := time.Date(2001, 1, 2, 3, 4, 5, 123456000, time.UTC)
	summer := time.Date(2001, 7, 2, 3, 4, 5, 123456000, time.UTC)
	var w, s string
	if err := db.QueryRowContext(ctx, `SELECT CAST(? AS CHAR), CAST(? AS CHAR)`, winter, summer).Scan(&w, &s); err != nil {
		return false, err
	}
	t.known = true
	t.isUTC = w == "2001-01-02 03:04:05.123456" && s == "2001-07-02 03:04:05.123456"
	return t.isUTC, nil
}

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

// timeSQL reads the server's clock in UTC, UTC_TIMESTAMP(6), when the driver sends times in UTC (its
// default), the zone the stored times are then in: the application's delayed events and the relay's
// leases compare alike. A driver that sends them in another zone (a DSN with loc=Local on a host not
// in UTC) stores local times, which the server's UTC clock cannot be compared with: the statements
// then take the worker's clock, as the application's writes do, and relays' clocks must agree.
func (d *mysqlRelay) timeSQL(ctx context.Context, db *sql.DB) (dbTime, error) {
	utc, err := d.times.probe(ctx, db)
	if err != nil {
		return dbTime{}, err
	}
	if !utc {
		return boundTime, nil
	}
	return dbTime{
		now: `UTC_TIMESTAMP(6)`,
		later: func(dur time.Duration) string {
			return `(UTC_TIMESTAMP(6) + INTERVAL ` + strconv.FormatInt(dur.Microseconds(), 10) + ` MICROSECOND)`
		},
		by: `(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`,
	}, nil
}

func (*mysqlRelay) listens() bool { return false }

// retryable reports MySQL's error 1213: InnoDB chose the claim's transaction as a deadlock's victim and
// rolled it back whole (the mark of the previous batch included). With several relays on MariaDB about
// one claim in a few hundred meets one (BenchmarkRelayThroughput's worker-errors): a claim's locking
// read and another claim's mark, which moves rows into the processed part of the indexes, take their
// locks in different orders. Run again, the claim goes through. The check reads the driver's error
// text ("Error 1213 (40001): …"), so that the core module needs no MySQL driver.
func (*mysqlRelay) retryable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Error 1213 (40001)")
}

// appendHistory appends with JSON_ARRAY_APPEND, after a path range of the last keep entries (a range
// always returns an array; one that starts before the first entry starts at it). A NULL history, or an
// empty one (whose range matches nothing), is an empty array.
func (*mysqlRelay) appendHistory(keep int, entry string) string {
	if keep == 0 {
		return `JSON_ARRAY(` + entry + `)`
	}
	return `JSON_ARRAY_APPEND(COALESCE(JSON_EXTRACT(attempt_history, '$[last-` + strconv.Itoa(keep-1) + ` to last]'), JSON_ARRAY()), '$', ` + entry + `)`
}

// jsonParam parses the text with JSON_EXTRACT: a plain string would be appended as a JSON string.
func (*mysqlRelay) jsonParam() string { return `JSON_EXTRACT(?, '$')` }

func (*mysqlRelay) jsonObject(pairs ...string) string {
	return `JSON_OBJECT(` + strings.Join(pairs, ", ") + `)`
}
