package outboxplugin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/internal/capture"
	"github.com/gorm-outbox/outboxplugin/internal/relay"
	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
	"github.com/gorm-outbox/outboxplugin/internal/relay/wakeup"
)

// ErrUnsupportedDialect is returned by the worker on a database other than PostgreSQL, MySQL/MariaDB
// and SQLite.
var ErrUnsupportedDialect = errors.New("outboxplugin: unsupported database")

// ErrUnsupportedEngine is returned by NewWorker (or, when the server could not be asked then, by the
// first claim) for a database engine whose claim would not skip locked rows: MySQL before 8.0.1,
// MariaDB before 10.6, TiDB (which accepts FOR UPDATE SKIP LOCKED and does not skip), PostgreSQL
// before 9.5. The error names the server's version and what to run instead.
var ErrUnsupportedEngine = store.ErrUnsupportedEngine

// Worker is the relay: it claims committed outbox events, hands them to a Publisher in batches, and
// records the outcome. Delivery is at least once: an event is marked done only after the publisher
// accepted it, so a crash in between publishes it again. Several workers, in one process or many,
// may run against the same table: claiming skips rows another worker holds.
//
// Run it from main, checking the error it returns, or call ProcessOnce from a scheduler of your own.
// A Worker runs one Run or ProcessOnce at a time (it stamps its rows with one owner id); start one
// Worker per loop. docs/relay.md describes the states a row goes through and the guarantees of each
// mode.
type Worker struct {
	db     *gorm.DB
	pub    Publisher
	cfg    workerConfig
	busy   atomic.Bool // a Run or ProcessOnce is under way
	owner  string
	sql    *store.Store
	engine *relay.Engine[Message] // the loop that claims, publishes and records (internal/relay)
	wake   chan struct{}

	prepareMu sync.Mutex
	prepared  bool

	health        workerHealth
	counts        workerCounts
	misconfigured misconfiguredLog
}

// ErrWorkerBusy is returned by Run and ProcessOnce when the same Worker is already running one of
// them: a worker's rows carry its owner id, so two loops on one Worker could not tell their leases
// apart. Create one Worker per loop.
var ErrWorkerBusy = errors.New("outboxplugin: the worker is already running")

// NewWorker returns a relay that publishes the events of db's outbox table with pub, or an error
// wrapping ErrInvalidOption for an invalid option, a nil db or publisher, ErrUnsupportedDialect for a
// database other than PostgreSQL, MySQL/MariaDB and SQLite, and ErrUnsupportedEngine for an engine
// whose claim would not skip locked rows. It asks the server its version (engineCheckTimeout); when
// the server does not answer, the first claim asks again, so a relay may start before its database.
func NewWorker(db *gorm.DB, pub Publisher, opts ...WorkerOption) (*Worker, error) {
	w := &Worker{
		db:   db,
		pub:  pub,
		wake: make(chan struct{}, 1),
		cfg: workerConfig{
			table:          DefaultTableName,
			batchSize:      0, // the database's default, below
			pollInterval:   DefaultPollInterval,
			lease:          DefaultLease,
			publishTimeout: DefaultPublishTimeout,
			maxAttempts:    DefaultMaxAttempts,
			history:        DefaultAttemptHistory,
			retry:          DefaultRetryPolicy,
			retention:      DefaultRetention,
			listen:         true,
			backlogEvery:   DefaultBacklogEvery,
			healthEvery:    DefaultTableHealthEvery,
			progressEvery:  DefaultProgressInterval,
			logger:         slog.Default(),
			observer:       NopObserver{},
		},
		owner: workerID(),
	}
	fail := func(err error) (*Worker, error) { return nil, fmt.Errorf("outboxplugin: NewWorker: %w", err) }
	switch {
	case db == nil:
		return fail(fmt.Errorf("%w: nil *gorm.DB", ErrInvalidOption))
	case pub == nil:
		return fail(fmt.Errorf("%w: nil Publisher", ErrInvalidOption))
	}
	if p := pluginOf(db); p != nil {
		w.cfg.table = p.cfg.table
	}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&w.cfg); err != nil {
			return fail(err)
		}
	}
	if w.cfg.batchSize == 0 {
		w.cfg.batchSize = defaultBatchSize(db.Dialector.Name())
	}
	w.db = db.Session(&gorm.Session{NewDB: true, SkipDefaultTransaction: true})
	var err error
	if w.sql, err = newStore(w.db, w.cfg.table, w.cfg.keyOrdering, w.cfg.batchSize, w.cfg.history, w.cfg.lease); err != nil {
		return fail(err)
	}
	if w.cfg.serverVersion != "" {
		w.sql.SetServerVersion(w.cfg.serverVersion)
	}
	ctx, cancel := context.WithTimeout(context.Background(), engineCheckTimeout)
	err = w.sql.CheckEngine(ctx)
	cancel()
	if errors.Is(err, ErrUnsupportedEngine) {
		return fail(err)
	}
	w.engine = relay.New(w.sql, relay.Config{
		Owner:           w.owner,
		BatchSize:       w.cfg.batchSize,
		Lease:           w.cfg.lease,
		PublishTimeout:  w.cfg.publishTimeout,
		PollInterval:    w.cfg.pollInterval,
		MaxAttempts:     w.cfg.maxAttempts,
		Backoff:         w.cfg.retry.Backoff,
		KeyOrdering:     w.cfg.keyOrdering,
		DeleteOnPublish: w.cfg.deleteOnPublish,
		Logger:          w.cfg.logger,
	}, relay.Hooks[Message]{
		Message:   func(m store.Message) Message { return Message(m) },
		Publish:   w.pub.Publish,
		Answers:   publisherAnswers,
		Prepare:   w.prepareTable,
		Claimed:   w.noteClaim,
		BatchDone: func(ctx context.Context, r relay.Result[Message]) { w.report(ctx, batchResult(r)) },
		Buried:    w.buried,
	})
	return w, nil
}

// engineCheckTimeout bounds NewWorker's question of the server's version.
const engineCheckTimeout = 5 * time.Second

// newStore is store.New, with its error for a database the relay does not run on as
// ErrUnsupportedDialect.
func newStore(db *gorm.DB, table string, keyOrdering bool, batchSize, history int, lease time.Duration) (*store.Store, error) {
	q, err := store.New(db, table, keyOrdering, batchSize, history, lease)
	if errors.Is(err, store.ErrUnsupportedDialect) {
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedDialect, db.Dialector.Name())
	}
	return q, err
}

// defaultBatchSize is the batch size of a worker on the dialect when WithBatchSize does not set one.
func defaultBatchSize(dialect string) int {
	if dialect == "mysql" {
		return DefaultMySQLBatchSize
	}
	return DefaultBatchSize
}

// workerID names the worker in locked_by: its host's short name (up to the first dot), its process
// and random hex, always leaseOwnerWidth bytes long, so that a claim's stamp overwrites the
// placeholder a new row holds on MySQL and MariaDB (NoLeaseOwner) in place. At least 8 hex digits
// are random; a host name that leaves fewer keeps its end, where a pod's name has what tells it from
// its siblings, and any byte but letters, digits, '-' and '_' is written as '_'.
func workerID() string {
	host, _ := os.Hostname()
	return leaseOwnerID(host, os.Getpid())
}

// leaseOwnerID is workerID for a host name and a process id.
func leaseOwnerID(host string, pid int) string {
	const minRandom = 8
	if i := strings.IndexByte(host, '.'); i >= 0 {
		host = host[:i]
	}
	if host == "" {
		host = "worker"
	}
	proc := "-" + strconv.Itoa(pid) + "-"
	if room := leaseOwnerWidth - len(proc) - minRandom; len(host) > room {
		host = host[len(host)-max(room, 0):]
	}
	clean := []byte(host)
	for i, c := range clean {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			clean[i] = '_'
		}
	}
	var b [leaseOwnerWidth / 2]byte
	_, _ = rand.Read(b[:])
	id := string(clean) + proc + hex.EncodeToString(b[:])
	return id[:leaseOwnerWidth]
}

// Owner returns the id the worker stamps on the rows it claims (the locked_by column).
func (w *Worker) Owner() string { return w.owner }

// Run relays events until ctx ends, and then returns nil, after finishing or handing back the batch
// in flight; it leaves no goroutine behind. Database and publisher errors do not stop it: they are
// logged and retried, with growing pauses while they last.
func (w *Worker) Run(ctx context.Context) error {
	if !w.busy.CompareAndSwap(false, true) {
		return ErrWorkerBusy
	}
	defer w.busy.Store(false)
	defer w.sql.ReleaseConn()
	if err := w.checkTable(ctx); err != nil {
		return err
	}
	if err := w.prepareTable(ctx); errors.Is(err, errMissingIndex) {
		return err // other errors: the database is away, and Run retries
	}
	if cw := capture.WatchOf(w.db); cw != nil && cw.Channel() == w.cfg.table {
		// Commits of this process wake the worker directly, with no notification.
		cw.AddWaker(w)
		defer cw.RemoveWaker(w)
	}
	w.logStart(ctx)
	defer w.logStop(ctx)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	listening := w.cfg.listen && w.sql.Listens()
	if listening {
		go func() {
			defer close(done)
			w.listenForWakeUps(runCtx)
		}()
	} else {
		close(done)
	}
	defer func() { stop(); <-done }()

	maintained := make(chan struct{})
	go func() {
		defer close(maintained)
		w.maintain(runCtx)
	}()
	defer func() { stop(); <-maintained }()

	w.engine.Run(ctx, w.wake)
	return nil
}

// Wake makes a waiting Run look for events at once. Applications that know they just committed
// events (on databases without LISTEN) may call it; it never blocks.
func (w *Worker) Wake() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// ProcessOnce claims one batch, publishes it and records the outcome; it returns the number of events
// published. A batch that fails to publish is not an error of ProcessOnce: its events are scheduled
// for retry (or are dead, or pending again when the broker was unreachable) and the count is 0. Errors
// are those of the database. When ctx ends while the publisher runs, the events it did not confirm are
// handed back unpublished.
func (w *Worker) ProcessOnce(ctx context.Context) (int, error) {
	if !w.busy.CompareAndSwap(false, true) {
		return 0, ErrWorkerBusy
	}
	defer w.busy.Store(false)
	defer w.sql.ReleaseConn()
	return w.engine.ProcessOnce(ctx)
}

// RequeueDead makes the dead events with the given message ids pending again, with their attempts
// reset, and returns how many it requeued (ids that are unknown, pending or processed are not). With
// no ids it requeues nothing: RequeueAllDead requeues every dead event.
func (w *Worker) RequeueDead(ctx context.Context, messageIDs ...string) (int64, error) {
	if len(messageIDs) == 0 {
		return 0, nil
	}
	return w.requeue(ctx, messageIDs)
}

// RequeueAllDead makes every dead event of the table pending again, with its attempts reset, and
// returns how many it requeued.
func (w *Worker) RequeueAllDead(ctx context.Context) (int64, error) {
	return w.requeue(ctx, nil)
}

func (w *Worker) requeue(ctx context.Context, messageIDs []string) (int64, error) {
	n, err := w.sql.Requeue(ctx, messageIDs)
	if err != nil {
		return n, fmt.Errorf("outboxplugin: requeue dead events: %w", err)
	}
	w.Wake()
	return n, nil
}

// checkTable fails Run at once when the outbox table is missing or lacks a column the relay uses,
// instead of logging a failed claim every few seconds for ever. A database that does not answer is
// not such a failure: Run then starts, and retries as it does for any database error.
func (w *Worker) checkTable(ctx context.Context) error {
	rows, err := w.sql.DB().QueryContext(ctx, `SELECT `+w.sql.Columns()+` FROM `+w.sql.Table()+` WHERE 1 = 0`)
	if err == nil {
		// Run ended before it began is no error: the MySQL driver's Close reports the cancellation.
		if err = rows.Close(); err == nil {
			return nil
		}
	}
	if ctx.Err() != nil || w.sql.DB().PingContext(ctx) != nil {
		return nil
	}
	return fmt.Errorf("outboxplugin: the outbox table %s is missing or lacks columns the relay needs; create it with outboxplugin.AutoMigrate(db) (or migrate OutboxEvent into it): %w", w.cfg.table, err)
}

// prepareTable runs once per worker, before its first claim, and changes nothing (the worker runs no
// DDL: AutoMigrate creates what it needs). It checks the claim index, and with per-key ordering the
// index the ordering probes, and fails when one is missing or invalid (errMissingIndex); it logs, once
// per worker and at WARN, what else the table lacks that makes the relay or the Admin slower
// (checkTable: a table made by GORM's own db.AutoMigrate).
func (w *Worker) prepareTable(ctx context.Context) error {
	w.prepareMu.Lock()
	defer w.prepareMu.Unlock()
	if w.prepared {
		return nil
	}
	if rows, err := w.sql.DB().QueryContext(ctx, `SELECT `+w.sql.Columns()+` FROM `+w.sql.Table()+` WHERE 1 = 0`); err != nil {
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
	warnings, err := checkTable(db, w.cfg.table)
	if err != nil {
		return fmt.Errorf("outboxplugin: check the outbox table: %w", err)
	}
	for _, tw := range warnings {
		// The same text as Admin.Stats, outbox status and the console give, so that one search finds
		// the explanation whichever place an operator saw it in.
		w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: "+tw.String(),
			slog.String("worker", w.owner), slog.String("table", w.cfg.table), slog.String("warning", string(tw.Code)))
	}
	w.prepared = true
	return nil
}

// listenForWakeUps wakes Run at every notification of a commit on PostgreSQL until ctx ends (see
// wakeup.Listener), on a connection of the pool that db's *sql.DB is (or WithListenDB's); a pool
// without one, or a LISTEN connection that notifications do not reach (a transaction pooler), leaves
// Run to its polling, which it says once.
func (w *Worker) listenForWakeUps(ctx context.Context) {
	sqlDB, err := w.db.DB()
	if err != nil {
		w.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "outboxplugin: no LISTEN wake-up, polling only",
			slog.String("worker", w.owner), slog.Any("reason", fmt.Errorf("%w: %w", wakeup.ErrUnsupported, err)))
		return
	}
	l := wakeup.Listener{DB: sqlDB, Table: w.cfg.table, Wake: w.Wake, Logger: w.cfg.logger,
		Attrs: []slog.Attr{slog.String("worker", w.owner), slog.Duration("poll_interval", w.cfg.pollInterval)},
		Probe: w.cfg.listenProbe,
		Advice: "give the worker a pool on the PostgreSQL server itself for LISTEN (outboxplugin.WithListenDB), " +
			"or turn the wake-up off (outboxplugin.WithoutListen) to skip this test (docs/operations.md, \"Behind PgBouncer\")"}
	if w.cfg.listenDB != nil {
		l.DB, l.Sender = w.cfg.listenDB, sqlDB
	}
	l.Run(ctx)
}
