package capture

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"
)

// The commit that carries the outbox write (PostgreSQL with pgx).
//
// A transaction that wrote events would make four round trips where the application's own makes
// three: BEGIN, the write, the outbox INSERT, COMMIT. pgx sends a statement without arguments in the
// simple protocol, which takes several statements in one message: the held events, written as
// literals, and the COMMIT then reach the server together — `INSERT …; COMMIT` — and the outbox costs
// no round trip of its own. database/sql's *sql.Tx cannot end that way (its Commit always sends a
// COMMIT of its own), so on this path the watch begins the transaction itself, on a connection it
// holds (*sql.Conn), and does what *sql.Tx does:
//
//   - BEGIN with the isolation level and read-only mode of sql.TxOptions, as pgx spells them;
//   - statements refused with sql.ErrTxDone once the transaction has ended, and a commit or rollback
//     that waits for the statements running (closemu, as database/sql's);
//   - a rollback when the context the transaction was begun with ends: the connection is closed,
//     which ends the transaction on the server whatever else is under way, and never goes back to
//     the pool;
//   - the connection back in the pool only when pgx says it is outside a transaction ('I'); closed
//     otherwise;
//   - statements prepared in the transaction closed at its end; a statement prepared elsewhere
//     (GORM's PrepareStmt) prepared again on the connection, after which the pool's transactions
//     go back to *sql.Tx, which keeps prepared statements per connection.
//
// A COMMIT PostgreSQL answers for a failed transaction rolls it back without an error: the
// transaction's state is read before the COMMIT is sent (pgx keeps it from the server's last
// answer), and a failed transaction is rolled back and reported, as pgx's Tx.Commit does. After an
// error, the state tells where it came from: 'E' (in a failed transaction) means the INSERT failed
// and the COMMIT did not run; 'I' means the COMMIT ran and failed (a deferred constraint); a closed
// connection means the answer was lost, and whether the transaction committed is not known — the rows
// and their events either both committed or neither did.

// pgConn reads, through reflection on the driver connection, what pgx knows of it: its transaction
// status and whether it is closed. The core module does not import pgx; the methods are pgx's
// stdlib.Conn.Conn(), pgx.Conn.IsClosed() and PgConn(), and pgconn.PgConn.TxStatus(), found once per
// type (pgMethods).
func pgConn(dc any) (status byte, closed bool, ok bool) {
	v := reflect.ValueOf(dc)
	m := methodsOf(v.Type())
	if m == nil || m.conn < 0 {
		return 0, false, false
	}
	c := v.Method(m.conn).Call(nil)[0]
	if c.IsNil() {
		return 0, true, true
	}
	cm := methodsOf(c.Type())
	if cm == nil || cm.isClosed < 0 || cm.pgConn < 0 {
		return 0, false, false
	}
	if c.Method(cm.isClosed).Call(nil)[0].Bool() {
		return 0, true, true
	}
	p := c.Method(cm.pgConn).Call(nil)[0]
	if p.IsNil() {
		return 0, true, true
	}
	pm := methodsOf(p.Type())
	if pm == nil || pm.txStatus < 0 {
		return 0, false, false
	}
	return byte(p.Method(pm.txStatus).Call(nil)[0].Uint()), false, true
}

// pgMethods are the indexes of the methods pgConn calls on one type; -1 where the type has none.
type pgMethods struct{ conn, isClosed, pgConn, txStatus int }

var pgMethodCache sync.Map // reflect.Type -> *pgMethods, nil when the type is not one of pgx's

// methodsOf returns the methods pgConn needs of t, or nil when t has none of them with the
// signatures pgx gives them.
func methodsOf(t reflect.Type) *pgMethods {
	if m, ok := pgMethodCache.Load(t); ok {
		return m.(*pgMethods)
	}
	find := func(name string, out reflect.Kind) int {
		m, ok := t.MethodByName(name)
		if !ok || m.Type.NumIn() != 1 || m.Type.NumOut() != 1 || m.Type.Out(0).Kind() != out {
			return -1
		}
		return m.Index
	}
	m := &pgMethods{conn: find("Conn", reflect.Pointer), isClosed: find("IsClosed", reflect.Bool),
		pgConn: find("PgConn", reflect.Pointer), txStatus: find("TxStatus", reflect.Uint8)}
	if m.conn < 0 && (m.isClosed < 0 || m.pgConn < 0) && m.txStatus < 0 {
		m = nil
	}
	pgMethodCache.Store(t, m)
	return m
}

// isPgx reports whether db's connections are pgx's (its database/sql driver, stdlib).
func isPgx(db *sql.DB) bool {
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t != nil && t.PkgPath() == "github.com/jackc/pgx/v5/stdlib"
}

// beginSQL is BEGIN with opts, as pgx's stdlib spells it; an isolation level PostgreSQL does not
// have is refused as pgx refuses it.
func beginSQL(opts *sql.TxOptions) (string, error) {
	q := "BEGIN"
	if opts == nil {
		return q, nil
	}
	switch opts.Isolation {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		q += " ISOLATION LEVEL READ UNCOMMITTED"
	case sql.LevelReadCommitted:
		q += " ISOLATION LEVEL READ COMMITTED"
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		q += " ISOLATION LEVEL REPEATABLE READ"
	case sql.LevelSerializable:
		q += " ISOLATION LEVEL SERIALIZABLE"
	default:
		return "", fmt.Errorf("unsupported isolation: %v", opts.Isolation)
	}
	if opts.ReadOnly {
		q += " READ ONLY"
	}
	return q, nil
}

// errStatusUnknown: the driver connection did not answer what pgx knows of it (not pgx, or a
// version whose methods differ): the transaction takes database/sql's path.
var errStatusUnknown = errors.New("the connection's transaction status cannot be read")

// connTx is a transaction on a connection the watch holds.
type connTx struct {
	conn *sql.Conn
	cw   *Watch

	closemu sync.RWMutex // statements hold it shared; the end of the transaction, exclusive
	done    bool         // ended: committed, rolled back, or its context ended

	stopWatch func() bool // stops the rollback at the end of the context

	stmtMu sync.Mutex
	stmts  map[*sql.Stmt]struct{} // prepared on conn in the transaction: closed at its end
}

// beginOnConn begins a transaction on a connection of db held for it, or returns errStatusUnknown
// (with nothing begun) when pgx's status cannot be read.
func (cw *Watch) beginOnConn(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*connTx, error) {
	begin, err := beginSQL(opts)
	if err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		conn, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		c := &connTx{conn: conn, cw: cw}
		status, closed, err := c.status()
		if err != nil {
			conn.Close()
			return nil, err
		}
		if closed || status != 'I' {
			c.discard()
			if try < 2 {
				continue
			}
			return nil, driver.ErrBadConn
		}
		if _, err = conn.ExecContext(ctx, begin); err != nil {
			// A failed BEGIN leaves no transaction, but the connection may be broken: a connection
			// lost before BEGIN reached the server is tried again on another, as database/sql does.
			c.release()
			if errors.Is(err, driver.ErrBadConn) && try < 2 {
				continue
			}
			return nil, err
		}
		c.stopWatch = context.AfterFunc(ctx, c.abort)
		return c, nil
	}
}

// status is the transaction status pgx has of the connection ('I' idle, 'T' in a transaction, 'E'
// in a failed one), and whether the connection is closed.
func (c *connTx) status() (status byte, closed bool, err error) {
	err = c.conn.Raw(func(dc any) error {
		s, cl, ok := pgConn(dc)
		if !ok {
			return errStatusUnknown
		}
		status, closed = s, cl
		return nil
	})
	if errors.Is(err, sql.ErrConnDone) {
		return 0, true, nil
	}
	return status, closed, err
}

// discard closes the connection instead of returning it to the pool; an open transaction on it
// ends with it, rolled back by the server.
func (c *connTx) discard() {
	c.closeStmts()
	_ = c.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = c.conn.Close()
}

// release returns the connection to the pool when it is outside a transaction, and closes it
// otherwise.
func (c *connTx) release() {
	c.closeStmts()
	if status, closed, err := c.status(); err != nil || closed || status != 'I' {
		c.discard()
		return
	}
	_ = c.conn.Close()
}

func (c *connTx) closeStmts() {
	c.stmtMu.Lock()
	stmts := c.stmts
	c.stmts = nil
	c.stmtMu.Unlock()
	for s := range stmts {
		_ = s.Close()
	}
}

// abort ends the transaction when its context ends: it waits for the statements running, refuses
// later ones, and closes the connection, which rolls the transaction back.
func (c *connTx) abort() {
	c.closemu.Lock()
	if c.done {
		c.closemu.Unlock()
		return
	}
	c.done = true
	c.closemu.Unlock()
	c.discard()
}

// end marks the transaction ended by a commit or rollback; false when it had ended already.
func (c *connTx) end() bool {
	c.closemu.Lock()
	defer c.closemu.Unlock()
	if c.done {
		return false
	}
	c.done = true
	c.stopWatch()
	return true
}

// live reports whether the transaction has not ended.
func (c *connTx) live() bool {
	c.closemu.RLock()
	defer c.closemu.RUnlock()
	return !c.done
}

// errFailedTransaction is the commit of a transaction PostgreSQL refuses statements in (a statement
// failed and was not rolled back to a savepoint): its COMMIT would roll it back.
var errFailedTransaction = errors.New("commit unexpectedly resulted in rollback: the transaction had failed (a statement's error was not rolled back to a savepoint)")

// commit sends before (statements that ride on the commit, or "") and COMMIT in one message, under
// ctx. beforeFailed reports that an error came from before, and the COMMIT did not run.
func (c *connTx) commit(ctx context.Context, before string) (beforeFailed bool, err error) {
	if !c.end() {
		return false, sql.ErrTxDone
	}
	status, closed, err := c.status()
	switch {
	case err != nil:
		c.discard()
		return false, err
	case closed:
		c.discard()
		return false, driver.ErrBadConn
	case status == 'E':
		c.rollbackAndRelease()
		return false, errFailedTransaction
	}
	query := "COMMIT"
	if before != "" {
		query = before + ";COMMIT"
	}
	_, err = c.conn.ExecContext(ctx, query)
	if err == nil {
		c.release()
		return false, nil
	}
	status, closed, serr := c.status()
	switch {
	case serr != nil || closed:
		c.discard()
		return false, fmt.Errorf("outboxplugin: %w: the connection failed before the database answered the COMMIT; the rows and their events either all committed or none did: %w", ErrCommitUnknown, err)
	case status == 'E' || status == 'T':
		c.rollbackAndRelease()
		return before != "", err
	default: // 'I': the COMMIT ran and failed; the server rolled the transaction back
		c.release()
		return false, err
	}
}

// rollbackAndRelease rolls the transaction back and returns the connection, or closes it.
func (c *connTx) rollbackAndRelease() {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	if _, err := c.conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		c.discard()
		return
	}
	c.release()
}

// rollbackTimeout bounds a ROLLBACK the watch sends; past it the connection is closed, which rolls
// back too.
const rollbackTimeout = 5 * time.Second

// Commit commits without statements of its own (the watched Tx writes the held events with it).
func (c *connTx) Commit() error {
	_, err := c.commit(context.Background(), "")
	return err
}

// Rollback rolls the transaction back.
func (c *connTx) Rollback() error {
	if !c.end() {
		return sql.ErrTxDone
	}
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	if _, err := c.conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		c.discard()
		return err
	}
	c.release()
	return nil
}

func (c *connTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	c.closemu.RLock()
	defer c.closemu.RUnlock()
	if c.done {
		return nil, sql.ErrTxDone
	}
	return c.conn.ExecContext(ctx, query, args...)
}

func (c *connTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	c.closemu.RLock()
	defer c.closemu.RUnlock()
	if c.done {
		return nil, sql.ErrTxDone
	}
	return c.conn.QueryContext(ctx, query, args...)
}

func (c *connTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	c.closemu.RLock()
	defer c.closemu.RUnlock()
	if c.done {
		return txDoneDB().QueryRowContext(ctx, "")
	}
	return c.conn.QueryRowContext(ctx, query, args...)
}

func (c *connTx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	c.closemu.RLock()
	defer c.closemu.RUnlock()
	if c.done {
		return nil, sql.ErrTxDone
	}
	stmt, err := c.conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.cw.texts.Remember(stmt, query)
	c.stmtMu.Lock()
	if c.stmts == nil {
		c.stmts = make(map[*sql.Stmt]struct{})
	}
	c.stmts[stmt] = struct{}{}
	c.stmtMu.Unlock()
	return stmt, nil
}

// StmtContext runs stmt on the transaction's connection: as it is when it was prepared there,
// prepared again from its text otherwise. Statements prepared elsewhere mean GORM's PrepareStmt,
// which database/sql serves better (it keeps a statement prepared per connection): the pool's later
// transactions take *sql.Tx.
func (c *connTx) StmtContext(ctx context.Context, stmt *sql.Stmt) *sql.Stmt {
	c.stmtMu.Lock()
	_, ours := c.stmts[stmt]
	c.stmtMu.Unlock()
	if ours {
		return stmt
	}
	c.cw.prepares.Store(true)
	query, ok := c.cw.texts.Lookup(stmt)
	if !ok {
		return txDoneStmt(errors.New("outboxplugin: a statement prepared outside the plugin's view was given to a transaction on a held connection"))
	}
	s, err := c.PrepareContext(ctx, query)
	if err != nil {
		return txDoneStmt(err)
	}
	return s
}

// txDoneDB answers every statement with an error: sql.ErrTxDone for a statement sent to a
// transaction that has ended, as database/sql's *sql.Tx answers it; the statement's text for those
// txDoneStmt makes.
// Opened on first use: a *sql.DB runs a goroutine of its own.
var txDoneDB = sync.OnceValue(func() *sql.DB { return sql.OpenDB(failingConnector{}) })

// txDoneStmt is a statement whose every use fails with err's text.
func txDoneStmt(err error) *sql.Stmt {
	s, perr := txDoneDB().Prepare(err.Error())
	if perr != nil {
		panic(perr) // failingConn prepares anything
	}
	return s
}

// failingConnector makes connections that prepare any statement and fail to run it.
type failingConnector struct{}

func (failingConnector) Connect(context.Context) (driver.Conn, error) { return failingConn{}, nil }
func (f failingConnector) Driver() driver.Driver                      { return failingDriver{} }

type failingDriver struct{}

func (failingDriver) Open(string) (driver.Conn, error) { return failingConn{}, nil }

type failingConn struct{}

func (failingConn) Prepare(query string) (driver.Stmt, error) { return failingStmt(query), nil }
func (failingConn) Close() error                              { return nil }
func (failingConn) Begin() (driver.Tx, error)                 { return nil, sql.ErrTxDone }

// failingStmt fails with its text, or sql.ErrTxDone when it has none.
type failingStmt string

func (s failingStmt) err() error {
	if s == "" {
		return sql.ErrTxDone
	}
	return errors.New(string(s))
}
func (failingStmt) Close() error                                 { return nil }
func (failingStmt) NumInput() int                                { return -1 }
func (s failingStmt) Exec([]driver.Value) (driver.Result, error) { return nil, s.err() }
func (s failingStmt) Query([]driver.Value) (driver.Rows, error)  { return nil, s.err() }

// commitOnConn writes the events held with the COMMIT, in one message. done is false, with nothing
// sent, when the events cannot be written as literals: the caller writes them as usual, then
// commits.
func (t *Tx) commitOnConn(ct *connTx) (done bool, err error) {
	if t.ctx.Err() != nil {
		// Ended before the commit: rolled back, and the usual path says so as *sql.Tx would.
		ct.abort()
		return false, nil
	}
	t.mu.Lock()
	events, origins, db, values, p := t.held, t.origins, t.holder, t.holderCtx, t.inserter
	t.mu.Unlock()
	var (
		stmts  []string
		counts []int
	)
	if len(events) > 0 {
		var ok bool
		if stmts, counts, ok = p.inlineSQL(db, events, p.notifyInTransaction(db, t)); !ok {
			return false, nil
		}
	}
	ctx := context.Background()
	if values != nil {
		// The commit is not cut short by a context: once sent, it either commits the rows and
		// their events or neither, and an answer cut off would only make that unknown.
		ctx = txContext{Context: ctx, values: values}
	}
	start := time.Now()
	beforeFailed, err := ct.commit(ctx, strings.Join(stmts, ";"))
	for i, s := range stmts {
		// Each INSERT traced as it would be alone, all with the time of the one message.
		db.Logger.Trace(ctx, start, func() (string, int64) { return s, int64(counts[i]) }, err)
	}
	t.mu.Lock()
	t.dropLocked()
	t.savepoints = nil
	t.mu.Unlock()
	switch {
	case err == nil:
		if t.dirty.Load() {
			t.cw.committed()
		}
		return true, nil
	case beforeFailed:
		return true, fmt.Errorf("outboxplugin: %s: insert into %s: %w (written at commit; the transaction is rolled back)", describeOrigins(origins), p.Table, err)
	}
	if errors.Is(err, ErrCommitUnknown) && t.dirty.Load() {
		// It may have committed: a relay polling finds its events either way.
		t.cw.committed()
	}
	return true, err
}
