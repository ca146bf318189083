package outboxplugin

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
)

// Wake-up after commit (PostgreSQL). pg_notify inside the application's transaction would make
// PostgreSQL serialise the commit of every transaction that wrote events (the notify queue's lock is
// taken at commit, cluster-wide): concurrent writers would queue behind each other. Instead, the
// plugin learns that a transaction which wrote events has committed, and then
//
//   - wakes the Workers of this process that relay the same table, with no database round trip, and
//   - sends one NOTIFY for the relays of other processes, from a connection of its own and outside the
//     application's transaction, at most once per notifyInterval: a commit during an interval is
//     covered by the NOTIFY that ends it.
//
// It learns of commits by wrapping the database's connection pool (db.Use installs it): the wrapper
// begins transactions whose Commit it sees. That covers GORM's per-statement transaction,
// db.Transaction, db.Begin() … Commit() by hand, nested transactions (one wake-up, at the outer
// commit), PrepareStmt, and the transaction the plugin opens itself under SkipDefaultTransaction. A
// write whose transaction the wrapper did not begin — a session made before db.Use, a transaction on a
// connection pinned with db.Connection, one begun by another plugin on its own pool — is announced as
// before, by pg_notify inside its transaction. Polling stays the correctness path: a wake-up lost to
// a failed NOTIFY, or to a commit that failed ambiguously, only delays events until the next poll.

// notifyInterval is the shortest time between two NOTIFYs of one plugin. Measured here with a relay
// listening in another process, at 500 commits per second: commit to notification p50 3.3 ms, p99
// 6.4 ms (2 ms: 1.7 and 3.6 ms; 10 ms: 5.8 and 11.1 ms), at about 180 NOTIFYs per second under load.
const notifyInterval = 5 * time.Millisecond

// notifyTimeout bounds one NOTIFY; a pool at its connection limit may make it wait.
const notifyTimeout = time.Second

// commitWatch announces the commits of transactions that wrote events.
type commitWatch struct {
	db      *sql.DB
	channel string // the outbox table: the channel workers LISTEN on

	workers sync.Map // *Worker -> struct{}: running workers of this process on the channel's table

	mu      sync.Mutex
	pending bool // a commit since the last NOTIFY started
	running bool // the notifying goroutine runs

	sent   atomic.Int64 // NOTIFYs sent, for tests
	failed atomic.Int64 // NOTIFYs that failed (the poll covers them)
}

// installCommitWatch wraps db's connection pool so that the plugin sees commits. It runs from
// Initialize, before the database is used by the plugin's callbacks.
func installCommitWatch(db *gorm.DB, table string) (*commitWatch, error) {
	if cw := commitWatchOf(db); cw != nil {
		return cw, nil // the pool is watched already (db.Use twice)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	cw := &commitWatch{db: sqlDB, channel: table}
	old := db.Config.ConnPool
	switch cp := old.(type) {
	case *gorm.PreparedStmtDB:
		// Keep *gorm.PreparedStmtDB outermost: the PostgreSQL migrator and dbresolver look for it.
		cp.ConnPool = &watchedPool{ConnPool: cp.ConnPool, cw: cw}
	default:
		db.Config.ConnPool = &watchedPool{ConnPool: old, cw: cw}
	}
	if db.Statement != nil && db.Statement.ConnPool == old {
		db.Statement.ConnPool = db.Config.ConnPool
	}
	return cw, nil
}

// markCommit records that the transaction pool, which events are being written in, has something to
// announce at commit. It returns false when the plugin will not see that transaction commit: the
// caller then notifies inside it.
func markCommit(pool gorm.ConnPool) bool {
	if w, ok := pool.(*write); ok {
		pool = w.ConnPool
	}
	switch tx := pool.(type) {
	case *watchedTx:
		tx.dirty.Store(true)
		return true
	case *gorm.PreparedStmtTX:
		if t, ok := tx.Tx.(*watchedTx); ok {
			t.dirty.Store(true)
			return true
		}
	}
	return false
}

// commitWatchOf returns the commit watch installed on db's pool, or nil.
func commitWatchOf(db *gorm.DB) *commitWatch {
	pool := db.Config.ConnPool
	if ps, ok := pool.(*gorm.PreparedStmtDB); ok {
		pool = ps.ConnPool
	}
	if wp, ok := pool.(*watchedPool); ok {
		return wp.cw
	}
	return nil
}

// committed announces a commit: it wakes this process's workers at once and makes sure a NOTIFY
// starts within notifyInterval. It never blocks.
func (cw *commitWatch) committed() {
	cw.workers.Range(func(k, _ any) bool {
		k.(*Worker).Wake()
		return true
	})
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
func (cw *commitWatch) notifyLoop() {
	for {
		cw.mu.Lock()
		if !cw.pending {
			cw.running = false
			cw.mu.Unlock()
			return
		}
		cw.pending = false
		cw.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		if _, err := cw.db.ExecContext(ctx, `SELECT pg_notify($1, '')`, cw.channel); err != nil {
			cw.failed.Add(1)
		} else {
			cw.sent.Add(1)
		}
		cancel()
		time.Sleep(notifyInterval)
	}
}

// watchedPool is the application's connection pool, beginning transactions whose commit the plugin
// sees. It does not embed *sql.DB on purpose: GORM's Begin prefers a BeginTx that returns *sql.Tx, and
// would go around the wrapper.
type watchedPool struct {
	gorm.ConnPool
	cw *commitWatch
}

var (
	_ gorm.ConnPoolBeginner = (*watchedPool)(nil)
	_ gorm.GetDBConnector   = (*watchedPool)(nil)
	_ gorm.Tx               = (*watchedTx)(nil)
)

func (p *watchedPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	var (
		inner gorm.ConnPool
		err   error
	)
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
	return &watchedTx{Tx: t, cw: p.cw, pool: p}, nil
}

// GetDBConn keeps db.DB() working.
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
// dbresolver's pool settings).
func (p *watchedPool) Ping() error { return p.PingContext(context.Background()) }

func (p *watchedPool) PingContext(ctx context.Context) error {
	if pg, ok := p.ConnPool.(interface{ PingContext(context.Context) error }); ok {
		return pg.PingContext(ctx)
	}
	return nil
}

func (p *watchedPool) SetMaxOpenConns(n int)              { p.cw.db.SetMaxOpenConns(n) }
func (p *watchedPool) SetMaxIdleConns(n int)              { p.cw.db.SetMaxIdleConns(n) }
func (p *watchedPool) SetConnMaxLifetime(d time.Duration) { p.cw.db.SetConnMaxLifetime(d) }
func (p *watchedPool) SetConnMaxIdleTime(d time.Duration) { p.cw.db.SetConnMaxIdleTime(d) }
func (p *watchedPool) Close() error                       { return p.cw.db.Close() }

// watchedTx is a transaction whose commit the plugin sees.
type watchedTx struct {
	gorm.Tx // *sql.Tx, or what a pool under the wrapper began
	cw      *commitWatch
	pool    *watchedPool
	dirty   atomic.Bool // events were written in it
}

func (t *watchedTx) Commit() error {
	err := t.Tx.Commit()
	if err == nil && t.dirty.Load() {
		t.cw.committed()
	}
	return err
}

// GetDBConn keeps db.DB() working inside a transaction.
func (t *watchedTx) GetDBConn() (*sql.DB, error) { return t.pool.GetDBConn() }

// SQLTx returns the *sql.Tx under the transaction, for code that needs it
// (tx.Statement.ConnPool.(*sql.Tx) no longer matches once the plugin is registered on PostgreSQL).
func (t *watchedTx) SQLTx() (*sql.Tx, bool) {
	tx, ok := t.Tx.(*sql.Tx)
	return tx, ok
}
