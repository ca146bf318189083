package capture

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/internal/capture/txsql"
	"github.com/gorm-outbox/outboxplugin/internal/sqlerr"
)

// The transaction watch. db.Use wraps the database's connection pool, so that the plugin sees the
// transactions the application runs, and does two things with them.
//
// One outbox write per transaction. The events of a transaction's statements are kept in the
// transaction and written together, in one multi-row INSERT, just before it commits: a transaction of
// ten writes pays one outbox round trip, not ten. They are written earlier only where the transaction
// could otherwise see the outbox table without them, end without them, or grow without bound:
//
//   - before a SAVEPOINT, so that every event held comes from a statement after the latest savepoint:
//     a rollback to any savepoint then undoes exactly the events held (they are dropped), and the
//     database undoes those written since the savepoint with their rows;
//   - before COMMIT by hand, and before statements MySQL commits a transaction before (DDL, LOCK
//     TABLES, …), and before any other statement run with Exec (the raw callback chain), which may be
//     anything;
//   - before a query or Row/Rows of the outbox table (by Table, Model or SQL text naming it);
//   - once MaxRowsPerInsert events (or maxHeldBytes of them) are held: a transaction of a million
//     writes holds at most one INSERT's worth, and sends the INSERTs it would have sent at commit.
//
// A ROLLBACK or ROLLBACK TO SAVEPOINT never writes them: it drops those it undoes, so that a
// statement that failed inside a savepoint (a duplicate key; on PostgreSQL, which then refuses every
// statement until the rollback) is recovered from exactly as without the plugin. Transaction
// statements are recognised on every path GORM gives them to the connection (Exec, Raw(...).Row,
// Rows and Scan, the connection's ExecContext, QueryContext and QueryRowContext, prepared statements
// of PrepareStmt), with comments before them and in any letter case (internal/capture/txsql).
//
// Held events are written with the context the transaction was begun with, carrying the values of
// the statement that held the last of them: a statement's own context (a per-call timeout that has
// ended by the time the service commits) decides nothing about the commit. A write that fails rolls
// the transaction back and fails its commit, so no row is committed without its event; a
// transaction the database rolled back whole (a MySQL or MariaDB deadlock) gets none of its events
// written, refuses further writes, and fails its commit. A transaction the wrapper did not begin (a
// session made before db.Use, a connection pinned with db.Connection, one begun by another plugin on
// its own pool) gets its events right after each statement, as it did before.
//
// Wake-up after commit (PostgreSQL). pg_notify inside the application's transaction would make
// PostgreSQL serialise the commit of every transaction that wrote events (the notify queue's lock is
// taken at commit, cluster-wide): concurrent writers would queue behind each other. Instead, when a
// transaction that wrote events has committed, the plugin
//
//   - wakes the Workers of this process that relay the same table, with no database round trip (on
//     every database), and
//   - on PostgreSQL with notifications on, sends one NOTIFY for the relays of other processes, from a
//     connection of the pool and outside the application's transaction, at most once per
//     notifyInterval: a commit during an interval is covered by the NOTIFY that ends it.
//
// A transaction the wrapper did not begin is announced as before, by pg_notify inside it. Polling
// stays the correctness path: a wake-up lost to a failed NOTIFY, or to a commit that failed
// ambiguously, only delays events until the next poll.

// notifyInterval is the shortest time between the starts of two NOTIFYs of one plugin. Measured with
// a relay listening in another process, at 500 commits per second (BenchmarkWakeUpLatency,
// postgres/other-pool), interleaved in one run: 5 ms from the end of one NOTIFY to the next, p50
// 4.5 ms; 2 ms from the end, p50 4.1–4.3 ms; 2 ms from the start, p50 3.4–3.8 ms (docs/benchmarks.md).
const notifyInterval = 2 * time.Millisecond

// notifyTimeout bounds one NOTIFY; a pool at its connection limit may make it wait.
const notifyTimeout = time.Second

// maxHeldBytes bounds the payload and header bytes a transaction holds: events of large payloads are
// written before MaxRowsPerInsert of them are held.
const maxHeldBytes = 8 << 20

// Watch sees the transactions begun on one pool.
type Watch struct {
	pool    gorm.ConnPool // the pool under the wrapper: NOTIFYs go through it
	dialect string
	channel string // the outbox table: the channel workers LISTEN on
	notify  bool   // send a NOTIFY after commits (PostgreSQL, notifications on)

	wakers sync.Map // Waker -> struct{}: running relays of this process on the channel's table

	prepared txsql.Prepared // transaction statements prepared on the pool (PrepareStmt)

	// heldConn: transactions are begun on a connection the watch holds, so that the held events
	// ride on the COMMIT (conntx.go): PostgreSQL with pgx, on a *sql.DB. Off once GORM's
	// PrepareStmt is seen (prepares), or when pgx's transaction status cannot be read.
	heldConn atomic.Bool
	prepares atomic.Bool
	texts    txsql.StmtMap[string] // texts of the statements prepared on the pool, with heldConn

	// rollbackOnTimeout is MySQL's innodb_rollback_on_timeout, read at the first lock wait timeout:
	// 0 not read yet, 1 off (a timeout undoes the statement), 2 on (the whole transaction).
	rollbackOnTimeout atomic.Int32

	mu      sync.Mutex
	pending bool // a commit since the last NOTIFY started
	running bool // the notifying goroutine runs

	sent   atomic.Int64 // NOTIFYs sent, for tests
	failed atomic.Int64 // NOTIFYs that failed (the poll covers them)
}

// Install wraps db's connection pool so that the plugin sees transactions. It runs from
// Initialize, before the database is used by the plugin's callbacks. Any gorm.ConnPool will do: the
// watch needs no *sql.DB.
func Install(db *gorm.DB, table string, notify bool) (*Watch, error) {
	if cw := WatchOf(db); cw != nil {
		return cw, nil // the pool is watched already (db.Use twice)
	}
	cw := &Watch{dialect: db.Dialector.Name(), channel: table, notify: notify}
	old := db.Config.ConnPool
	switch cp := old.(type) {
	case nil:
		return nil, gorm.ErrInvalidDB
	case *gorm.PreparedStmtDB:
		// Keep *gorm.PreparedStmtDB outermost: the PostgreSQL migrator and dbresolver look for it.
		cw.pool = cp.ConnPool
		cp.ConnPool = &watchedPool{ConnPool: cp.ConnPool, cw: cw}
	default:
		cw.pool = old
		db.Config.ConnPool = &watchedPool{ConnPool: old, cw: cw}
		if sqlDB, ok := old.(*sql.DB); ok && cw.dialect == "postgres" && isPgx(sqlDB) {
			cw.heldConn.Store(true)
		}
	}
	if db.Statement != nil && db.Statement.ConnPool == old {
		db.Statement.ConnPool = db.Config.ConnPool
	}
	return cw, nil
}

// CommitSeparately has the pool's transactions begun on *sql.Tx, their events written in an INSERT
// before the COMMIT, on every driver; for benchmarks to compare.
func (cw *Watch) CommitSeparately() { cw.heldConn.Store(false) }

// TxOf returns the watched transaction under pool (the connection of a statement), or nil when
// the wrapper did not begin it.
func TxOf(pool gorm.ConnPool) *Tx {
	if w, ok := pool.(StandIn); ok {
		pool = w.StoodFor()
	}
	switch tx := pool.(type) {
	case *Tx:
		return tx
	case *gorm.PreparedStmtTX:
		if t, ok := tx.Tx.(*Tx); ok {
			return t
		}
	}
	return nil
}

// WatchOf returns the watch installed on db's pool, or nil.
func WatchOf(db *gorm.DB) *Watch {
	pool := db.Config.ConnPool
	if ps, ok := pool.(*gorm.PreparedStmtDB); ok {
		pool = ps.ConnPool
	}
	if wp, ok := pool.(*watchedPool); ok {
		return wp.cw
	}
	return nil
}

// committed announces a commit: it wakes this process's workers at once and, with notify, makes sure
// a NOTIFY starts within notifyInterval. It never blocks.
func (cw *Watch) committed() {
	cw.wakers.Range(func(k, _ any) bool {
		k.(Waker).Wake()
		return true
	})
	if !cw.notify {
		return
	}
	cw.mu.Lock()
	cw.pending = true
	if !cw.running {
		cw.running = true
		go cw.notifyLoop()
	}
	cw.mu.Unlock()
}

// notifyLoop sends a NOTIFY, waits notifyInterval, and sends another if a commit came meanwhile; it
// returns when none did, so an idle process runs no goroutine for it.
func (cw *Watch) notifyLoop() {
	for {
		cw.mu.Lock()
		if !cw.pending {
			cw.running = false
			cw.mu.Unlock()
			return
		}
		cw.pending = false
		cw.mu.Unlock()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		if _, err := cw.pool.ExecContext(ctx, `SELECT pg_notify($1, '')`, cw.channel); err != nil {
			cw.failed.Add(1)
		} else {
			cw.sent.Add(1)
		}
		cancel()
		// The interval runs from the start of this NOTIFY, not its end: a commit waits at most one
		// interval (or the NOTIFY's round trip, when longer) for the next.
		time.Sleep(notifyInterval - time.Since(start))
	}
}

// watchedPool is the application's connection pool, beginning transactions the plugin sees. It does
// not embed *sql.DB on purpose: GORM's Begin prefers a BeginTx that returns *sql.Tx, and would go
// around the wrapper.
type watchedPool struct {
	gorm.ConnPool
	cw *Watch
}

var (
	_ gorm.ConnPoolBeginner = (*watchedPool)(nil)
	_ gorm.GetDBConnector   = (*watchedPool)(nil)
	_ gorm.Tx               = (*Tx)(nil)
)

func (p *watchedPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	var (
		inner gorm.ConnPool
		err   error
	)
	if p.cw.heldConn.Load() && !p.cw.prepares.Load() {
		ct, err := p.cw.beginOnConn(ctx, p.ConnPool.(*sql.DB), opts)
		switch {
		case err == nil:
			return &Tx{Tx: ct, cw: p.cw, pool: p, ctx: ctx}, nil
		case errors.Is(err, errStatusUnknown):
			p.cw.heldConn.Store(false)
		default:
			return nil, err
		}
	}
	switch b := p.ConnPool.(type) {
	case gorm.TxBeginner:
		var tx *sql.Tx
		if tx, err = b.BeginTx(ctx, opts); err == nil {
			inner = tx
		}
	case gorm.ConnPoolBeginner:
		inner, err = b.BeginTx(ctx, opts)
	default:
		return nil, gorm.ErrInvalidTransaction
	}
	if err != nil {
		return nil, err
	}
	t, ok := inner.(gorm.Tx)
	if !ok {
		return nil, errors.New("outboxplugin: the connection pool began a transaction that is not a gorm.Tx")
	}
	return &Tx{Tx: t, cw: p.cw, pool: p, ctx: ctx}, nil
}

// PrepareContext prepares a statement on the pool, remembering what a transaction statement does for
// when a transaction runs it (PrepareStmt).
func (p *watchedPool) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	stmt, err := p.ConnPool.PrepareContext(ctx, query)
	if err == nil {
		p.cw.prepared.Remember(stmt, txsql.Parse(query, p.cw.dialect == "postgres"))
		if p.cw.heldConn.Load() {
			p.cw.texts.Remember(stmt, query)
		}
	}
	return stmt, err
}

// GetDBConn keeps db.DB() working: the *sql.DB of the pool under the wrapper, or gorm.ErrInvalidDB
// when it has none (a gorm.ConnPool of the application's own), as without the plugin.
func (p *watchedPool) GetDBConn() (*sql.DB, error) {
	switch cp := p.ConnPool.(type) {
	case *sql.DB:
		return cp, nil
	case gorm.GetDBConnector:
		return cp.GetDBConn()
	}
	return nil, gorm.ErrInvalidDB
}

// Ping and the pool's settings, which code reaches by asserting them on a ConnPool (gorm.Open's ping,
// dbresolver's pool settings): passed to the pool under the wrapper when it has them, else to its
// *sql.DB when it has one, else ignored, as they would be without the wrapper.
func (p *watchedPool) Ping() error { return p.PingContext(context.Background()) }

func (p *watchedPool) PingContext(ctx context.Context) error {
	switch pg := p.ConnPool.(type) {
	case interface{ PingContext(context.Context) error }:
		return pg.PingContext(ctx)
	case interface{ Ping() error }:
		return pg.Ping()
	}
	return nil
}

func (p *watchedPool) SetMaxOpenConns(n int) {
	if s, ok := p.ConnPool.(interface{ SetMaxOpenConns(int) }); ok {
		s.SetMaxOpenConns(n)
	} else if db, err := p.GetDBConn(); err == nil {
		db.SetMaxOpenConns(n)
	}
}

func (p *watchedPool) SetMaxIdleConns(n int) {
	if s, ok := p.ConnPool.(interface{ SetMaxIdleConns(int) }); ok {
		s.SetMaxIdleConns(n)
	} else if db, err := p.GetDBConn(); err == nil {
		db.SetMaxIdleConns(n)
	}
}

func (p *watchedPool) SetConnMaxLifetime(d time.Duration) {
	if s, ok := p.ConnPool.(interface{ SetConnMaxLifetime(time.Duration) }); ok {
		s.SetConnMaxLifetime(d)
	} else if db, err := p.GetDBConn(); err == nil {
		db.SetConnMaxLifetime(d)
	}
}

func (p *watchedPool) SetConnMaxIdleTime(d time.Duration) {
	if s, ok := p.ConnPool.(interface{ SetConnMaxIdleTime(time.Duration) }); ok {
		s.SetConnMaxIdleTime(d)
	} else if db, err := p.GetDBConn(); err == nil {
		db.SetConnMaxIdleTime(d)
	}
}

func (p *watchedPool) Close() error {
	if c, ok := p.ConnPool.(interface{ Close() error }); ok {
		return c.Close()
	}
	if db, err := p.GetDBConn(); err == nil {
		return db.Close()
	}
	return nil
}

// Tx is a transaction the plugin sees: it holds the events of its statements until they are
// written, follows its savepoints, and announces its commit.
type Tx struct {
	gorm.Tx // *sql.Tx, or what a pool under the wrapper began
	cw      *Watch
	pool    *watchedPool
	// ctx is the context the transaction was begun with, which held events are written with:
	// database/sql rolls the transaction back when it ends, so it lives as long as the transaction.
	ctx   context.Context
	dirty atomic.Bool // events were written in it

	mu        sync.Mutex
	held      []Event  // events not written yet, in the order of their statements
	heldBytes int      // their payload and header bytes
	origins   []string // the statements they come from ("create User"), for errors
	holder    *gorm.DB // the statement that held the last of them: dialect, logger
	holderCtx context.Context
	inserter  *Inserter
	// savepoints are the savepoints set in the transaction and not yet released or rolled past,
	// oldest first, named as the database compares them.
	savepoints []string
	// failed: held events could not be written, a statement's events could not be made, or a
	// rollback went to a savepoint the plugin did not see set while events were held. The
	// transaction cannot commit, unless it rolls back to a savepoint set before the failure
	// (failedDepth is how many savepoints were set then): that undoes the rows without events.
	failed      error
	failedDepth int
	// rolledBack: the database rolled the whole transaction back (a MySQL deadlock). Nothing may be
	// written in it any more: later statements would each commit on their own.
	rolledBack error
	// ended: the application ended the transaction with a COMMIT or ROLLBACK statement of its own.
	// Later writes would each commit on their own, apart from their events: they are refused.
	ended error
}

// hold keeps events of the statement db, described by origin, until the transaction writes them. It
// writes them at once when the transaction holds a full INSERT's worth, so that a transaction of any
// size holds at most that many.
func (t *Tx) hold(p *Inserter, db *gorm.DB, events []Event, origin string) error {
	t.mu.Lock()
	if err := t.closedLocked(); err != nil {
		t.mu.Unlock()
		return err
	}
	t.dirty.Store(true)
	t.held = append(t.held, events...)
	for i := range events {
		t.heldBytes += len(events[i].Payload)
		if events[i].Headers != nil {
			t.heldBytes += len(*events[i].Headers)
		}
	}
	if n := len(t.origins); n == 0 || t.origins[n-1] != origin {
		t.origins = append(t.origins, origin)
	}
	t.holder, t.holderCtx, t.inserter = db, db.Statement.Context, p
	full := len(t.held) >= MaxRowsPerInsert || t.heldBytes >= maxHeldBytes
	t.mu.Unlock()
	if full {
		return t.flush(false)
	}
	return nil
}

// holding reports whether events wait to be written.
func (t *Tx) holding() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.held) > 0
}

// flush writes the events held so far, in INSERTs of up to MaxRowsPerInsert rows; with all false,
// only whole INSERTs' worth (the rest stays held, unless it is too large). An error names the
// statements the events come from, and makes the transaction unable to commit.
func (t *Tx) flush(all bool) error {
	t.mu.Lock()
	if t.rolledBack != nil {
		err := t.rolledBack
		t.mu.Unlock()
		return err
	}
	if t.failed != nil {
		err := t.failed
		t.mu.Unlock()
		return err
	}
	n := len(t.held)
	if !all && t.heldBytes < maxHeldBytes {
		n -= n % MaxRowsPerInsert
	}
	if n == 0 {
		t.mu.Unlock()
		return nil
	}
	events, origins, db, values, p := t.held[:n], t.origins, t.holder, t.holderCtx, t.inserter
	if n == len(t.held) {
		t.held, t.origins, t.heldBytes = nil, nil, 0
	} else {
		// A new array for the rest, so that the written events can be collected.
		t.held = append([]Event(nil), t.held[n:]...)
		t.origins = append([]string(nil), origins[len(origins)-1])
		t.heldBytes = 0
		for i := range t.held {
			t.heldBytes += len(t.held[i].Payload)
		}
	}
	t.mu.Unlock()
	ctx := txContext{Context: t.ctx, values: values}
	if err := p.insertNow(ctx, db, t.Tx, events, p.notifyInTransaction(db, t)); err != nil {
		t.observe(err)
		if ctxErr := t.ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w (the context the transaction was begun with has ended: %w)", err, ctxErr)
		}
		err = fmt.Errorf("outboxplugin: %s: %w", describeOrigins(origins), err)
		// Some databases let the transaction go on after a failed statement, and GORM's SavePoint
		// does not return the error of its Exec: the commit must fail, or the rows of these events
		// would commit without them.
		t.Fail(err)
		return err
	}
	return nil
}

// Fail makes the transaction unable to commit: rows of its statements are written without their
// events. All events held come from statements after the latest savepoint, and so does a failed
// statement: a rollback to that savepoint or an earlier one undoes them, and lets the transaction
// commit again, as it would without the plugin.
func (t *Tx) Fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failed == nil {
		t.failed, t.failedDepth = err, len(t.savepoints)
	}
}

// txContext is the context held events are written with: the deadline and cancellation of the
// context the transaction was begun with, and the values of the statement that held the last of
// them, so that loggers and tracing see the write as part of that statement's request.
type txContext struct {
	context.Context
	values context.Context
}

func (c txContext) Value(key any) any {
	if v := c.values.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}

// describeOrigins lists the first statements of a transaction's events: "create User, update Order
// and 3 more".
func describeOrigins(origins []string) string {
	const shown = 3
	if len(origins) <= shown {
		return strings.Join(origins, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(origins[:shown], ", "), len(origins)-shown)
}

// dropLocked forgets the events held, which a rollback undid. t.mu is held.
func (t *Tx) dropLocked() {
	t.held, t.origins, t.holder, t.holderCtx, t.heldBytes = nil, nil, nil, nil, 0
}

// Commit writes the events held and commits. When they cannot be written, or the database rolled
// the transaction back earlier, the transaction is rolled back and Commit fails: its rows are not
// committed without their events.
func (t *Tx) Commit() error {
	t.mu.Lock()
	failed, rolledBack := t.failed, t.rolledBack
	t.mu.Unlock()
	if rolledBack != nil {
		if rerr := t.Tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			return fmt.Errorf("%w (rolling back failed too: %v)", rolledBack, rerr)
		}
		return rolledBack
	}
	if failed != nil {
		if rerr := t.Tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			return fmt.Errorf("%w (written before commit; rolling back failed too: %v)", failed, rerr)
		}
		return fmt.Errorf("%w (written before commit; the transaction is rolled back)", failed)
	}
	if ct, ok := t.Tx.(*connTx); ok && ct.live() {
		if done, err := t.commitOnConn(ct); done {
			return err
		}
	}
	if err := t.flush(true); err != nil {
		if rerr := t.Tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			return fmt.Errorf("%w (written at commit; rolling back failed too: %v)", err, rerr)
		}
		return fmt.Errorf("%w (written at commit; the transaction is rolled back)", err)
	}
	err := t.Tx.Commit()
	if err == nil && t.dirty.Load() {
		t.cw.committed()
	}
	return err
}

// Rollback forgets the events held and rolls back.
func (t *Tx) Rollback() error {
	t.mu.Lock()
	t.dropLocked()
	t.savepoints = nil
	t.mu.Unlock()
	return t.Tx.Rollback()
}

// ExecContext runs a statement on the transaction's connection. A transaction statement is acted on
// when the database has run it (see before and after).
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	s := txsql.Parse(query, t.cw.dialect == "postgres")
	if err := t.before(s); err != nil {
		return nil, err
	}
	res, err := t.Tx.ExecContext(ctx, query, args...)
	if err != nil {
		t.observe(err)
		return res, err
	}
	t.after(s)
	return res, nil
}

// QueryContext runs a query on the transaction's connection. A transaction statement sent this way
// (Raw(...).Rows, Scan) is acted on before it is sent, when its context has not ended: some drivers
// run the statement only when its rows are read, after this returns.
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	s := txsql.Parse(query, t.cw.dialect == "postgres")
	if err := t.before(s); err != nil {
		return nil, err
	}
	if ctx.Err() == nil {
		t.after(s)
	}
	rows, err := t.Tx.QueryContext(ctx, query, args...)
	if err != nil {
		t.observe(err)
	}
	return rows, err
}

// QueryRowContext is QueryContext for one row (Raw(...).Row).
func (t *Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	s := txsql.Parse(query, t.cw.dialect == "postgres")
	if s.Kind != txsql.Other {
		if err := t.before(s); err == nil && ctx.Err() == nil {
			t.after(s)
		}
		// A failed write of the held events has made the transaction unable to commit; the
		// statement itself goes on, as it would without the plugin.
	}
	return t.Tx.QueryRowContext(ctx, query, args...)
}

// PrepareContext prepares a statement in the transaction, remembering what a transaction statement
// does for when it runs (PrepareStmt).
func (t *Tx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	stmt, err := t.Tx.PrepareContext(ctx, query)
	if err == nil {
		t.cw.prepared.Remember(stmt, txsql.Parse(query, t.cw.dialect == "postgres"))
		if _, held := t.Tx.(*connTx); held {
			// GORM's PrepareStmt: its statements are kept better per connection by *sql.Tx.
			t.cw.prepares.Store(true)
		}
	}
	return stmt, err
}

// StmtContext gives a prepared statement to the transaction; GORM's PrepareStmt runs every statement
// of a transaction through it, right before executing it. A transaction statement is acted on then,
// as QueryContext does.
func (t *Tx) StmtContext(ctx context.Context, stmt *sql.Stmt) *sql.Stmt {
	if s, ok := t.cw.prepared.Lookup(stmt); ok {
		if err := t.before(s); err == nil && ctx.Err() == nil {
			t.after(s)
		}
	}
	return t.Tx.StmtContext(ctx, stmt)
}

// before runs before a statement reaches the database: the events held are written before a
// SAVEPOINT (so that all events held come from statements after the latest savepoint) and before a
// statement that may commit. A ROLLBACK is never preceded by a write: the transaction may be one the
// database refuses every statement in until the rollback (PostgreSQL after an error). Nothing but a
// ROLLBACK is sent in a transaction the database rolled back whole.
func (t *Tx) before(s txsql.Statement) error {
	switch s.Kind {
	case txsql.Rollback, txsql.RollbackTo:
		return nil
	}
	t.mu.Lock()
	rolledBack, holding := t.rolledBack, len(t.held) > 0
	t.mu.Unlock()
	if rolledBack != nil {
		return rolledBack
	}
	switch s.Kind {
	case txsql.Savepoint, txsql.Commit, txsql.MayCommit:
		if !holding {
			return nil
		}
		if err := t.flush(true); err != nil {
			return fmt.Errorf("%w (written before %s)", err, txStatementName(s.Kind))
		}
	}
	return nil
}

func txStatementName(k txsql.Kind) string {
	switch k {
	case txsql.Savepoint:
		return "SAVEPOINT"
	case txsql.Commit:
		return "COMMIT"
	}
	return "a statement that may commit"
}

// after records what a transaction statement did: the savepoint it set, released or rolled back to,
// and for a rollback the events it undid, which are dropped. A rollback to a savepoint the plugin
// did not see set (SQL sent around GORM, on SQLTx's *sql.Tx) while events are held cannot be
// matched with them: the transaction is failed instead of committing with events of rows that are
// gone or without events of rows that stay.
func (t *Tx) after(s txsql.Statement) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s.Kind {
	case txsql.Savepoint:
		if t.cw.dialect == "mysql" {
			// MySQL and MariaDB replace a savepoint of the same name; the others stack it.
			if i := t.savepointIndex(s.Savepoint); i >= 0 {
				t.savepoints = append(t.savepoints[:i], t.savepoints[i+1:]...)
				if t.failed != nil && i < t.failedDepth {
					t.failedDepth--
				}
			}
		}
		t.savepoints = append(t.savepoints, s.Savepoint)
	case txsql.Release:
		if i := t.savepointIndex(s.Savepoint); i >= 0 {
			t.savepoints = t.savepoints[:i] // released with every later one
			t.failedDepth = min(t.failedDepth, i)
		}
	case txsql.RollbackTo:
		i := t.savepointIndex(s.Savepoint)
		if i >= 0 {
			if t.failed != nil && i < t.failedDepth {
				t.failed = nil // the rollback undoes what failed
			}
			t.savepoints = t.savepoints[:i+1] // later ones are gone; this one stays
		} else if len(t.held) > 0 && t.failed == nil {
			t.failed = fmt.Errorf("outboxplugin: %w: ROLLBACK TO SAVEPOINT %s while events of %s were held; set savepoints through GORM (Exec, SavePoint, Transaction) or the transaction's connection",
				ErrUnknownSavepoint, s.Savepoint, describeOrigins(t.origins))
			t.failedDepth = 0
		}
		t.dropLocked()
	case txsql.Rollback:
		t.dropLocked()
		t.savepoints, t.failed = nil, nil
		if !s.Chain {
			t.ended = fmt.Errorf("outboxplugin: %w by a ROLLBACK statement: a write after it would commit on its own, without its event in the same transaction", ErrTransactionEnded)
		}
	case txsql.Commit:
		t.savepoints = nil
		if !s.Chain {
			t.ended = fmt.Errorf("outboxplugin: %w by a COMMIT statement: a write after it would commit on its own, without its event in the same transaction", ErrTransactionEnded)
		}
	}
}

// savepointIndex is the position of the latest savepoint named name, or -1. t.mu is held.
func (t *Tx) savepointIndex(name string) int {
	for i := len(t.savepoints) - 1; i >= 0; i-- {
		if t.savepoints[i] == name {
			return i
		}
	}
	return -1
}

// observe looks at the error of a statement of the transaction. When it says the database rolled
// the whole transaction back — a deadlock on MySQL and MariaDB, or a lock wait timeout with
// innodb_rollback_on_timeout — the events held are dropped and nothing more may be written: the
// statements that follow would each commit on their own.
func (t *Tx) observe(err error) {
	if err == nil || t.cw.dialect != "mysql" {
		return
	}
	code, ok := sqlerr.MySQLNumber(err)
	if !ok {
		return
	}
	switch code {
	case mysqlDeadlock:
	case mysqlLockWaitTimeout:
		if !t.cw.rollsBackOnTimeout(t.Tx) {
			return
		}
	default:
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rolledBack == nil {
		t.rolledBack = fmt.Errorf("outboxplugin: %w: %w", ErrTransactionRolledBack, err)
	}
	t.dropLocked()
	t.savepoints = nil
}

// rolledBackErr is the error of a transaction the database rolled back whole, or nil.
func (t *Tx) rolledBackErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rolledBack
}

// ClosedErr is the error of a transaction no write may join any more — rolled back whole by the
// database, or ended by a COMMIT or ROLLBACK statement of the application's — or nil.
func (t *Tx) ClosedErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closedLocked()
}

func (t *Tx) closedLocked() error {
	if t.rolledBack != nil {
		return t.rolledBack
	}
	return t.ended
}

// GetDBConn keeps db.DB() working inside a transaction.
func (t *Tx) GetDBConn() (*sql.DB, error) { return t.pool.GetDBConn() }

// SQLTx returns the *sql.Tx under the transaction, for code that needs it
// (tx.Statement.ConnPool.(*sql.Tx) no longer matches once the plugin is registered). The plugin does
// not see what is sent on it: events of the transaction's statements may not be in the outbox table
// yet (they are written at the latest before commit), and savepoints set or rolled back on it are
// not followed (docs/capture.md).
func (t *Tx) SQLTx() (*sql.Tx, bool) {
	tx, ok := t.Tx.(*sql.Tx)
	return tx, ok
}

// SQLConn returns the connection the transaction runs on when the plugin began it on a connection
// it holds (PostgreSQL with pgx, where the held events ride on the COMMIT), and false otherwise
// (then SQLTx has it). What is sent on it is not seen, as with SQLTx; it must not be closed, nor
// the transaction ended on it.
func (t *Tx) SQLConn() (*sql.Conn, bool) {
	if ct, ok := t.Tx.(*connTx); ok {
		return ct.conn, true
	}
	return nil, false
}

// Waker is a relay of this process that a commit wakes (the root's Worker).
type Waker interface{ Wake() }

// AddWaker has every commit of a transaction that wrote events wake k, until RemoveWaker.
func (cw *Watch) AddWaker(k Waker) { cw.wakers.Store(k, struct{}{}) }

// RemoveWaker undoes AddWaker.
func (cw *Watch) RemoveWaker(k Waker) { cw.wakers.Delete(k) }

// Channel is the outbox table whose commits the watch announces.
func (cw *Watch) Channel() string { return cw.channel }

// Sent is how many wake-up NOTIFYs the watch sent, for tests.
func (cw *Watch) Sent() int64 { return cw.sent.Load() }

// StandIn is a connection that stands in for the statement's own while the statement runs (the
// capture's write), so that TxOf finds the transaction under it.
type StandIn interface{ StoodFor() gorm.ConnPool }

// MySQL and MariaDB error numbers that say the transaction was rolled back.
const (
	mysqlLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT: the statement, or with innodb_rollback_on_timeout the transaction
	mysqlDeadlock        = 1213 // ER_LOCK_DEADLOCK: the transaction
)

// rollsBackOnTimeout reports whether a lock wait timeout rolls back the whole transaction
// (innodb_rollback_on_timeout), read once through tx. When it cannot be read, it answers yes: then
// the transaction cannot commit, rather than commit events of rows that may be gone.
func (cw *Watch) rollsBackOnTimeout(tx gorm.ConnPool) bool {
	switch cw.rollbackOnTimeout.Load() {
	case 1:
		return false
	case 2:
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var on bool
	if err := tx.QueryRowContext(ctx, `SELECT @@innodb_rollback_on_timeout`).Scan(&on); err != nil {
		return true
	}
	if on {
		cw.rollbackOnTimeout.Store(2)
	} else {
		cw.rollbackOnTimeout.Store(1)
	}
	return on
}

// FlushBeforeExec writes the events held before a statement run with Exec, which may be anything: a
// commit by hand, SQL that reads or changes the outbox table. Transaction statements are left to the
// transaction, which sees them on every path (a ROLLBACK must not be preceded by a write). Nothing is
// run in a transaction the database rolled back whole.
func (p *Inserter) FlushBeforeExec(db *gorm.DB) {
	t := TxOf(db.Statement.ConnPool)
	if t == nil || db.Error != nil {
		return
	}
	query := db.Statement.SQL.String()
	s := txsql.Parse(query, db.Dialector.Name() == "postgres")
	if s.Kind != txsql.Other {
		return
	}
	if err := t.rolledBackErr(); err != nil {
		db.AddError(err)
		return
	}
	if t.holding() {
		flushFor(db, t, txsql.LeadingKeyword(query))
	}
}

// ObserveError hands the error of a statement to its transaction, which drops its events when the
// database rolled it back whole. It runs at the end of every chain, so that errors of statements the
// transaction's connection does not see itself (PrepareStmt's) are seen too.
func (p *Inserter) ObserveError(db *gorm.DB) {
	if db.Error == nil {
		return
	}
	if t := TxOf(db.Statement.ConnPool); t != nil {
		t.observe(db.Error)
	}
}

// FlushBeforeRead writes the events held before a query of the outbox table, so that the
// transaction reads its own events.
func (p *Inserter) FlushBeforeRead(db *gorm.DB) {
	t := holdingTx(db)
	if t == nil {
		return // the common case: decided without looking at the query
	}
	if s := db.Statement; s.Table == p.Table || strings.Contains(s.SQL.String(), p.Table) {
		flushFor(db, t, "reading the outbox table")
	}
}

// FlushHeld writes the events db's transaction holds, if any, before what.
func (p *Inserter) FlushHeld(db *gorm.DB, what string) {
	if t := holdingTx(db); t != nil {
		flushFor(db, t, what)
	}
}

// holdingTx returns the watched transaction of db's statement when it holds events and the statement
// has not failed, and nil otherwise.
func holdingTx(db *gorm.DB) *Tx {
	if db.Error != nil {
		return nil
	}
	if t := TxOf(db.Statement.ConnPool); t != nil && t.holding() {
		return t
	}
	return nil
}

// flushFor writes t's events before what, failing db's statement when they cannot be written.
func flushFor(db *gorm.DB, t *Tx, what string) {
	if err := t.flush(true); err != nil {
		db.AddError(fmt.Errorf("%w (written before %s)", err, what))
	}
}
