package outboxplugin

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/internal/capture"
	"github.com/gorm-outbox/outboxplugin/internal/partition"
	"github.com/gorm-outbox/outboxplugin/internal/relay"
)

// UseInsertStrategy makes p write events with the named strategy ("values" or "unnest"), so that
// benchmarks can compare them on one database.
func UseInsertStrategy(p *Plugin, name string) {
	for _, s := range []capture.Strategy{capture.InsertValues, capture.InsertUnnest} {
		if s.String() == name {
			p.c.Strategy = s
			return
		}
	}
	panic("unknown insert strategy " + name)
}

// UseLockedWrites makes p run updates and deletes by condition as a locked read and a write by key,
// the way it does where the database has no RETURNING (MySQL, SQLite before 3.35), so that tests run
// that path on every database.
func UseLockedWrites(p *Plugin) { p.c.LockedWrites = true }

// HoldCleanupLock takes the table's cleanup lock as w's periodic cleanup does, on a connection of its
// own, and returns the function that lets go of it; got is false when another holds it.
func HoldCleanupLock(ctx context.Context, w *Worker) (release func(), got bool, err error) {
	conn, err := w.sql.DB().Conn(ctx)
	if err != nil {
		return nil, false, err
	}
	unlock, got, err := w.sql.TryCleanupLock(ctx, conn)
	if err != nil || !got {
		_ = conn.Close()
		return nil, got, err
	}
	return func() { unlock(); _ = conn.Close() }, true, nil
}

// UseListenProbe bounds w's LISTEN self-test by d instead of wakeup.DefaultProbe, so that a test
// behind a transaction pooler sees it fail soon.
func UseListenProbe(w *Worker, d time.Duration) { w.cfg.listenProbe = d }

// CleanupTurn is one turn of Run's periodic cleanup: ran is false when another relay held the lock.
func CleanupTurn(ctx context.Context, w *Worker, olderThan time.Duration) (deleted int64, ran bool, err error) {
	return w.cleanupOnce(ctx, olderThan, true)
}

// UseClaimIsolation sets the isolation level of w's MySQL/MariaDB claim transactions (by default the
// server's, REPEATABLE READ), so that benchmarks can compare levels.
func UseClaimIsolation(w *Worker, level sql.IsolationLevel) { w.sql.SetClaimIsolation(level) }

// UseAfterClaimLock makes w's MySQL/MariaDB claims call fn between taking their row locks and stamping
// the rows, so that a test can cut the relay off there.
func UseAfterClaimLock(w *Worker, fn func()) { w.sql.SetAfterClaimLock(fn) }

// ClaimRetryable reports whether w runs a claim that failed with err again at once.
func ClaimRetryable(w *Worker, err error) bool { return w.sql.Retryable(err) }

// NotifiesSent is how many wake-up NOTIFYs the plugin sent after commits on db's pool (0 when it
// watches no commits there).
func NotifiesSent(db *gorm.DB) int64 {
	if cw := capture.WatchOf(db); cw != nil {
		return cw.Sent()
	}
	return 0
}

// UseNotifyInTransaction makes p, before it is registered, announce events with pg_notify inside each
// transaction instead of after commit, so that benchmarks can compare the two.
func UseNotifyInTransaction(p *Plugin) { p.notifyInTx = true }

// UsePerStatementInserts makes p, before it is registered, write the events of each statement right
// after it instead of holding a transaction's events until commit, so that benchmarks can compare the
// two.
func UsePerStatementInserts(p *Plugin) { p.c.PerStatement = true }

// UseSeparateCommit makes p, before it is registered, begin transactions on *sql.Tx and write their
// events in an INSERT of its own before the COMMIT on every driver, as before the commit carried them
// on PostgreSQL with pgx, so that benchmarks can compare the two.
func UseSeparateCommit(p *Plugin) { p.sqlTx = true }

// WithServerVersion has the worker take version as the server's answer to its version question, for
// tests of engines not on this machine (TiDB, MySQL 5.7, MariaDB 10.5).
func WithServerVersion(version string) WorkerOption {
	return func(c *workerConfig) error { c.serverVersion = version; return nil }
}

// RelayLiteral is what w's dialect makes of a statement before sending it: on MySQL the arguments it
// writes into the text as literals.
func RelayLiteral(w *Worker, query string, args ...any) (string, []any) {
	return w.sql.Literal(query, args)
}

// UseClockSkew sets w's wall clock off by skew, as on a host whose clock is wrong: the time it gives
// the statements that take the worker's clock (SQLite's) and its attempt histories.
func UseClockSkew(w *Worker, skew time.Duration) { w.engine.SetClockSkew(skew) }

// LeaseOwnerID is the worker id made of a host name and a process id (workerID).
var LeaseOwnerID = leaseOwnerID

// WithMigrateNow makes AutoMigrate and SchemaSQL take now for the current time: the partitions they
// make are those of the interval that holds it and the next two.
func WithMigrateNow(now time.Time) MigrateOption {
	return func(c *migrateConfig) { c.now = func() time.Time { return now } }
}

// PartitionTurn is one turn of Run's periodic cleanup on a partitioned table as if the time were now,
// with the retention given (drop false: only the partitions' making, as a relay without a cleanup
// does).
func PartitionTurn(ctx context.Context, w *Worker, now time.Time, retention time.Duration, drop bool) (*partition.Result, error) {
	if !drop {
		res, partitioned, ran, err := relay.MakePartitions(ctx, w.sql, now)
		if err == nil && (!partitioned || !ran) {
			return nil, errors.New("no partitions made: the table is not partitioned, or the lock was held")
		}
		return &res, err
	}
	r, err := relay.CleanupReport(ctx, w.sql, now, now.Add(-retention), true)
	if err == nil && r.Partitions == nil {
		return nil, errors.New("the table is not partitioned")
	}
	return r.Partitions, err
}

// CleanupAt is one cleanup of w's table as if the time were now: exclusive as Run's periodic one (the
// lock, and on a plain table the pauses between chunks), or not, as Worker.Cleanup.
func CleanupAt(ctx context.Context, w *Worker, now time.Time, retention time.Duration, exclusive bool) (deleted int64, partitions *partition.Result, err error) {
	r, err := relay.CleanupReport(ctx, w.sql, now, now.Add(-retention), exclusive)
	return r.Deleted, r.Partitions, err
}
