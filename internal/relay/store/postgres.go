package store

import (
	"context"
	"database/sql"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/sqlerr"
)

// pgRelay is the relay's SQL on PostgreSQL. A claim is one statement, UPDATE … WHERE ctid =
// ANY(ARRAY(due run UNION ALL fresh run)) RETURNING: the rows are addressed by the ctid taken under
// the lock the subquery holds (a TID scan instead of a primary-key probe per row). Run's claims also
// mark the previous batch done, in a CTE of the same statement, and report how many rows that mark
// found still leased in one extra row of the result.
type pgRelay struct {
	claimUpdate, claimAfterDone, claimAfterDelete string
}

// pgAsyncCommit is a CTE that turns synchronous_commit off for the claim's own transaction (the
// statement runs alone, so that is the statement): see docs/relay.md, "Asynchronous commits".
const pgAsyncCommit = `relay_async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))`

// pgRowMatch finds leased rows on PostgreSQL by the ctid their claim returned, a TID scan instead of
// a primary-key probe per row. The id must match too: a row whose lease was taken over has moved to
// a new ctid, and its old slot may in time hold another row.
const pgRowMatch = `ctid = ANY(?::tid[]) AND id = ANY(?::bigint[])`

func (d *pgRelay) build(q *Store, p claimParts) {
	claim := strings.Replace(p.stamp, " WHERE ", " FROM relay_async WHERE ", 1) +
		`ctid = ANY(ARRAY(` + p.pickUnion("ctid") + `)) RETURNING ` + returnedColumns + `, ctid::text`
	with := `WITH ` + pgAsyncCommit
	if q.partitioned {
		// A partitioned table's ctids are its partitions': the same ctid can address a row in each. The
		// rows picked are matched by their id too (which the table's sequence keeps unique), each
		// partition still read by a TID scan.
		with += `, relay_pick AS MATERIALIZED (` + p.pickUnion("ctid, id") + `)`
		claim = strings.Replace(p.stamp, " WHERE ", " FROM relay_async WHERE ", 1) +
			`ctid = ANY(ARRAY(SELECT ctid FROM relay_pick)) AND id = ANY(ARRAY(SELECT id FROM relay_pick)) RETURNING ` + returnedColumns + `, ctid::text`
	}
	d.claimUpdate = d.bind(with + ` ` + claim)
	// The previous batch is marked done in the same statement. Its rows are leased to this worker, so
	// the claim's subquery (which sees the table as it was before the statement) does not pick them
	// again. Each claimed row comes with -1 before its columns; one more row carries the number of
	// rows the mark found still leased to the worker (fewer than the batch: leases lost), with
	// placeholders of the claimed rows' types in the other columns.
	marked := func(done string) string {
		return d.bind(with + `, done AS (` + done + ` WHERE ` + pgRowMatch + ` AND locked_by = ? RETURNING 1), ` +
			`claimed AS (` + claim + `) SELECT -1, claimed.* FROM claimed UNION ALL ` +
			`SELECT count(*), 0, '', '', '', '', NULL, NULL, NULL, 0, NULL, '' FROM done`)
	}
	d.claimAfterDone = marked(`UPDATE ` + q.table + ` SET ` + markProcessed + q.clock.now + `, locked_by = NULL, locked_until = NULL`)
	d.claimAfterDelete = marked(`DELETE FROM ` + q.table)
}

func (d *pgRelay) claim(ctx context.Context, q *Store, owner string, now time.Time, prev *Done, deleteDone bool) ([]Row, int64, error) {
	claimArgs := q.claimArgs(owner, now)
	if prev == nil {
		rows, err := q.db.QueryContext(ctx, d.claimUpdate, claimArgs...)
		if err != nil {
			return nil, 0, err
		}
		claimed, err := q.scanClaimed(rows, 0, true, nil)
		return claimed, 0, err
	}
	// claimAfterDone's text is written with pgRowMatch; rowsMatch gives its arguments.
	_, match := d.rowsMatch(prev.IDs, prev.Ctids)
	match = append(match, owner)
	query := d.claimAfterDelete
	if !deleteDone {
		query = d.claimAfterDone
		match = append(q.clock.args(prev.Now, 1), match...)
	}
	rows, err := q.db.QueryContext(ctx, query, append(match, claimArgs...)...)
	if err != nil {
		return nil, 0, err
	}
	var marked int64
	claimed, err := q.scanClaimed(rows, 0, true, &marked)
	return claimed, marked, err
}

// bind rewrites ? placeholders as PostgreSQL's $n.
func (*pgRelay) literal(query string, args []any) (string, []any) { return query, args }

func (*pgRelay) bind(query string) string {
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

// idList selects ids with = ANY($n::bigint[]) and one array: one statement text for every batch size.
func (*pgRelay) idList(ids []int64) (string, []any) {
	b := make([]byte, 0, 2+len(ids)*8)
	b = append(b, '{')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return "id = ANY(?::bigint[])", []any{string(append(b, '}'))}
}

func (d *pgRelay) rowsMatch(ids []int64, ctids []string) (string, []any) {
	_, idArgs := d.idList(ids)
	if len(ctids) != len(ids) {
		return "id = ANY(?::bigint[])", idArgs
	}
	return pgRowMatch, []any{pgTextArray(ctids), idArgs[0]}
}

// pgTextArray writes an array literal of values that need no escaping (ctids: "(12,3)").
func pgTextArray(values []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range values {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(v)
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// renew returns where each renewed row now is: an UPDATE moves a row to a new ctid.
func (*pgRelay) renew(ctx context.Context, db *sql.DB, query string, args []any) (map[int64]string, int64, error) {
	rows, err := db.QueryContext(ctx, query+` RETURNING id, ctid::text`, args...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	moved := make(map[int64]string)
	for rows.Next() {
		var id int64
		var ctid string
		if err := rows.Scan(&id, &ctid); err != nil {
			return nil, 0, err
		}
		moved[id] = ctid
	}
	return moved, int64(len(moved)), rows.Err()
}

func (*pgRelay) cleanupQuery(table string) string {
	return `DELETE FROM ` + table + ` WHERE id IN (SELECT id FROM ` + table + ` WHERE processed = true AND created_at < ? LIMIT ?)`
}

// tryLock takes a transaction-scoped advisory lock keyed by a hash of name, in a transaction begun on
// conn; release commits it (keep) or rolls it back, and the lock ends with it. A session lock would
// not do behind a transaction pooler: the pooler hands the server connection that holds it to other
// clients between transactions, and the unlock may run on another.
func (*pgRelay) tryLock(ctx context.Context, conn *sql.Conn, name string) (QueryExecer, func(bool) error, bool, error) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	key := int64(h.Sum64())
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, false, err
	}
	var got bool
	if err := tx.QueryRowContext(ctx, `SELECT pg_try_advisory_xact_lock($1)`, key).Scan(&got); err != nil || !got {
		_ = tx.Rollback()
		return nil, nil, false, err
	}
	return tx, func(keep bool) error {
		if keep {
			return tx.Commit()
		}
		return tx.Rollback()
	}, true, nil
}

func (*pgRelay) clock(now time.Time) time.Time { return now }

// timeSQL reads PostgreSQL's clock: now(), the start of the statement's transaction (a claim and a
// renewal are statements of their own).
func (*pgRelay) timeSQL(context.Context, *sql.DB) (dbTime, error) {
	return dbTime{
		now: `now()`,
		later: func(d time.Duration) string {
			return `(now() + interval '` + strconv.FormatInt(d.Microseconds(), 10) + ` microseconds')`
		},
		by: `(now() + ?::bigint * interval '1 microsecond')`,
	}, nil
}

func (*pgRelay) listens() bool { return true }

// sessionSetup: PostgreSQL's idle_in_transaction_session_timeout is set per transaction (txSetup).
// The relay's transactions are rare there (claims and marks are single statements).
func (*pgRelay) sessionSetup(time.Duration) string { return "" }

func (*pgRelay) sessionReset() string { return "" }

func (*pgRelay) unknownSetting(error) bool { return false }

func (*pgRelay) txSetup(d time.Duration) string {
	return `SET LOCAL idle_in_transaction_session_timeout = ` + strconv.FormatInt(d.Milliseconds(), 10)
}

// retryable reports PostgreSQL's deadlock_detected (40P01): the server chose the claim as a deadlock's
// victim, and since a claim is one statement (the mark of the previous batch in it), the whole of it
// was rolled back. Claims do meet one: under several relays, BenchmarkRelayThroughput/postgres shows
// one in about a third of its runs. A claim whose snapshot predates another relay's last claim locks
// that relay's rows (SKIP LOCKED takes the lock, then finds the row no longer due), and, following a
// row's updates, waits for a row the other relay's statement is marking, SKIP LOCKED or not; that
// statement's mark then waits for the first lock. Run again, the claim goes through. Other errors are
// not the claim's to retry.
func (*pgRelay) retryable(err error) bool {
	state, ok := sqlerr.SQLState(err)
	return ok && state == "40P01"
}

// appendHistory appends with jsonb's ||, after a jsonpath slice of the last keep entries: lax mode
// clamps the slice's start at the array's, so a short history is kept whole, and a NULL one is empty.
func (*pgRelay) appendHistory(keep int, entry string) string {
	if keep == 0 {
		return `jsonb_build_array(` + entry + `)`
	}
	return `COALESCE(jsonb_path_query_array(attempt_history, '$[last - ` + strconv.Itoa(keep-1) + ` to last]'), '[]') || jsonb_build_array(` + entry + `)`
}

func (*pgRelay) jsonParam() string { return `?::jsonb` }

func (*pgRelay) jsonObject(pairs ...string) string {
	return `jsonb_build_object(` + strings.Join(pairs, ", ") + `)`
}
