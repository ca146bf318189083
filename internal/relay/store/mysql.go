package store

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/sqlerr"
)

// mysqlRelay is the relay's SQL on MySQL and MariaDB, which have no UPDATE … RETURNING and cannot
// UPDATE a table through a LIMIT subquery on itself: a claim is a short transaction that finds its
// candidates without locks, locks them by primary key with SKIP LOCKED, and UPDATEs the rows it got.
//
// No claim statement reads a range under locks. At REPEATABLE READ a locking range scan takes
// next-key locks, and the end of the claim index's runs is the gap where the application inserts its
// next events: a claim there made the application's inserts wait, and made some of them deadlock
// victims (InnoDB chose the application's transaction, which had written less). Candidates are read
// from the transaction's snapshot instead (the due run, then a batch of the fresh run, and the next
// ones of the same snapshot when relays claiming at once hold those), and locked by primary key,
// which takes record locks only; the lock re-reads each row as it is now, and one that another relay
// took or finished meanwhile no longer matches (or is skipped while that relay holds it).
//
// Per-key ordering needs nothing more. Its condition (no earlier unprocessed event of the key, none
// of it leased) is read with the candidates, from the snapshot, so that the candidates are the heads
// of their keys there, one per key: rows committed after the snapshot are not candidates at all. The
// lock then hands out a head only if it is still unprocessed, not leased and due now. Another relay
// can only hold a row of the key if that row was the head in its own snapshot, with every earlier row
// processed — for ever, since processed is final: if it held a later row, this head would be
// processed now; if an earlier one, that row would be processed in this snapshot and not leased now;
// if this head, the lock skips it or sees its lease. (The earlier claim checked the key in a subquery
// of its locking read, which reads the rows as they are now while the subquery read the snapshot:
// two events of one key committed after the snapshot both passed it.)
type mysqlRelay struct {
	probe, lockDue, lockFresh, claimStamp string
	// claimStampFresh is claimStamp for a batch of which no row was taken over from an expired lease:
	// it leaves attempt_history alone, where claimStamp assigns it (to itself, but for such rows) in
	// every row it stamps.
	claimStampFresh string
	// probeArgs, lockDueArgs and lockFreshArgs are how many clock values each statement binds (only
	// with the worker's clock).
	probeArgs, lockDueArgs, lockFreshArgs int
	// probeMore reads the fresh run's next window (window rows) past an OFFSET, binding probeMoreArgs
	// clock values and the offset.
	probeMore             string
	probeMoreArgs, window int

	// tx are the options of a claim's transaction: nil, the server's default (REPEATABLE READ).
	// BenchmarkInsertDuringClaims and BenchmarkRelayThroughput compare levels (UseClaimIsolation).
	tx *sql.TxOptions
	// afterLock, when set (by tests), runs in a claim between its locks and its stamp.
	afterLock func()

	db    *sql.DB
	times timeLiterals
	// partitionedTx are the options of the relay's transactions on a partitioned table (nil on a plain
	// one): READ COMMITTED. The statements that address rows by id take record locks only on a plain
	// table, whose primary key is the id. A partitioned table's is (id, created_at): an id is a prefix
	// of it, and at REPEATABLE READ its lookup locks the gap after the row too, where the
	// application inserts (TestPartitionMaintenanceBesideWritersAndRelays had writers' inserts as
	// deadlock victims of the claim's stamp in about one run in ten). READ COMMITTED takes no gap
	// locks; what a claim decides on comes from its locking reads, which read the latest committed
	// rows at any level.
	partitionedTx *sql.TxOptions
}

func (d *mysqlRelay) build(q *Store, p claimParts) {
	if q.partitioned {
		d.partitionedTx = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
		if d.tx == nil {
			d.tx = d.partitionedTx
		}
	}
	// Read before the stamp: the unfinished-delivery mark as the stamp will set it. MariaDB sorts when
	// an ORDER BY names the columns the predicate fixes, so each run names only the others.
	cols := strings.Replace(prefixColumns("c.", returnedColumns), "c.last_error",
		`CASE WHEN c.`+leaseHeld+` THEN '`+UnfinishedDelivery+`' ELSE c.last_error END AS last_error`, 1)
	// The probe reads a batch of the fresh run; a relay that finds those held by other relays reads
	// on, from the same snapshot (probeMore).
	d.window = q.batchSize
	window := ` LIMIT ` + strconv.Itoa(d.window)
	freshRun := `(SELECT c.id, 1 FROM ` + p.table + ` c WHERE ` + p.fresh + ` ORDER BY c.created_at, c.id` + window
	d.probe = `(SELECT c.id, 0 FROM ` + p.table + ` c WHERE ` + p.due +
		` ORDER BY c.next_attempt_at, c.created_at, c.id` + p.limit + `) UNION ALL ` + freshRun + `)`
	d.probeArgs = strings.Count(p.due+p.fresh, "?")
	d.probeMore = freshRun + ` OFFSET ?)`
	d.probeMoreArgs = strings.Count(p.fresh, "?")
	// Locked by primary key, in key order; the rows must still match what the probe found them to be.
	d.lockDue = `SELECT ` + cols + ` FROM ` + p.table + ` c WHERE c.id IN (%s) AND ` + p.dueBase + ` ORDER BY c.id ` + p.lock
	d.lockDueArgs = strings.Count(p.dueBase, "?")
	// The fresh rows take what the due ones leave of the batch: its LIMIT is bound.
	d.lockFresh = `SELECT ` + cols + ` FROM ` + p.table + ` c WHERE c.id IN (%s) AND ` + p.freshBase + ` ORDER BY c.id LIMIT ? ` + p.lock
	d.lockFreshArgs = strings.Count(p.freshBase, "?")
	d.claimStamp = p.stamp // + id IN (...)
	d.claimStampFresh = p.stampFresh
}

// candidate is a row the claim's probe found in its snapshot.
type candidate struct {
	id  int64
	due bool
}

func (d *mysqlRelay) claim(ctx context.Context, q *Store, owner string, now time.Time, prev *Done, deleteDone bool) (claimed []Row, marked int64, err error) {
	now = d.clock(now)
	err = q.inTxAt(ctx, d.tx, func(tx *sql.Tx) error {
		claimed = nil
		if prev != nil {
			var err error
			if marked, err = q.MarkDone(ctx, tx, owner, *prev, deleteDone); err != nil {
				return err
			}
		}
		cands, err := d.probeCandidates(ctx, tx, q, now)
		if err != nil || len(cands) == 0 {
			return err
		}
		claimed, err = d.lockCandidates(ctx, tx, q, now, cands)
		if err != nil || len(claimed) == 0 {
			return err
		}
		if d.afterLock != nil {
			d.afterLock()
		}
		sortClaimed(claimed)
		in, ids := d.idList(RowIDs(claimed))
		// The rows were read under their locks, with the unfinished-delivery mark as the stamp sets
		// it: when none has it, no row's history changes, and the stamp need not touch the column.
		stamp := d.claimStampFresh
		if slices.ContainsFunc(claimed, func(r Row) bool { return r.Unfinished }) {
			stamp = d.claimStamp
		}
		head := append([]any{owner}, q.clock.laterArgs(now, q.lease, false)...)
		query, args := d.literal(stamp+in, append(head, ids...))
		_, err = tx.ExecContext(ctx, query, args...)
		return err
	})
	return claimed, marked, err
}

// probeCandidates reads the due run and a batch of the fresh run from the transaction's
// snapshot, without locks.
func (d *mysqlRelay) probeCandidates(ctx context.Context, tx *sql.Tx, q *Store, now time.Time) ([]candidate, error) {
	query, args := d.literal(d.probe, q.clock.args(now, d.probeArgs))
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []candidate
	for rows.Next() {
		var c candidate
		var run int
		if err := rows.Scan(&c.id, &run); err != nil {
			return nil, err
		}
		c.due = run == 0
		out = append(out, c)
	}
	return out, rows.Err()
}

// probeFresh reads the ids of the fresh run's window past offset, from the transaction's snapshot.
func (d *mysqlRelay) probeFresh(ctx context.Context, tx *sql.Tx, q *Store, now time.Time, offset int) ([]int64, error) {
	query, args := d.literal(d.probeMore, append(q.clock.args(now, d.probeMoreArgs), offset))
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		var run int
		if err := rows.Scan(&id, &run); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// lockCandidates locks the candidates by primary key, skipping those another relay holds and those
// no longer pending, and returns up to a batch of them: the due ones first.
func (d *mysqlRelay) lockCandidates(ctx context.Context, tx *sql.Tx, q *Store, now time.Time, cands []candidate) ([]Row, error) {
	var due, fresh []int64
	for _, c := range cands {
		if c.due {
			due = append(due, c.id)
		} else {
			fresh = append(fresh, c.id)
		}
	}
	var claimed []Row
	if len(due) > 0 {
		in, ids := inList(due)
		query, args := d.literal(strings.Replace(d.lockDue, "c.id IN (%s)", "c."+in, 1), append(ids, q.clock.args(now, d.lockDueArgs)...))
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		// Read before the stamp, which adds the attempt.
		if claimed, err = q.scanClaimed(rows, 1, false, nil); err != nil {
			return nil, err
		}
	}
	// The fresh candidates are locked in probe order, as many at a time as the batch has room for (at
	// least half a batch): a relay alone gets its batch with the first statement. When other relays
	// hold some of a full window's rows, or took them since the probe, the relay reads the next
	// window of its snapshot, up to twice.
	offset, windowFull := d.window, len(fresh) == d.window
	for left, windows := q.batchSize-len(claimed), 0; left > 0; left = q.batchSize - len(claimed) {
		if len(fresh) == 0 {
			if !windowFull || windows == 2 {
				break
			}
			windows++
			var err error
			if fresh, err = d.probeFresh(ctx, tx, q, now, offset); err != nil {
				return nil, err
			}
			offset += d.window
			windowFull = len(fresh) == d.window
			continue
		}
		next := fresh[:min(max(left, (q.batchSize+1)/2), len(fresh))]
		fresh = fresh[len(next):]
		in, ids := inList(next)
		args := append(ids, q.clock.args(now, d.lockFreshArgs)...)
		query, args := d.literal(strings.Replace(d.lockFresh, "c.id IN (%s)", "c."+in, 1), append(args, left))
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		got, err := q.scanClaimed(rows, 1, false, nil)
		if err != nil {
			return nil, err
		}
		claimed = append(claimed, got...)
	}
	return claimed, nil
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
// would. It asks the server to echo a winter and a summer time; until a probe succeeds times stay
// arguments. For the literals a failed probe is tried again no sooner than probeRetry later: a probe
// waits up to 5 s for a connection, and a caller that holds the pool's only one (an Admin cleanup on a
// pool of one) paid that wait at every statement.
type timeLiterals struct {
	mu       sync.Mutex
	known    bool
	isUTC    bool
	attempts int       // probes run, for tests
	next     time.Time // no probe before then, after a failed one
}

// probeRetry is how long after a failed probe the next one waits.
const probeRetry = time.Minute

func (t *timeLiterals) utc(db *sql.DB) bool {
	if db == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	utc, err := t.probe(ctx, db, true)
	return err == nil && utc
}

// errProbeLater: a probe failed a moment ago, and is not tried again yet.
var errProbeLater = errors.New("the time probe failed a moment ago")

// probe is utc with the error of a probe that could not run.
// With backoff (the literals' probe) it runs no sooner than probeRetry after a failed one; without it
// (the claim's statements being written, which cannot go on without the answer) it always runs.
func (t *timeLiterals) probe(ctx context.Context, db *sql.DB, backoff bool) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.known {
		return t.isUTC, nil
	}
	if backoff && time.Now().Before(t.next) {
		return false, errProbeLater
	}
	t.attempts++
	t.next = time.Now().Add(probeRetry)
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

// cleanupQuery reads the ids of a chunk of old processed rows, which cleanupDelete then deletes by
// primary key (cleanupByKey): no cleanup statement locks a range. A DELETE that read its rows from an
// index under locks took a next-key lock on the first processed entry, and the gap before it is where
// the application inserts its events whenever the table holds no retry, delayed or dead event: the
// application's inserts waited for every chunk, and for as long as the chunk waited on a row lock
// (TestCleanupRunsBesideThePublishingLoop).
//
// The rows are read from the claim index (outboxplugin.Admin.processedGroup): its run of processed rows, up to the
// cutoff. A relay of a version before the mark cleared next_attempt_at (markProcessed) leaves its
// retried and delayed rows outside that run, in the next one, ordered by that time: they are taken
// once it too lies before the cutoff (the time is never before created_at, unless a DeliverAt was set
// in the past), with a second range of the same index. The cutoff is spelled inside the first range
// for the optimizer to bound it there: with created_at only outside the OR, MariaDB read the whole
// run of processed rows (249 875 entries, Handler_read_next) for a chunk that found nothing to
// delete; written so, two index look-ups.
func (*mysqlRelay) cleanupQuery(table string) string {
	return `SELECT id FROM ` + table + ` WHERE processed = true AND dead_at IS NULL AND ` +
		`((next_attempt_at IS NULL AND created_at < ?) OR next_attempt_at < ?) AND created_at < ? LIMIT ?`
}

// cleanupDelete deletes the rows cleanupQuery found, which must still be processed (a replay makes a
// row pending again): the head of the statement, followed by the id list.
func (*mysqlRelay) cleanupDelete(table string) string {
	return `DELETE FROM ` + table + ` WHERE processed = true AND `
}

// tryLock takes a GET_LOCK lock, held by conn's session until release (the statements under it run
// on conn, each its own transaction). Its names are server-wide: the name holds the database's,
// hashed to fit its 64 characters.
func (*mysqlRelay) tryLock(ctx context.Context, conn *sql.Conn, name string) (QueryExecer, func(bool) error, bool, error) {
	const lockName = `CONCAT('outboxplugin.cleanup.', SHA1(CONCAT(DATABASE(), '.', ?)))`
	var n sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+lockName+`, 0)`, name).Scan(&n); err != nil || n.Int64 != 1 {
		return nil, nil, false, err
	}
	return conn, func(bool) error {
		// The statements under the lock have committed: a failed release is no failure of theirs.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(`+lockName+`)`, name)
		return nil
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
	utc, err := d.times.probe(ctx, db, false)
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

// sessionSetup: MariaDB's idle_transaction_timeout (whole seconds). MySQL has no such setting
// (unknownSetting): there a transaction cut off by a partition lasts until the server notices the
// connection is gone (its TCP keepalive), and docs/relay.md says so.
func (*mysqlRelay) sessionSetup(d time.Duration) string {
	return `SET SESSION idle_transaction_timeout = ` + strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

func (*mysqlRelay) sessionReset() string { return `SET SESSION idle_transaction_timeout = DEFAULT` }

// txSetup: MariaDB's setting is per session (sessionSetup).
func (*mysqlRelay) txSetup(time.Duration) string { return "" }

// unknownSetting: error 1193, an unknown system variable.
func (*mysqlRelay) unknownSetting(err error) bool {
	n, ok := sqlerr.MySQLNumber(err)
	return ok && n == 1193
}

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
