// Package store is the relay's SQL: the statements a worker claims, marks, retries, buries, releases,
// renews and cleans up with, written once per worker for its database (PostgreSQL, MySQL/MariaDB,
// SQLite) and run on its *sql.DB. The worker (the root package's Worker) and the Admin use it through
// Store's exported methods; what differs between databases is behind the relayDialect interface, one
// implementation per file (postgres.go, mysql.go, sqlite.go). It knows nothing of publishers,
// outcomes or the capture.
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gorm-outbox/outboxplugin/internal/dbtime"
	"github.com/gorm-outbox/outboxplugin/internal/partition"
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
// Leases, retry times and the times a claim compares them with are the database's: taken in SQL
// (now() on PostgreSQL, UTC_TIMESTAMP(6) on MySQL and MariaDB), never from a relay's clock, so relays
// whose clocks differ still agree on when a lease runs out (see dbTime). SQLite, whose database is
// one host's file, takes the worker's clock as a parameter. A worker also keeps its own, conservative
// end of each lease: the time it sent the claim (or renewal) plus the lease, on its monotonic clock,
// which the database's end cannot precede. It does not start publishing a batch past that end, and a
// publish still running then is cut short (internal/relay's lease.go): a relay that got a claim's answer late, or
// that cannot renew, never publishes rows another relay may have taken over.
type Store struct {
	d       relayDialect
	table   string // quoted
	name    string // as given: validated, possibly schema-qualified
	dialect string // GORM's name of the database
	db      *sql.DB

	keyOrdering bool
	batchSize   int
	// partitioned: the table is partitioned (set by ready). PostgreSQL's claim, which addresses rows
	// by their place, must know; on MySQL the relay's transactions run at READ COMMITTED there
	// (mysqlRelay.partitionedTx).
	partitioned bool

	// history is how many failed attempts a row's attempt_history keeps (0: none is written), and
	// historySet the assignment that appends one, bound to a JSON entry (HistoryEntry; the root package's history.go).
	history    int
	historySet string

	clock dbTime        // how the statements read the current time (set by ready)
	lease time.Duration // how long a claim or renewal leases rows for

	gdb     *gorm.DB // for the dialect's quoting and locking clause, when ready writes the claim
	buildMu sync.Mutex
	built   bool

	connMu    sync.Mutex // held while a transaction runs (inTxAt)
	conn      *sql.Conn  // the worker's own connection (txConnLocked), or nil
	holdConn  bool       // conn is kept between transactions: the pool has room for it
	noSession bool       // the server has no idle-transaction setting: transactions use the pool

	engineMu       sync.Mutex // CheckEngine (engine.go)
	engineChecked  bool
	engineErr      error
	versionStandIn string // the server's version as tests give it, or ""
}

// relayDialect is what differs between databases in the relay's SQL, one implementation per database
// (postgres.go, mysql.go, sqlite.go): how a claim is written and run, bind
// variables, id lists, lease renewal, cleanup's DELETE and the cleanup lock. The rest of the relay's
// SQL is the same text everywhere, built by Store with the dialect's bind variables and id lists.
type relayDialect interface {
	// build writes the dialect's claim statements from the parts every dialect shares.
	build(q *Store, p claimParts)
	// claim leases up to a batch of pending rows to owner for q.lease. When prev is not nil,
	// its rows are marked done (or deleted) in the same statement or transaction, and marked is how
	// many of them were still leased to owner.
	claim(ctx context.Context, q *Store, owner string, now time.Time, prev *Done, deleteDone bool) (rows []Row, marked int64, err error)
	// bind rewrites the ? placeholders of query as the dialect's bind variables.
	bind(query string) string
	// literal writes args into query as literals where that saves the database work (MySQL: a
	// statement with arguments costs a round trip more, to prepare it), and returns query and args
	// unchanged otherwise.
	literal(query string, args []any) (string, []any)
	// idList returns the condition and arguments that select ids.
	idList(ids []int64) (string, []any)
	// rowsMatch returns the condition and arguments that select the given leased rows.
	rowsMatch(ids []int64, ctids []string) (string, []any)
	// renew runs the lease-extending UPDATE query with args; moved is where each row now is, on
	// databases that address leased rows by their place (PostgreSQL's ctid).
	renew(ctx context.Context, db *sql.DB, query string, args []any) (moved map[int64]string, n int64, err error)
	// cleanupQuery deletes up to ? processed rows created before ? (or selects their ids, see
	// cleanupByKey): every ? but the last is the cutoff, the last the limit.
	cleanupQuery(table string) string
	// tryLock takes the lock name on conn without waiting. The statements that run under it go to
	// held (conn, or a transaction begun on it for a lock that lasts as long as its transaction);
	// release lets go of it, keeping what they did when keep is true.
	tryLock(ctx context.Context, conn *sql.Conn, name string) (held QueryExecer, release func(keep bool) error, got bool, err error)
	// clock is the worker's current time as the claim compares it, where the statements take the
	// worker's clock (see timeSQL).
	clock(now time.Time) time.Time
	// timeSQL is how the relay's statements read the current time: an expression of the database's
	// clock, now, with later(d) for d after it and laterBy for a bind variable of microseconds after
	// it (PostgreSQL, MySQL and MariaDB). With bound true they are bind variables taking the worker's
	// clock instead (SQLite, whose file has one host's clock; MySQL when the driver does not send
	// times in UTC, the zone the stored times are then compared in).
	timeSQL(ctx context.Context, db *sql.DB) (dbTime, error)
	// listens reports whether the database wakes the worker with notifications.
	listens() bool
	// sessionSetup is the statement that sets a connection's idle-in-transaction timeout to d ("" when
	// the database sets it per transaction, or has none), sessionReset the one that sets it back before
	// the connection returns to the pool, and unknownSetting reports the error of a server without it.
	sessionSetup(d time.Duration) string
	sessionReset() string
	unknownSetting(err error) bool
	// txSetup is the first statement of the relay's transactions, which sets their idle timeout to d
	// ("" when the database does it per session, or has none).
	txSetup(d time.Duration) string
	// retryable reports whether a claim that failed with err rolled back whole and may simply be run
	// again at once (MySQL's deadlock victim).
	retryable(err error) bool
	// appendHistory is the new value of attempt_history: the last keep entries of the current one,
	// then entry, an expression of a JSON object. It reads attempt_history, no other column.
	appendHistory(keep int, entry string) string
	// jsonParam is a bind variable that takes a JSON document as text, as the dialect's JSON
	// functions take a document.
	jsonParam() string
	// jsonObject builds a JSON object of keys (SQL string literals) and values (SQL expressions),
	// alternating.
	jsonObject(pairs ...string) string
}

// dbTime is the current time in a dialect's statements (relayDialect.timeSQL).
type dbTime struct {
	now   string                       // the current time
	later func(d time.Duration) string // the current time plus d, a constant
	by    string                       // the current time plus a bind variable of microseconds
	bound bool                         // now, later and by are bind variables of the worker's times
}

// args are the values of the bind variables of n uses of now (none when the database's clock is read).
func (t dbTime) args(now time.Time, n int) []any {
	if !t.bound {
		return nil
	}
	out := make([]any, n)
	for i := range out {
		out[i] = now
	}
	return out
}

// laterArgs is the value of the bind variable of later(d) or by, d after now.
func (t dbTime) laterArgs(now time.Time, d time.Duration, forBy bool) []any {
	switch {
	case t.bound:
		return []any{now.Add(d)}
	case forBy:
		return []any{d.Microseconds()}
	}
	return nil
}

// boundTime is the dbTime of a dialect whose statements take the worker's clock.
var boundTime = dbTime{now: "?", later: func(time.Duration) string { return "?" }, by: "?", bound: true}

// returnedColumns are the columns a claim reads back, in scan order.
const returnedColumns = "id, message_id, event_type, aggregate_type, aggregate_id, payload, headers, created_at, attempts, last_error"

// UnfinishedDelivery is the last error a claim stamps on a row it takes over from an expired lease:
// the delivery that lease was for never recorded an outcome (its relay died, or stalled past its
// lease). The claim reads it back to tell such rows — which may be the event that killed the relay —
// from the rest; see outboxplugin.Worker.isolateUnfinished.
const UnfinishedDelivery = "outboxplugin: an earlier delivery did not finish (its relay died or lost its lease)"

// NoLeaseOwner is locked_by of a row no relay has claimed since it was written, on MySQL and MariaDB:
// 32 spaces, the column's default there (outboxplugin.NoLeaseOwner, whose documentation says why; a
// test of that package holds the two equal).
const NoLeaseOwner = "                                "

// leaseHeld is true on a row a relay has claimed and not yet marked or handed back, whether its
// lease still runs or not: locked_by holds a worker's id. NULL (no owner) makes it NULL, which CASE
// and WHERE take for false; the placeholder (NoLeaseOwner) is compared as written, since MySQL 8's
// default collation does not pad.
const leaseHeld = `locked_by <> '` + NoLeaseOwner + `'`

// stampUnfinished sets last_error to UnfinishedDelivery on a row whose lease ran out. It comes first
// in the claim's SET list: MySQL evaluates assignments left to right, so locked_by is still the old one.
const stampUnfinished = `last_error = CASE WHEN ` + leaseHeld + ` THEN '` + UnfinishedDelivery + `' ELSE last_error END, `

// stampUnfinishedHistory is, with a history kept, the assignment that appends the delivery that did
// not finish to a row taken over from an expired lease: when its lease ran out (locked_until), the
// worker that held it (locked_by), its attempt number (attempts, not yet counted up by the claim) and
// no duration, which nobody saw end. It is built from the row's own columns, so the claim takes no
// parameter more; it follows stampUnfinished, before the assignments of the new lease, for MySQL's left
// to right evaluation. Rows claimed fresh or due (no owner) take the ELSE branch: their history
// is assigned to itself, which costs the claim a comparison per row (measured in docs/relay.md).
func stampUnfinishedHistory(d relayDialect, keep int) string {
	entry := d.jsonObject(`'at'`, `locked_until`, `'attempt'`, `attempts`, `'worker'`, `locked_by`, `'error'`, `'`+UnfinishedDelivery+`'`)
	return `attempt_history = CASE WHEN ` + leaseHeld + ` THEN ` + d.appendHistory(keep, entry) + ` ELSE attempt_history END, `
}

// New writes the relay's SQL for table. history is how many failed attempts each row keeps
// (0: the statements leave attempt_history alone); lease is how long a claim or renewal leases rows
// for. The claim's statements are written by ready, at the first claim: on MySQL they depend on how
// the driver sends times, which takes the database to find out.
func New(db *gorm.DB, table string, keyOrdering bool, batchSize, history int, lease time.Duration) (*Store, error) {
	var d relayDialect
	switch dialect := db.Dialector.Name(); dialect {
	case "postgres":
		d = &pgRelay{}
	case "mysql":
		d = &mysqlRelay{}
	case "sqlite":
		d = &sqliteRelay{}
	default:
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedDialect, dialect)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("the relay needs a *sql.DB: %w", err)
	}
	if m, ok := d.(*mysqlRelay); ok {
		m.db = sqlDB // literal's probe of how the driver sends times
	}
	stmt := &gorm.Statement{DB: db, Clauses: map[string]clause.Clause{}}
	q := &Store{d: d, table: stmt.Quote(table), name: table, dialect: db.Dialector.Name(), db: sqlDB, keyOrdering: keyOrdering, batchSize: batchSize, history: history,
		lease: lease, gdb: db}
	if history > 0 {
		q.historySet = `attempt_history = ` + d.appendHistory(history-1, d.jsonParam()) + `, `
	}
	return q, nil
}

// ready writes the claim's statements, once: it asks the dialect how its statements read the current
// time (MySQL: whether the driver sends times in UTC, which takes a round trip), and fails when that
// cannot be told yet (the database is away), to be tried again at the next claim.
func (q *Store) ready(ctx context.Context) error {
	q.buildMu.Lock()
	defer q.buildMu.Unlock()
	if q.built {
		return nil
	}
	if err := q.CheckEngine(ctx); err != nil {
		return err
	}
	clock, err := q.d.timeSQL(ctx, q.db)
	if err != nil {
		return fmt.Errorf("read how the database's times are sent: %w", err)
	}
	q.clock = clock
	switch q.d.(type) {
	case *pgRelay:
		if err := q.db.QueryRowContext(ctx, `SELECT COALESCE((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`,
			q.table).Scan(&q.partitioned); err != nil {
			return fmt.Errorf("read whether the table is partitioned: %w", err)
		}
	case *mysqlRelay:
		schema, name := "", q.name
		if i := strings.LastIndex(name, "."); i >= 0 {
			schema, name = name[:i], name[i+1:]
		}
		if err := q.db.QueryRowContext(ctx, `SELECT COUNT(*) > 0 FROM information_schema.partitions WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE())`+
			` AND table_name = ? AND partition_name IS NOT NULL`, schema, name).Scan(&q.partitioned); err != nil {
			return fmt.Errorf("read whether the table is partitioned: %w", err)
		}
	}
	q.buildClaim()
	q.built = true
	return nil
}

// buildClaim writes the claim's statements with q.clock.
func (q *Store) buildClaim() {
	d, history := q.d, q.history
	stmt := &gorm.Statement{DB: q.gdb, Clauses: map[string]clause.Clause{}}
	stamp, stampFresh := stampUnfinished, stampUnfinished
	if history > 0 {
		stamp += stampUnfinishedHistory(d, history-1)
	}
	lease := `locked_by = ?, locked_until = ` + q.clock.later(q.lease) + `, attempts = attempts + 1 WHERE `

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
	now := q.clock.now
	leaseFree := ` AND (c.locked_until IS NULL OR c.locked_until < ` + now + `)`
	live := leaseFree
	if q.keyOrdering {
		// Only the head of each key: no earlier unprocessed event of the same key (dead ones
		// included: they block their key until requeued), and no event of the key in flight under
		// a live lease (one committed after a later one was claimed waits for it). Events without a
		// key are independent. The key index (aggregate_type, aggregate_id, id) WHERE
		// processed = false keeps the probe to a few index entries.
		live += ` AND ((c.aggregate_type = '' AND c.aggregate_id = '') OR NOT EXISTS (` +
			`SELECT 1 FROM ` + q.table + ` p WHERE p.aggregate_type = c.aggregate_type` +
			` AND p.aggregate_id = c.aggregate_id AND p.processed = false AND p.id <> c.id` +
			` AND (p.id < c.id OR p.locked_until >= ` + now + `)))`
	}
	d.build(q, claimParts{
		due:       `c.processed = false AND c.dead_at IS NULL AND c.next_attempt_at <= ` + now + live,
		fresh:     `c.processed = false AND c.dead_at IS NULL AND c.next_attempt_at IS NULL` + live,
		dueBase:   `c.processed = false AND c.dead_at IS NULL AND c.next_attempt_at <= ` + now + leaseFree,
		freshBase: `c.processed = false AND c.dead_at IS NULL AND c.next_attempt_at IS NULL` + leaseFree,
		// The batch size is written into the text, not bound: with LIMIT a parameter, PostgreSQL's
		// plan cache never trusts a generic plan and plans every claim anew (about a tenth of a
		// claim's time); with it written out, the prepared claim is planned once per connection.
		limit:      ` LIMIT ` + strconv.Itoa(q.batchSize),
		lock:       lock,
		table:      q.table,
		stamp:      `UPDATE ` + q.table + ` SET ` + stamp + lease,
		stampFresh: `UPDATE ` + q.table + ` SET ` + stampFresh + lease,
	})
}

// claimParts are the pieces of a claim every dialect shares: the predicates of the due run and of the
// fresh run (each with its placeholders, in pickArgs order), the LIMIT clause, the locking clause, the
// quoted table, and the head of the UPDATE that stamps the lease: stamp, and stampFresh, which leaves
// attempt_history alone, for a dialect that reads the rows before it stamps them and knows that none
// was taken over from an expired lease (MySQL).
type claimParts struct {
	due, fresh, limit, lock, table, stamp, stampFresh string
	// dueBase and freshBase are due and fresh without per-key ordering's condition.
	dueBase, freshBase string
}

// run selects cols of one run (due or fresh), in order, up to a batch, locking the rows.
func (p claimParts) run(cols, where, order string) string {
	return `SELECT ` + cols + ` FROM ` + p.table + ` c WHERE ` + where + ` ORDER BY ` + order + p.limit + ` ` + p.lock
}

// claimOrder is the ORDER BY of both runs where it names every column of the claim index: PostgreSQL
// takes a column IS NULL for no constant, and reads the index in order only for an ORDER BY that
// follows its columns (otherwise it would sort every pending row).
const claimOrder = `c.processed, c.dead_at, c.next_attempt_at, c.created_at, c.id`

// pickUnion selects col of the batch's rows: the due run, then the fresh run, up to the batch. The
// outer LIMIT stops the fresh run's scan (and, on PostgreSQL, its row locks) once the batch is full.
func (p claimParts) pickUnion(col string) string {
	return `SELECT ` + col + ` FROM (` + p.run(`c.`+col, p.due, claimOrder) + `) d UNION ALL SELECT ` + col +
		` FROM (` + p.run(`c.`+col, p.fresh, claimOrder) + `) f` + p.limit
}

// rowsMatch returns the condition and arguments that select the given leased rows.
func (q *Store) rowsMatch(ids []int64, ctids []string) (string, []any) {
	return q.d.rowsMatch(ids, ctids)
}

// bind rewrites ? placeholders as the dialect's bind variables. The relay's SQL has no ? anywhere else.
func (q *Store) Bind(query string) string { return q.d.bind(query) }

// idList returns the text and arguments that select ids.
func (q *Store) IdList(ids []int64) (string, []any) { return q.d.idList(ids) }

// inList is id IN (?, …), as MySQL and SQLite select ids.
func inList(ids []int64) (string, []any) {
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

// Row is a row the worker holds a lease on.
type Row struct {
	ID   int64
	Ctid string // PostgreSQL: where the claim left the row
	Msg  Message
	// Undecodable: the row's headers or creation time could not be read (a row written by hand
	// with raw SQL); the worker buries it as dead instead of failing the whole claim.
	Undecodable error
	// Unfinished: the claim took the row over from an expired lease, whose delivery recorded no
	// outcome.
	Unfinished bool
}

// Message is what a claim reads of a row for the publisher: the fields of outboxplugin.Message, in
// its order and of its types, so that the worker converts one into the other (outboxplugin.Message(m))
// without a copy of its own.
type Message struct {
	ID            string
	EventType     string
	Key           string
	AggregateType string
	AggregateID   string
	Payload       []byte
	Headers       map[string]string
	CreatedAt     time.Time
	Attempt       int
}

// MessageKey is a message's key: "type:id" of its aggregate, "" for an event without one.
func MessageKey(aggregateType, aggregateID string) string {
	if aggregateType == "" && aggregateID == "" {
		return ""
	}
	return aggregateType + ":" + aggregateID
}

// pickArgs are the values of the pick subquery's placeholders, in text order: the current time of
// each run's comparisons, where the statements take the worker's clock; none where they read the
// database's.
func (q *Store) pickArgs(now time.Time) []any {
	n := 3 // due: next attempt, lease; fresh: lease
	if q.keyOrdering {
		n = 5 // and each run's key lease
	}
	return q.clock.args(q.d.clock(now), n)
}

// freshArgCount is how many of pickArgs belong to the fresh run (the last ones).
func (q *Store) freshArgCount() int {
	if !q.clock.bound {
		return 0
	}
	if q.keyOrdering {
		return 2
	}
	return 1
}

// Done is a published batch whose rows Run marks done together with the next claim.
type Done struct {
	IDs   []int64
	Ctids []string
	Now   time.Time
}

// claim leases up to a batch of pending rows to owner for the lease, from the database's current time
// (now is the worker's, for a dialect that takes it). When prev is not nil, its rows are marked done
// (or deleted) in the same statement or transaction, and marked is how many of them were still
// leased to owner.
func (q *Store) Claim(ctx context.Context, owner string, now time.Time, prev *Done, deleteDone bool) (rows []Row, marked int64, err error) {
	if err := q.ready(ctx); err != nil {
		return nil, 0, err
	}
	return q.d.claim(ctx, q, owner, now, prev, deleteDone)
}

// claimArgs are the values of a claim's placeholders after those of the rows to mark: the lease's
// owner and expiry, then the runs'.
func (q *Store) claimArgs(owner string, now time.Time) []any {
	args := append([]any{owner}, q.clock.laterArgs(q.d.clock(now), q.lease, false)...)
	return append(args, q.pickArgs(now)...)
}

// inTx runs fn in a transaction: at the database's default level, or at READ COMMITTED on a
// partitioned MySQL table (mysqlRelay.partitionedTx).
func (q *Store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	var opts *sql.TxOptions
	if d, ok := q.d.(*mysqlRelay); ok {
		opts = d.partitionedTx
	}
	return q.inTxAt(ctx, opts, fn)
}

// inTxAt runs fn in a transaction with the given options (nil: the database's defaults). Where the
// database can end a transaction its client stopped talking to (relayIdleTimeout), the transaction is
// set up so: on PostgreSQL by its first statement (txSetup), on MariaDB on the worker's own connection
// (txConnLocked). A failed transaction gives that connection up: a partition or the server's idle
// timeout may have broken it, and the next transaction takes a fresh one.
func (q *Store) inTxAt(ctx context.Context, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	q.connMu.Lock()
	defer q.connMu.Unlock()
	conn, err := q.txConnLocked(ctx)
	if err != nil {
		return err
	}
	var tx *sql.Tx
	if conn != nil {
		tx, err = conn.BeginTx(ctx, opts)
	} else {
		tx, err = q.db.BeginTx(ctx, opts)
	}
	if err == nil {
		if set := q.d.txSetup(relayIdleTimeout); set != "" {
			_, err = tx.ExecContext(ctx, set)
		}
		if err == nil {
			err = fn(tx)
		}
		if err != nil {
			err = errors.Join(err, tx.Rollback())
		} else {
			err = tx.Commit()
		}
	}
	if err != nil || !q.holdConn {
		q.dropConnLocked()
	}
	return err
}

// relayIdleTimeout is how long the database waits on a relay's transaction that the relay stopped
// talking to — a relay cut off by a partition that drops packets, whose server sees no closed
// connection — before it ends the session or the transaction, and so lets go of the rows it locked.
// A relay's transactions send their statements back to back: they are idle for milliseconds.
const relayIdleTimeout = 2 * time.Second

// minHeldPool is the smallest connection limit of a pool (SetMaxOpenConns) of which a worker keeps a
// connection of its own on MariaDB while it runs. A smaller pool is not taken from for long: the
// worker sets a connection up for each claim and gives it back (two more statements per claim).
const minHeldPool = 4

// txConnLocked is the connection a transaction runs on: nil for one of the pool, or, on a database
// whose idle-transaction timeout is a session setting (MariaDB's idle_transaction_timeout), the
// worker's own, set up once with it. Setting it on a connection of the worker's keeps it off the
// application's: the connection is set back before it returns to the pool (dropConnLocked). On a
// server without the setting (MySQL) transactions run on the pool's connections, and a transaction
// cut off by a partition lasts until the server notices the connection is gone. q.connMu is held.
func (q *Store) txConnLocked(ctx context.Context) (*sql.Conn, error) {
	if q.conn != nil || q.noSession {
		return q.conn, nil
	}
	set := q.d.sessionSetup(relayIdleTimeout)
	if set == "" {
		return nil, nil
	}
	conn, err := q.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, set); err != nil {
		_ = conn.Close()
		if q.d.unknownSetting(err) {
			q.noSession = true
			return nil, nil
		}
		return nil, fmt.Errorf("set up the relay's connection: %w", err)
	}
	max := q.db.Stats().MaxOpenConnections
	q.holdConn = max == 0 || max >= minHeldPool
	q.conn = conn
	return conn, nil
}

// dropConnLocked gives the worker's connection back to the pool, set back as the application's are,
// or closed when that fails; q.connMu is held.
func (q *Store) dropConnLocked() {
	if q.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if _, err := q.conn.ExecContext(ctx, q.d.sessionReset()); err != nil {
		// A connection whose setting cannot be taken back is not given to the application.
		_ = q.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	cancel()
	_ = q.conn.Close()
	q.conn = nil
}

// releaseConn gives the worker's connection back to the pool, when the worker stops.
func (q *Store) ReleaseConn() {
	q.connMu.Lock()
	defer q.connMu.Unlock()
	q.dropConnLocked()
}

// HistoryEntry is the failed attempt a failure statement appends to its rows' histories, as the JSON
// object Entry writes for the worker that made it.
type HistoryEntry interface {
	Entry(worker string) string
}

// ErrUnsupportedDialect is New's error for a database the relay does not run on.
var ErrUnsupportedDialect = errors.New("unsupported database")

// Execer is a *sql.DB or *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// QueryExecer runs statements and queries: a *sql.DB or a *sql.Conn.
type QueryExecer interface {
	Execer
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// cleanupByKey is a dialect whose cleanupQuery selects the ids of a chunk, which cleanupDelete (the
// head of a DELETE, followed by an id list) then deletes by primary key.
type cleanupByKey interface {
	cleanupDelete(table string) string
}

// scanClaimed reads a claim's rows into a slice sized for a batch, scanning each straight into its
// element: per row, only what the driver must copy is allocated.
//
// With marked not nil, every row starts with a column that is -1 for a claimed row; a row where it is not
// is the count of rows the statement marked done, read into *marked.
func (q *Store) scanClaimed(rows *sql.Rows, attemptOffset int, withCtid bool, marked *int64) (out []Row, err error) {
	defer func() { err = errors.Join(err, rows.Close()) }()
	var (
		payload, headers []byte
		created          any
		attempts         int
		lastError        sql.NullString
		dest             []any
		mark             int64
	)
	for rows.Next() {
		if out == nil {
			// Sized on the first row, so that an empty poll allocates nothing; capped, so that a
			// huge batch size grows the slice as rows come.
			out = make([]Row, 0, min(q.batchSize, 1000))
			dest = make([]any, 0, 12)
		}
		out = append(out, Row{})
		r := &out[len(out)-1]
		m := &r.Msg
		payload, headers, created = nil, nil, nil
		dest = dest[:0]
		if marked != nil {
			dest = append(dest, &mark)
		}
		dest = append(dest, &r.ID, &m.ID, &m.EventType, &m.AggregateType, &m.AggregateID, &payload, &headers, &created, &attempts, &lastError)
		if withCtid {
			dest = append(dest, &r.Ctid)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan claimed row: %w", err)
		}
		if marked != nil && mark >= 0 {
			*marked = mark
			out = out[:len(out)-1]
			continue
		}
		m.Payload = payload
		if len(headers) > 0 && string(headers) != "null" {
			if err := json.Unmarshal(headers, &m.Headers); err != nil {
				m.Headers = nil
				r.Undecodable = fmt.Errorf("headers are not a JSON object of strings: %w", err)
			}
		}
		if t, err := dbtime.FromColumn(created); err != nil {
			r.Undecodable = errors.Join(r.Undecodable, fmt.Errorf("created_at: %w", err))
		} else {
			m.CreatedAt = t
		}
		m.Key = MessageKey(m.AggregateType, m.AggregateID)
		m.Attempt = attempts + attemptOffset
		r.Unfinished = lastError.Valid && lastError.String == UnfinishedDelivery
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sortClaimed(out)
	return out, nil
}

// sortClaimed puts a batch in creation order; RETURNING gives rows in no particular order.
func sortClaimed(rows []Row) {
	for i := 1; i < len(rows); i++ {
		for j := i; j > 0 && claimedBefore(rows[j], rows[j-1]); j-- {
			rows[j], rows[j-1] = rows[j-1], rows[j]
		}
	}
}

func claimedBefore(a, b Row) bool {
	if !a.Msg.CreatedAt.Equal(b.Msg.CreatedAt) {
		return a.Msg.CreatedAt.Before(b.Msg.CreatedAt)
	}
	return a.ID < b.ID
}

func RowIDs(rows []Row) []int64 {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return ids
}

// RowCtids returns the rows' ctids, or nil when the database has none.
func RowCtids(rows []Row) []string {
	if len(rows) == 0 || rows[0].Ctid == "" {
		return nil
	}
	ctids := make([]string, len(rows))
	for i, r := range rows {
		ctids[i] = r.Ctid
	}
	return ctids
}

// exec runs head <id list> tail, whose placeholders take headArgs, the ids and tailArgs in that order.
func (q *Store) Exec(ctx context.Context, ex Execer, head string, headArgs []any, ids []int64, tail string, tailArgs ...any) (int64, error) {
	in, idArgs := q.IdList(ids)
	args := make([]any, 0, len(headArgs)+len(idArgs)+len(tailArgs))
	args = append(append(append(args, headArgs...), idArgs...), tailArgs...)
	query, args := q.d.literal(q.Bind(head+in+tail), args)
	res, err := ex.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// markProcessed is the head of the assignments that mark a published row processed, up to its
// processed_at's value. It clears next_attempt_at (the time of a delayed event, or of the retry that
// got through): a processed row has no next attempt, and on MySQL and MariaDB that is what keeps
// the processed rows one run of the claim index in creation order (Admin.processedGroup).
const markProcessed = `processed = true, next_attempt_at = NULL, processed_at = `

// markDone records published rows: processed (the reference design), or deleted. It returns how many
// of them were still leased to owner.
func (q *Store) MarkDone(ctx context.Context, ex Execer, owner string, b Done, deleteRows bool) (int64, error) {
	match, args := q.rowsMatch(b.IDs, b.Ctids)
	query := `UPDATE ` + q.table + ` SET ` + markProcessed + q.clock.now + `, locked_by = NULL, locked_until = NULL WHERE `
	if deleteRows {
		query = `DELETE FROM ` + q.table + ` WHERE `
	} else {
		args = append(q.clock.args(q.d.clock(b.Now), 1), args...)
	}
	query, args = q.d.literal(q.Bind(query+match+` AND locked_by = ?`), append(args, owner))
	res, err := ex.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// markRetry records failed deliveries that will be retried at next, and appends rec to their
// histories.
// The retry time is backoff after the database's current time (the worker's, now, where it is taken).
func (q *Store) MarkRetry(ctx context.Context, ex Execer, owner string, ids []int64, lastError string, now time.Time, backoff time.Duration, rec HistoryEntry) error {
	head := append([]any{lastError}, q.clock.laterArgs(q.d.clock(now), backoff, true)...)
	if q.history > 0 {
		head = append(head, rec.Entry(owner))
	}
	_, err := q.Exec(ctx, ex, `UPDATE `+q.table+` SET last_error = ?, next_attempt_at = `+q.clock.by+`, `+q.historySet+`locked_by = NULL, locked_until = NULL WHERE `,
		head, ids, ` AND locked_by = ?`, owner)
	return err
}

// markDead records events given up on after a failed delivery, and appends rec to their histories.
func (q *Store) MarkDead(ctx context.Context, ex Execer, owner string, ids []int64, lastError string, now time.Time, rec HistoryEntry) error {
	head := append([]any{lastError}, q.clock.args(q.d.clock(now), 1)...)
	if q.history > 0 {
		head = append(head, rec.Entry(owner))
	}
	_, err := q.Exec(ctx, ex, `UPDATE `+q.table+` SET last_error = ?, dead_at = `+q.clock.now+`, `+q.historySet+`locked_by = NULL, locked_until = NULL WHERE `,
		head, ids, ` AND locked_by = ?`, owner)
	return err
}

// bury marks claimed rows dead before any delivery, giving back the attempt their claim counted. It
// appends nothing to their histories: no delivery was attempted (a row taken over from an unfinished
// delivery got that delivery's entry from its claim).
func (q *Store) Bury(ctx context.Context, ex Execer, owner string, ids []int64, lastError string, now time.Time) error {
	_, err := q.Exec(ctx, ex, `UPDATE `+q.table+` SET last_error = ?, dead_at = `+q.clock.now+`, attempts = attempts - 1, locked_by = NULL, locked_until = NULL WHERE `,
		append([]any{lastError}, q.clock.args(q.d.clock(now), 1)...), ids, ` AND locked_by = ?`, owner)
	return err
}

// countAttempt adds delta to the attempts of rows leased to owner; with delta 0 it hands them back
// (lease cleared) with their attempts as they are.
func (q *Store) CountAttempt(ctx context.Context, ex Execer, owner string, ids []int64, delta int) error {
	set := `attempts = attempts + ` + strconv.Itoa(delta)
	if delta == 0 {
		set = `locked_by = NULL, locked_until = NULL`
	}
	_, err := q.Exec(ctx, ex, `UPDATE `+q.table+` SET `+set+` WHERE `, nil, ids, ` AND locked_by = ?`, owner)
	return err
}

// renew extends the lease of the given rows that are still the owner's by q.lease from the database's
// current time (now is the worker's, for a dialect that takes it), and returns how many it extended;
// on PostgreSQL also where each now is (an UPDATE moves a row to a new ctid).
func (q *Store) Renew(ctx context.Context, owner string, ids []int64, now time.Time) (moved map[int64]string, n int64, err error) {
	in, idArgs := q.IdList(ids)
	query := `UPDATE ` + q.table + ` SET locked_until = ` + q.clock.later(q.lease) + ` WHERE ` + in + ` AND locked_by = ?`
	args := append(q.clock.laterArgs(q.d.clock(now), q.lease, false), idArgs...)
	query, args = q.d.literal(q.Bind(query), append(args, owner))
	return q.d.renew(ctx, q.db, query, args)
}

// execRenew is renew for databases that address rows by id alone.
func execRenew(ctx context.Context, db *sql.DB, query string, args []any) (map[int64]string, int64, error) {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return nil, 0, err
	}
	n, err := res.RowsAffected()
	return nil, n, err
}

// release hands rows back unpublished, without counting the attempt; a non-empty lastError is
// recorded as the rows' last error. Their histories are left alone: an attempt not counted is not one
// of the history's (see history.go).
func (q *Store) Release(ctx context.Context, ex Execer, owner string, ids []int64, lastError string) error {
	set := `UPDATE ` + q.table + ` SET locked_by = NULL, locked_until = NULL, attempts = attempts - 1`
	var head []any
	if lastError != "" {
		set += `, last_error = ?`
		head = []any{lastError}
	}
	_, err := q.Exec(ctx, ex, set+` WHERE `, head, ids, ` AND locked_by = ?`, owner)
	return err
}

// cleanupChunk deletes up to limit processed rows created before cutoff. The predicate spells
// processed = true out for the partial (processed, created_at) index. The dialect's query binds the
// cutoff once or more, then the limit. The cutoff goes through the dialect's clock: MariaDB bounds
// no index range by a time with nanoseconds, and read every processed row the table kept, in every
// chunk, until the cutoff was truncated.
func (q *Store) CleanupChunk(ctx context.Context, ex QueryExecer, cutoff time.Time, limit int) (int64, error) {
	cutoff = q.d.clock(cutoff)
	query := q.d.cleanupQuery(q.table)
	args := make([]any, 0, 3)
	for range strings.Count(query, "?") - 1 {
		args = append(args, cutoff)
	}
	args = append(args, limit)
	if byKey, ok := q.d.(cleanupByKey); ok {
		rows, err := ex.QueryContext(ctx, q.Bind(query), args...)
		if err != nil {
			return 0, err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, err
			}
			ids = append(ids, id)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil || len(ids) == 0 {
			return 0, err
		}
		in, idArgs := inList(ids)
		del, delArgs := q.d.literal(byKey.cleanupDelete(q.table)+in, idArgs)
		res, err := ex.ExecContext(ctx, del, delArgs...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	res, err := ex.ExecContext(ctx, q.Bind(query), args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// requeue makes dead events pending again: all of them, or those with the given message ids. Their
// histories stay: they are the record of what happened.
func (q *Store) Requeue(ctx context.Context, messageIDs []string) (int64, error) {
	query := `UPDATE ` + q.table + ` SET dead_at = NULL, attempts = 0, next_attempt_at = NULL WHERE dead_at IS NOT NULL`
	args := make([]any, len(messageIDs))
	if len(messageIDs) > 0 {
		query += ` AND message_id IN (` + strings.TrimSuffix(strings.Repeat("?,", len(messageIDs)), ",") + `)`
		for i, id := range messageIDs {
			args[i] = id
		}
	}
	res, err := q.db.ExecContext(ctx, q.Bind(query), args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Partitions is the table as internal/partition reads and maintains it, on the databases that
// partition it (PostgreSQL, MySQL/MariaDB): whether it is partitioned is the catalog's to say.
func (q *Store) Partitions() (partition.Table, bool) {
	if q.dialect != partition.Postgres && q.dialect != partition.MySQL {
		return partition.Table{}, false
	}
	return partition.NewTable(q.dialect, q.name), true
}

// DB is the pool the store's statements run on.
func (q *Store) DB() *sql.DB { return q.db }

// Table is the outbox table's name, quoted for the database.
func (q *Store) Table() string { return q.table }

// Listens reports whether the database wakes the worker with notifications (PostgreSQL's LISTEN).
func (q *Store) Listens() bool { return q.d.listens() }

// Retryable reports whether a claim that failed with err rolled back whole and may simply be run
// again at once (MySQL's deadlock victim).
func (q *Store) Retryable(err error) bool { return q.d.retryable(err) }

// Clock is now as the database's statements compare times: truncated to microseconds on MySQL and
// MariaDB, which bound no index range by a time with nanoseconds.
func (q *Store) Clock(now time.Time) time.Time { return q.d.clock(now) }

// Literal writes args into query as literals where that saves the database work (MySQL: a statement
// with arguments costs a round trip more), and returns query and args unchanged otherwise.
func (q *Store) Literal(query string, args []any) (string, []any) { return q.d.literal(query, args) }

// relayColumns are all the columns the relay reads or writes but attempt_history, which only a worker
// that keeps a history writes (Columns).
const relayColumns = returnedColumns + ", processed, processed_at, next_attempt_at, dead_at, locked_by, locked_until"

// Columns are all the columns the worker's statements read or write: a table of an earlier version,
// without attempt_history, serves a worker WithAttemptHistory(0) until it is migrated.
func (q *Store) Columns() string {
	if q.history > 0 {
		return relayColumns + ", attempt_history"
	}
	return relayColumns
}

// cleanupLockName names the cleanup lock of the relay's table.
func (q *Store) cleanupLockName() string {
	return "outboxplugin.cleanup." + q.table
}

// TryCleanupLock takes the table's cleanup lock on conn without waiting, as CleanupChunkLocked does;
// release lets go of it. On PostgreSQL it lasts as long as a transaction begun on conn, which release
// rolls back: conn runs nothing else meanwhile.
func (q *Store) TryCleanupLock(ctx context.Context, conn *sql.Conn) (release func(), got bool, err error) {
	_, unlock, got, err := q.d.tryLock(ctx, conn, q.cleanupLockName())
	if err != nil || !got {
		return nil, false, err
	}
	return func() { _ = unlock(false) }, true, nil
}

// CleanupChunkLocked is CleanupChunk under the table's cleanup lock, taken on conn for the chunk
// alone and without waiting: got is false, and nothing is deleted, when another holds it. On
// PostgreSQL the lock is transaction-scoped (pg_try_advisory_xact_lock) and the chunk runs in its
// transaction: a lock of the session would stay with whichever server connection a transaction
// pooler (PgBouncer in transaction mode) ran it on, and its unlock could run on another.
func (q *Store) CleanupChunkLocked(ctx context.Context, conn *sql.Conn, cutoff time.Time, limit int) (n int64, got bool, err error) {
	held, release, got, err := q.d.tryLock(ctx, conn, q.cleanupLockName())
	if err != nil || !got {
		return 0, false, err
	}
	n, err = q.CleanupChunk(ctx, held, cutoff, limit)
	if rerr := release(err == nil); err == nil && rerr != nil {
		// Only a transaction's end fails here (PostgreSQL): its chunk did not commit.
		return 0, true, fmt.Errorf("commit the cleanup chunk: %w", rerr)
	}
	return n, true, err
}

// CleanupStep takes the table's cleanup lock on conn without waiting, for one step of a cleanup (a
// partition made or dropped): the step's statements run on held, which on PostgreSQL is a transaction
// begun on conn that the lock lasts as long as, and on MySQL/MariaDB conn itself; release ends it,
// keeping the step's work when keep is true. got is false, and nothing is held, when another relay
// holds the lock. With exclusive false no lock is taken (Worker.Cleanup, Admin.Cleanup), but held is
// still a transaction on PostgreSQL.
func (q *Store) CleanupStep(ctx context.Context, conn *sql.Conn, exclusive bool) (held QueryExecer, release func(keep bool) error, got bool, err error) {
	if exclusive {
		return q.d.tryLock(ctx, conn, q.cleanupLockName())
	}
	if _, ok := q.d.(*pgRelay); ok {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return nil, nil, false, err
		}
		return tx, func(keep bool) error {
			if keep {
				return tx.Commit()
			}
			return tx.Rollback()
		}, true, nil
	}
	return conn, func(bool) error { return nil }, true, nil
}

// SetClaimIsolation sets the isolation level of the MySQL/MariaDB claim transactions (by default the
// server's, REPEATABLE READ), for benchmarks that compare levels; other databases ignore it.
func (q *Store) SetClaimIsolation(level sql.IsolationLevel) {
	if d, ok := q.d.(*mysqlRelay); ok {
		d.tx = &sql.TxOptions{Isolation: level}
	}
}

// SetAfterClaimLock makes MySQL/MariaDB claims call fn between taking their row locks and stamping the
// rows, for tests that cut the relay off there; other databases ignore it.
func (q *Store) SetAfterClaimLock(fn func()) {
	if d, ok := q.d.(*mysqlRelay); ok {
		d.afterLock = fn
	}
}
