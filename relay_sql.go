package outboxplugin

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// The relay's SQL, per database, in one place. The text is built once per worker, with the dialect's
// quoting, bind variables and locking clause (GORM's), and run on the *sql.DB directly: the relay's
// statements are few and hot, and GORM's per-call statement building would cost a fifth of the
// throughput.
//
// Claiming is a lease: one short statement (MySQL/MariaDB: one short transaction) picks the next
// pending rows with FOR UPDATE SKIP LOCKED, so that concurrent relays skip each other's rows instead
// of waiting, stamps them with the worker's id, a lease expiry and one more attempt, and commits.
// Publishing then holds no lock and no connection. Finishing updates only rows whose lease is still
// the worker's (locked_by = me): if the lease ran out and another relay took a row, the other relay
// owns it now and publishes it again — a duplicate, never a loss. Run records a fully published
// batch in the same statement (PostgreSQL) or transaction as the next claim, one commit per batch.
//
// Every comparison with the current time takes the worker's clock as a parameter, so the same
// statements work on the three databases and SQLite, which stores times as text, compares like with
// like; relays' clocks must agree to within a small part of the lease (NTP does).
type relaySQL struct {
	dialect string
	table   string // quoted
	db      *sql.DB

	// PostgreSQL and SQLite claim with one UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED)
	// RETURNING (PostgreSQL by ctid). PostgreSQL's claimAfterDone also marks the previous batch done,
	// in a CTE.
	claimUpdate, claimAfterDone, claimAfterDelete string
	// MySQL/MariaDB have no UPDATE … RETURNING and cannot UPDATE a table through a LIMIT subquery
	// on itself: SELECT … FOR UPDATE SKIP LOCKED, then UPDATE the rows found, in one transaction.
	claimSelect, claimStamp string

	keyOrdering bool
	batchSize   int

	// claimTx are the options of a MySQL/MariaDB claim's transaction: nil, the server's default
	// (REPEATABLE READ). At REPEATABLE READ a claim whose scan reaches the end of the (processed,
	// created_at) index locks the gap where the application's next events go, so their inserts wait
	// for it; READ COMMITTED would not. Measured on MariaDB (docs/relay.md): READ COMMITTED brought the
	// application's median Create during claims to 0.84-0.95 of its latency, and cut one worker's
	// throughput to about 0.55 of its rate at REPEATABLE READ — a bad trade, so claims keep the default.
	// BenchmarkInsertDuringClaims and BenchmarkRelayThroughput compare the two (UseClaimIsolation).
	claimTx *sql.TxOptions
}

// returnedColumns are the columns a claim reads back, in scan order.
const returnedColumns = "id, message_id, event_type, aggregate_type, aggregate_id, payload, headers, created_at, attempts, last_error"

// unfinishedDelivery is the last error a claim stamps on a row it takes over from an expired lease:
// the delivery that lease was for never recorded an outcome (its relay died, or stalled past its
// lease). The claim reads it back to tell such rows — which may be the event that killed the relay —
// from the rest; see Worker.isolateUnfinished.
const unfinishedDelivery = "outboxplugin: an earlier delivery did not finish (its relay died or lost its lease)"

// stampUnfinished sets last_error to unfinishedDelivery on a row whose lease ran out. It comes first
// in the claim's SET list: MySQL evaluates assignments left to right, so locked_by is still the old one.
const stampUnfinished = `last_error = CASE WHEN locked_by IS NOT NULL THEN '` + unfinishedDelivery + `' ELSE last_error END, `

func newRelaySQL(db *gorm.DB, table string, keyOrdering bool, batchSize int) (*relaySQL, error) {
	dialect := db.Dialector.Name()
	switch dialect {
	case "postgres", "mysql", "sqlite":
	default:
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedDialect, dialect)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("the relay needs a *sql.DB: %w", err)
	}
	stmt := &gorm.Statement{DB: db, Clauses: map[string]clause.Clause{}}
	q := &relaySQL{dialect: dialect, table: stmt.Quote(table), db: sqlDB, keyOrdering: keyOrdering, batchSize: batchSize}

	// FOR UPDATE SKIP LOCKED as the dialect writes it. GORM's SQLite dialect writes nothing, and
	// SQLite needs nothing: a writing statement holds the database's write lock from its start, so
	// two relays' claims run one after the other.
	stmt.AddClause(clause.Locking{Strength: clause.LockingStrengthUpdate, Options: clause.LockingOptionsSkipLocked})
	stmt.Build("FOR")
	lock := stmt.SQL.String()

	// A claim takes the retries that are due first, then the oldest fresh events: two runs of the claim
	// index (processed, dead_at, next_attempt_at, created_at, id), each read from its head and stopped
	// after the batch. Dead rows are outside the index (PostgreSQL, SQLite) or outside both runs
	// (MySQL: dead_at IS NULL is a leading column), retries not yet due lie past the end of the due run,
	// and fresh rows (next_attempt_at NULL) are a run of their own: however many dead or waiting rows the
	// table holds, a claim steps over none of them. Due retries go first so that a refused event is
	// retried beside fresh ones (which is how a poison event that fails its whole batch is told from an
	// outage: see splitPublish), and so that retries are not starved by a steady stream of new events.
	// The predicates spell processed = false and dead_at IS NULL out, for the planner to use the
	// partial index on PostgreSQL and SQLite. The ORDER BY follows the index's columns there (PostgreSQL
	// takes a column IS NULL for no constant, and would sort every pending row otherwise); MariaDB sorts
	// when the columns fixed by the predicate are named, so there it names only the others.
	live := ` AND (c.locked_until IS NULL OR c.locked_until < ?)`
	if keyOrdering {
		// Only the head of each key: no earlier unprocessed event of the same key (dead ones
		// included: they block their key until requeued), and no event of the key in flight under
		// a live lease (one committed after a later one was claimed waits for it). Events without a
		// key are independent. The key index (aggregate_type, aggregate_id, id) WHERE
		// processed = false keeps the probe to a few index entries.
		live += ` AND ((c.aggregate_type = '' AND c.aggregate_id = '') OR NOT EXISTS (` +
			`SELECT 1 FROM ` + q.table + ` p WHERE p.aggregate_type = c.aggregate_type` +
			` AND p.aggregate_id = c.aggregate_id AND p.processed = false AND p.id <> c.id` +
			` AND (p.id < c.id OR p.locked_until >= ?)))`
	}
	due := `c.processed = false AND c.dead_at IS NULL AND c.next_attempt_at <= ?` + live
	fresh := `c.processed = false AND c.dead_at IS NULL AND c.next_attempt_at IS NULL` + live
	dueOrder := `c.processed, c.dead_at, c.next_attempt_at, c.created_at, c.id`
	freshOrder := dueOrder
	if dialect == "mysql" {
		dueOrder, freshOrder = `c.next_attempt_at, c.created_at, c.id`, `c.created_at, c.id`
	}
	// The batch size is written into the text, not bound: with LIMIT a parameter, PostgreSQL's plan
	// cache never trusts a generic plan and plans every claim anew (about a tenth of a claim's time);
	// with it written out, the prepared claim is planned once per connection.
	limit := ` LIMIT ` + strconv.Itoa(batchSize)
	run := func(cols, where, order string) string {
		return `SELECT ` + cols + ` FROM ` + q.table + ` c WHERE ` + where + ` ORDER BY ` + order + limit + ` ` + lock
	}
	// pick selects col of the batch's rows: the due run, then the fresh run, up to the batch. The
	// outer LIMIT stops the fresh run's scan (and its row locks) once the batch is full.
	pick := func(col string) string {
		return `SELECT ` + col + ` FROM (` + run(`c.`+col, due, dueOrder) + `) d UNION ALL SELECT ` + col +
			` FROM (` + run(`c.`+col, fresh, freshOrder) + `) f` + limit
	}
	stamp := `UPDATE ` + q.table + ` SET ` + stampUnfinished + `locked_by = ?, locked_until = ?, attempts = attempts + 1 WHERE `

	switch dialect {
	case "mysql":
		// Read before the stamp: the unfinished-delivery mark as the stamp will set it. MariaDB runs
		// both runs of a UNION to the end of their LIMIT, so a claim locks up to the due rows more than
		// it takes, until its transaction commits a moment later; other relays skip them meanwhile.
		cols := strings.Replace(prefixColumns("c.", returnedColumns), "c.last_error",
			`CASE WHEN c.locked_by IS NOT NULL THEN '`+unfinishedDelivery+`' ELSE c.last_error END AS last_error`, 1)
		q.claimSelect = `(` + run(cols, due, dueOrder) + `) UNION ALL (` + run(cols, fresh, freshOrder) + `)` + limit
		q.claimStamp = stamp // + id IN (...)
	case "postgres":
		// The rows are addressed by ctid, taken under the lock the subquery holds: a TID scan
		// instead of a primary-key probe per row.
		claim := strings.Replace(stamp, " WHERE ", " FROM relay_async WHERE ", 1) +
			`ctid = ANY(ARRAY(` + pick("ctid") + `)) RETURNING ` + returnedColumns + `, ctid::text`
		q.claimUpdate = q.bind(`WITH ` + pgAsyncCommit + ` ` + claim)
		// The previous batch is marked done in the same statement. Its rows are leased to this
		// worker, so the claim's subquery (which sees the table as it was before the statement) does
		// not pick them again.
		q.claimAfterDone = q.bind(`WITH ` + pgAsyncCommit + `, done AS (UPDATE ` + q.table + ` SET processed = true, processed_at = ?,` +
			` locked_by = NULL, locked_until = NULL WHERE ` + pgRowMatch + ` AND locked_by = ?) ` + claim)
		q.claimAfterDelete = q.bind(`WITH ` + pgAsyncCommit + `, done AS (DELETE FROM ` + q.table +
			` WHERE ` + pgRowMatch + ` AND locked_by = ?) ` + claim)
	default:
		q.claimUpdate = stamp + `id IN (` + pick("id") + `) RETURNING ` + returnedColumns
	}
	return q, nil
}

// pgAsyncCommit is a CTE that turns synchronous_commit off for the claim's own transaction (the
// statement runs alone, so that is the statement): see docs/relay.md, "Asynchronous commits".
const pgAsyncCommit = `relay_async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))`

// pgRowMatch finds leased rows on PostgreSQL by the ctid their claim returned, a TID scan instead of
// a primary-key probe per row. The id must match too: a row whose lease was taken over has moved to
// a new ctid, and its old slot may in time hold another row.
const pgRowMatch = `ctid = ANY(?::tid[]) AND id = ANY(?::bigint[])`

// rowsMatch returns the condition and arguments that select the given leased rows.
func (q *relaySQL) rowsMatch(ids []int64, ctids []string) (string, []any) {
	if q.dialect == "postgres" && len(ctids) == len(ids) {
		_, idArgs := q.idList(ids)
		return pgRowMatch, []any{pgTextArray(ctids), idArgs[0]}
	}
	return q.idList(ids)
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

// bind rewrites ? placeholders as PostgreSQL's $n. The relay's SQL has no ? anywhere else.
func (q *relaySQL) bind(query string) string {
	if q.dialect != "postgres" {
		return query
	}
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

// idList returns the text and arguments that select ids: = ANY($n::bigint[]) with one array on
// PostgreSQL (one statement text for every batch size), IN (?, …) elsewhere.
func (q *relaySQL) idList(ids []int64) (string, []any) {
	if q.dialect == "postgres" {
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
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return "id IN (" + strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",") + ")", args
}

func prefixColumns(prefix, cols string) string {
	parts := strings.Split(cols, ", ")
	for i, p := range parts {
		parts[i] = prefix + p
	}
	return strings.Join(parts, ", ")
}

// claimedRow is a row the worker holds a lease on.
type claimedRow struct {
	id   int64
	ctid string // PostgreSQL: where the claim left the row
	msg  Message
	// undecodable: the row's headers or creation time could not be read (a row written by hand
	// with raw SQL); the worker buries it as dead instead of failing the whole claim.
	undecodable error
	// unfinished: the claim took the row over from an expired lease, whose delivery recorded no
	// outcome.
	unfinished bool
}

// pickArgs are the values of the pick subquery's placeholders, in text order.
func (q *relaySQL) pickArgs(now time.Time) []any {
	if q.dialect == "mysql" {
		// go-sql-driver sends a time with its nanoseconds, and MariaDB then bounds no index range
		// on a DATETIME(6) column by it: the due run would be scanned to its end.
		now = now.Truncate(time.Microsecond)
	}
	if q.keyOrdering {
		return []any{now, now, now, now, now} // due: next attempt, lease, key lease; fresh: lease, key lease
	}
	return []any{now, now, now} // due: next attempt, lease; fresh: lease
}

// doneBatch is a published batch whose rows Run marks done together with the next claim.
type doneBatch struct {
	ids   []int64
	ctids []string
	now   time.Time
}

// claim leases up to a batch of pending rows to owner until leaseUntil. When prev is not nil, its rows are
// marked done (or deleted) in the same statement or transaction.
func (q *relaySQL) claim(ctx context.Context, owner string, now, leaseUntil time.Time, prev *doneBatch, deleteDone bool) ([]claimedRow, error) {
	claimArgs := append([]any{owner, leaseUntil}, q.pickArgs(now)...)
	switch {
	case q.dialect == "postgres" && prev != nil:
		// claimAfterDone's text is written with pgRowMatch; rowsMatch gives its arguments.
		_, match := q.rowsMatch(prev.ids, prev.ctids)
		match = append(match, owner)
		var rows *sql.Rows
		var err error
		if deleteDone {
			rows, err = q.db.QueryContext(ctx, q.claimAfterDelete, append(match, claimArgs...)...)
		} else {
			rows, err = q.db.QueryContext(ctx, q.claimAfterDone, append(append([]any{prev.now}, match...), claimArgs...)...)
		}
		if err != nil {
			return nil, err
		}
		return q.scanClaimed(rows, 0, true)
	case q.dialect == "postgres":
		rows, err := q.db.QueryContext(ctx, q.claimUpdate, claimArgs...)
		if err != nil {
			return nil, err
		}
		return q.scanClaimed(rows, 0, true)
	}

	var claimed []claimedRow
	var opts *sql.TxOptions
	if q.dialect == "mysql" {
		opts = q.claimTx
	}
	err := q.inTxAt(ctx, opts, func(tx *sql.Tx) error {
		if prev != nil {
			if _, err := q.markDone(ctx, tx, owner, *prev, deleteDone); err != nil {
				return err
			}
		}
		if q.dialect == "sqlite" {
			rows, err := tx.QueryContext(ctx, q.claimUpdate, claimArgs...)
			if err != nil {
				return err
			}
			claimed, err = q.scanClaimed(rows, 0, false)
			return err
		}
		rows, err := tx.QueryContext(ctx, q.claimSelect, q.pickArgs(now)...)
		if err != nil {
			return err
		}
		// Read before the stamp, which adds the attempt.
		if claimed, err = q.scanClaimed(rows, 1, false); err != nil || len(claimed) == 0 {
			return err
		}
		in, ids := q.idList(rowIDs(claimed))
		_, err = tx.ExecContext(ctx, q.claimStamp+in, append([]any{owner, leaseUntil}, ids...)...)
		return err
	})
	return claimed, err
}

// inTx runs fn in a transaction.
func (q *relaySQL) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return q.inTxAt(ctx, nil, fn)
}

// inTxAt runs fn in a transaction with the given options (nil: the database's defaults).
func (q *relaySQL) inTxAt(ctx context.Context, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	tx, err := q.db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

// execer is a *sql.DB or *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// scanClaimed reads a claim's rows into a slice sized for a batch, scanning each straight into its
// element: per row, only what the driver must copy is allocated.
func (q *relaySQL) scanClaimed(rows *sql.Rows, attemptOffset int, withCtid bool) (out []claimedRow, err error) {
	defer func() { err = errors.Join(err, rows.Close()) }()
	var (
		payload, headers []byte
		created          any
		attempts         int
		lastError        sql.NullString
		dest             []any
	)
	for rows.Next() {
		if out == nil {
			// Sized on the first row, so that an empty poll allocates nothing; capped, so that a
			// huge batch size grows the slice as rows come.
			out = make([]claimedRow, 0, min(q.batchSize, 1000))
			dest = make([]any, 0, 10)
		}
		out = append(out, claimedRow{})
		r := &out[len(out)-1]
		m := &r.msg
		payload, headers, created = nil, nil, nil
		dest = append(dest[:0], &r.id, &m.ID, &m.EventType, &m.AggregateType, &m.AggregateID, &payload, &headers, &created, &attempts, &lastError)
		if withCtid {
			dest = append(dest, &r.ctid)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan claimed row: %w", err)
		}
		m.Payload = payload
		if len(headers) > 0 && string(headers) != "null" {
			if err := json.Unmarshal(headers, &m.Headers); err != nil {
				m.Headers = nil
				r.undecodable = fmt.Errorf("headers are not a JSON object of strings: %w", err)
			}
		}
		if t, err := asTime(created); err != nil {
			r.undecodable = errors.Join(r.undecodable, fmt.Errorf("created_at: %w", err))
		} else {
			m.CreatedAt = t
		}
		m.Key = messageKey(m.AggregateType, m.AggregateID)
		m.Attempt = attempts + attemptOffset
		r.unfinished = lastError.Valid && lastError.String == unfinishedDelivery
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sortClaimed(out)
	return out, nil
}

// sortClaimed puts a batch in creation order; RETURNING gives rows in no particular order.
func sortClaimed(rows []claimedRow) {
	for i := 1; i < len(rows); i++ {
		for j := i; j > 0 && claimedBefore(rows[j], rows[j-1]); j-- {
			rows[j], rows[j-1] = rows[j-1], rows[j]
		}
	}
}

func claimedBefore(a, b claimedRow) bool {
	if !a.msg.CreatedAt.Equal(b.msg.CreatedAt) {
		return a.msg.CreatedAt.Before(b.msg.CreatedAt)
	}
	return a.id < b.id
}

// asTime reads a time column: drivers return time.Time, SQLite's RETURNING gives the stored text.
func asTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case time.Time:
		return t.UTC(), nil
	case string:
		return parseStoredTime(t)
	case []byte:
		return parseStoredTime(string(t))
	}
	return time.Time{}, fmt.Errorf("unexpected %T", v)
}

// storedTimeLayouts are the text forms SQLite drivers write times in.
var storedTimeLayouts = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	time.RFC3339Nano,
}

func parseStoredTime(s string) (time.Time, error) {
	for _, layout := range storedTimeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("cannot parse %q", s)
}

func rowIDs(rows []claimedRow) []int64 {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	return ids
}

// rowCtids returns the rows' ctids, or nil when the database has none.
func rowCtids(rows []claimedRow) []string {
	if len(rows) == 0 || rows[0].ctid == "" {
		return nil
	}
	ctids := make([]string, len(rows))
	for i, r := range rows {
		ctids[i] = r.ctid
	}
	return ctids
}

// exec runs head <id list> tail, whose placeholders take headArgs, the ids and tailArgs in that order.
func (q *relaySQL) exec(ctx context.Context, ex execer, head string, headArgs []any, ids []int64, tail string, tailArgs ...any) (int64, error) {
	in, idArgs := q.idList(ids)
	args := make([]any, 0, len(headArgs)+len(idArgs)+len(tailArgs))
	args = append(append(append(args, headArgs...), idArgs...), tailArgs...)
	res, err := ex.ExecContext(ctx, q.bind(head+in+tail), args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// markDone records published rows: processed (the reference design), or deleted. It returns how many
// of them were still leased to owner.
func (q *relaySQL) markDone(ctx context.Context, ex execer, owner string, b doneBatch, deleteRows bool) (int64, error) {
	match, args := q.rowsMatch(b.ids, b.ctids)
	query := `UPDATE ` + q.table + ` SET processed = true, processed_at = ?, locked_by = NULL, locked_until = NULL WHERE `
	args = append([]any{b.now}, args...)
	if deleteRows {
		query, args = `DELETE FROM `+q.table+` WHERE `, args[1:]
	}
	res, err := ex.ExecContext(ctx, q.bind(query+match+` AND locked_by = ?`), append(args, owner)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// markRetry records failed deliveries that will be retried at next.
func (q *relaySQL) markRetry(ctx context.Context, ex execer, owner string, ids []int64, lastError string, next time.Time) error {
	_, err := q.exec(ctx, ex, `UPDATE `+q.table+` SET last_error = ?, next_attempt_at = ?, locked_by = NULL, locked_until = NULL WHERE `,
		[]any{lastError, next}, ids, ` AND locked_by = ?`, owner)
	return err
}

// markDead records events given up on.
func (q *relaySQL) markDead(ctx context.Context, ex execer, owner string, ids []int64, lastError string, now time.Time) error {
	_, err := q.exec(ctx, ex, `UPDATE `+q.table+` SET last_error = ?, dead_at = ?, locked_by = NULL, locked_until = NULL WHERE `,
		[]any{lastError, now}, ids, ` AND locked_by = ?`, owner)
	return err
}

// bury marks claimed rows dead before any delivery, giving back the attempt their claim counted.
func (q *relaySQL) bury(ctx context.Context, ex execer, owner string, ids []int64, lastError string, now time.Time) error {
	_, err := q.exec(ctx, ex, `UPDATE `+q.table+` SET last_error = ?, dead_at = ?, attempts = attempts - 1, locked_by = NULL, locked_until = NULL WHERE `,
		[]any{lastError, now}, ids, ` AND locked_by = ?`, owner)
	return err
}

// countAttempt adds delta to the attempts of rows leased to owner; with delta 0 it hands them back
// (lease cleared) with their attempts as they are.
func (q *relaySQL) countAttempt(ctx context.Context, ex execer, owner string, ids []int64, delta int) error {
	set := `attempts = attempts + ` + strconv.Itoa(delta)
	if delta == 0 {
		set = `locked_by = NULL, locked_until = NULL`
	}
	_, err := q.exec(ctx, ex, `UPDATE `+q.table+` SET `+set+` WHERE `, nil, ids, ` AND locked_by = ?`, owner)
	return err
}

// renew extends the lease of the given rows that are still the owner's, and returns how many it
// extended; on PostgreSQL also where each now is (an UPDATE moves a row to a new ctid).
func (q *relaySQL) renew(ctx context.Context, owner string, ids []int64, until time.Time) (moved map[int64]string, n int64, err error) {
	in, idArgs := q.idList(ids)
	query := `UPDATE ` + q.table + ` SET locked_until = ? WHERE ` + in + ` AND locked_by = ?`
	args := append(append([]any{until}, idArgs...), owner)
	if q.dialect != "postgres" {
		res, err := q.db.ExecContext(ctx, q.bind(query), args...)
		if err != nil {
			return nil, 0, err
		}
		n, err = res.RowsAffected()
		return nil, n, err
	}
	rows, err := q.db.QueryContext(ctx, q.bind(query+` RETURNING id, ctid::text`), args...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	moved = make(map[int64]string, len(ids))
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

// release hands rows back unpublished, without counting the attempt; a non-empty lastError is
// recorded as the rows' last error.
func (q *relaySQL) release(ctx context.Context, ex execer, owner string, ids []int64, lastError string) error {
	set := `UPDATE ` + q.table + ` SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1`
	var head []any
	if lastError != "" {
		set += `, last_error = ?`
		head = []any{lastError}
	}
	_, err := q.exec(ctx, ex, set+` WHERE `, head, ids, ` AND locked_by = ?`, owner)
	return err
}

// cleanupChunk deletes up to limit processed rows created before cutoff. The predicate spells
// processed = true out for the partial (processed, created_at) index; MySQL takes LIMIT on DELETE
// but not in a subquery of the table it deletes from.
func (q *relaySQL) cleanupChunk(ctx context.Context, ex execer, cutoff time.Time, limit int) (int64, error) {
	query := `DELETE FROM ` + q.table + ` WHERE id IN (SELECT id FROM ` + q.table +
		` WHERE processed = true AND created_at < ? LIMIT ?)`
	if q.dialect == "mysql" {
		query = `DELETE FROM ` + q.table + ` WHERE processed = true AND created_at < ? LIMIT ?`
	}
	res, err := ex.ExecContext(ctx, q.bind(query), cutoff, limit)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// requeue makes dead events pending again: all of them, or those with the given message ids.
func (q *relaySQL) requeue(ctx context.Context, messageIDs []string) (int64, error) {
	query := `UPDATE ` + q.table + ` SET dead_at = NULL, attempts = 0, next_attempt_at = NULL WHERE dead_at IS NOT NULL`
	args := make([]any, len(messageIDs))
	if len(messageIDs) > 0 {
		query += ` AND message_id IN (` + strings.TrimSuffix(strings.Repeat("?,", len(messageIDs)), ",") + `)`
		for i, id := range messageIDs {
			args[i] = id
		}
	}
	res, err := q.db.ExecContext(ctx, q.bind(query), args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// backlog counts pending events (dead ones excluded).
func (q *relaySQL) backlog(ctx context.Context) (int64, error) {
	var n int64
	err := q.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+q.table+` WHERE processed = false AND dead_at IS NULL`).Scan(&n)
	return n, err
}

// prepareTable runs once per worker, before its first claim, and changes nothing (the worker runs no
// DDL: AutoMigrate creates what it needs). It checks the claim index, and with per-key ordering the
// index the ordering probes, and fails when one is missing or invalid (errMissingIndex); on PostgreSQL
// it logs, once, a table without the storage settings claims want.
func (w *Worker) prepareTable(ctx context.Context) error {
	w.prepareMu.Lock()
	defer w.prepareMu.Unlock()
	if w.prepared {
		return nil
	}
	if rows, err := w.sql.db.QueryContext(ctx, `SELECT `+relayColumns+` FROM `+w.sql.table+` WHERE 1 = 0`); err != nil {
		// No table, or one without the relay's columns: the claim fails, saying which (Run's
		// checkTable has already failed on it).
		return nil
	} else if err := rows.Close(); err != nil {
		return nil
	}
	db := w.db.WithContext(ctx)
	need := []struct{ what, name, fix string }{{"the claim index", claimIndexName(db, w.cfg.table), "outboxplugin.AutoMigrate(db)"}}
	if w.cfg.keyOrdering {
		need = append(need, struct{ what, name, fix string }{"per-key ordering's index", keyIndexName(w.cfg.table),
			"outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex())"})
	}
	for _, idx := range need {
		exists, valid, err := indexState(db, w.cfg.table, idx.name)
		if err != nil {
			return fmt.Errorf("outboxplugin: look up %s: %w", idx.what, err)
		}
		if !exists || !valid {
			state := "missing"
			if exists {
				state = "invalid (a failed CREATE INDEX CONCURRENTLY left it)"
			}
			return fmt.Errorf("outboxplugin: %w: %s, %s on %s, is %s; create it with %s",
				errMissingIndex, idx.what, idx.name, w.cfg.table, state, idx.fix)
		}
	}
	if missing, err := missingStorageOptions(db, w.cfg.table); err == nil && len(missing) > 0 {
		w.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "outboxplugin: the outbox table lacks the storage settings claims want; outboxplugin.AutoMigrate(db) sets them",
			slog.String("worker", w.owner), slog.String("table", w.cfg.table), slog.Any("missing", missing))
	}
	w.prepared = true
	return nil
}
