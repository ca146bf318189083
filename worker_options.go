package outboxplugin

import (
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/sqlname"
)

// The worker's options and their defaults.

type workerConfig struct {
	serverVersion   string // the server's version as a test gives it (export_test.go), or ""
	table           string
	batchSize       int
	pollInterval    time.Duration
	lease           time.Duration
	publishTimeout  time.Duration
	maxAttempts     int
	history         int
	retry           RetryPolicy
	keyOrdering     bool
	deleteOnPublish bool
	cleanupEvery    time.Duration
	retention       time.Duration
	listen          bool
	listenDB        *sql.DB       // the pool LISTEN takes its connection from, or nil: the worker's
	listenProbe     time.Duration // the LISTEN self-test's bound as a test gives it (export_test.go), or 0
	backlogEvery    time.Duration
	healthEvery     time.Duration
	progressEvery   time.Duration
	logger          *slog.Logger
	observer        Observer
}

// WorkerOption configures a Worker.
type WorkerOption func(*workerConfig) error

// Defaults of the worker's options.
const (
	DefaultBatchSize      = 500
	DefaultMySQLBatchSize = 1000
	DefaultPollInterval   = time.Second
	DefaultPublishTimeout = 30 * time.Second
	DefaultLease          = 5 * time.Second
	DefaultMaxAttempts    = 10
	DefaultRetention      = 7 * 24 * time.Hour
	DefaultBacklogEvery   = 15 * time.Second
	// DefaultTableHealthEvery is how often a worker whose Observer is a TableHealthObserver reads the
	// table's health: sizes and dead rows move slowly, and an alert on them waits minutes anyway.
	DefaultTableHealthEvery = time.Minute
)

// WithBatchSize sets how many events one batch claims and publishes, at most 10000. The default
// is DefaultBatchSize (500) on PostgreSQL and SQLite and DefaultMySQLBatchSize (1000) on MySQL and
// MariaDB. A batch costs a claim transaction (one commit) whatever its size, so larger batches move
// more events per second, up to where the database's work per row dominates: on PostgreSQL and SQLite
// the gain levels off at 500, on MariaDB, whose cost per batch is higher, at 1000
// (docs/benchmarks.md, "MariaDB: where a batch goes, and what raised it"). A larger batch also makes
// the duplicates of a relay's crash larger: up to a batch per worker.
func WithBatchSize(n int) WorkerOption {
	return func(c *workerConfig) error {
		if n < 1 || n > 10000 {
			return fmt.Errorf("%w: batch size %d not in 1..10000", ErrInvalidOption, n)
		}
		c.batchSize = n
		return nil
	}
}

// WithPollInterval sets how long Run waits after a batch that was not full before it looks again
// (default 1 s). On PostgreSQL a notification wakes it at once when events are committed; polling
// is then only the fallback.
func WithPollInterval(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: poll interval %v", ErrInvalidOption, d)
		}
		c.pollInterval = d
		return nil
	}
}

// WithPublishTimeout bounds each call to the publisher (default 30 s): a broker that hangs costs one
// timeout, after which the batch counts as failed and is retried.
func WithPublishTimeout(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: publish timeout %v", ErrInvalidOption, d)
		}
		c.publishTimeout = d
		return nil
	}
}

// WithLease sets how long a claimed event stays reserved for the worker that claimed it without
// being renewed (default 5 s, at least 1 s). While a worker holds a batch — publishing it, or waiting
// to — it renews the lease every third of it, up to the batch's publish timeout (and the batch claimed
// ahead's wait for the one before it); a worker that dies (SIGKILL, out of memory, a lost machine)
// stops renewing, and its events go to the other workers once the lease runs out. The lease is then
// the failover time; shorten it and renewals come more often.
func WithLease(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d < MinLease {
			return fmt.Errorf("%w: lease %v shorter than %v", ErrInvalidOption, d, MinLease)
		}
		c.lease = d
		return nil
	}
}

// MinLease is the shortest lease WithLease accepts: a renewal every third of it must have time for a
// database round trip on a loaded machine.
const MinLease = time.Second

// WithMaxAttempts sets how many deliveries an event gets before it is dead (default 10). Every claim
// counts, including one cut short by a crash.
func WithMaxAttempts(n int) WorkerOption {
	return func(c *workerConfig) error {
		if n < 1 {
			return fmt.Errorf("%w: max attempts %d", ErrInvalidOption, n)
		}
		c.maxAttempts = n
		return nil
	}
}

// WithAttemptHistory sets how many failed attempts each event keeps in its history (the
// attempt_history column: when, by which worker, the error, how long the publish took; see Attempt and
// docs/relay.md, "Failure history"): 0..MaxAttemptHistory, default DefaultAttemptHistory (10). Each
// failure statement keeps the last n, so a row holds at most n entries of about 1.2 KiB at most. 0
// writes none, and lets the worker run on a table of an earlier version that lacks the column; with any
// other n, Run refuses such a table until outboxplugin.AutoMigrate(db) adds it.
func WithAttemptHistory(n int) WorkerOption {
	return func(c *workerConfig) error {
		if n < 0 || n > MaxAttemptHistory {
			return fmt.Errorf("%w: attempt history %d not in 0..%d", ErrInvalidOption, n, MaxAttemptHistory)
		}
		c.history = n
		return nil
	}
}

// WithRetryPolicy sets the wait between deliveries of a failing event (default DefaultRetryPolicy).
func WithRetryPolicy(p RetryPolicy) WorkerOption {
	return func(c *workerConfig) error {
		if p == nil {
			return fmt.Errorf("%w: nil retry policy", ErrInvalidOption)
		}
		c.retry = p
		return nil
	}
}

// WithKeyOrdering turns on strict per-key ordering: the events of one message key (aggregate) are
// published one after another in the order the relay sees them committed, never by two workers at
// once, and an event that fails holds back only the later events of its own key — until it is
// published, or, once dead, until it is requeued. Each batch takes at most one event per key. The
// worker creates the index this needs, (aggregate_type, aggregate_id, id) over unprocessed rows, the
// first time it runs.
func WithKeyOrdering() WorkerOption {
	return func(c *workerConfig) error {
		c.keyOrdering = true
		return nil
	}
}

// WithDeleteOnPublish deletes events once published instead of marking them processed.
func WithDeleteOnPublish() WorkerOption {
	return func(c *workerConfig) error {
		c.deleteOnPublish = true
		return nil
	}
}

// WithCleanup makes Run delete processed events older than the retention (WithRetention, default 7
// days) every interval, beside its publishing loop (never delaying a claim), in chunks of 1000 rows
// with a pause after each as long as the chunk took. With several relays on one table, one cleans at a
// time (a database lock of PostgreSQL's and MySQL's own; the others skip their turn). Retention counts
// from created_at: see docs/relay.md, "Cleanup".
func WithCleanup(every time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if every <= 0 {
			return fmt.Errorf("%w: cleanup interval %v", ErrInvalidOption, every)
		}
		c.cleanupEvery = every
		return nil
	}
}

// WithRetention sets how long processed events are kept by the periodic cleanup (default 7 days).
func WithRetention(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: retention %v", ErrInvalidOption, d)
		}
		c.retention = d
		return nil
	}
}

// WithTable sets the outbox table the worker reads. By default it is the table of the plugin
// registered on the worker's *gorm.DB, or DefaultTableName.
func WithTable(name string) WorkerOption {
	return func(c *workerConfig) error {
		if !sqlname.Valid(name) {
			return fmt.Errorf("%w: %w: %q", ErrInvalidOption, ErrInvalidTableName, name)
		}
		c.table = name
		return nil
	}
}

// WithoutListen turns off the PostgreSQL LISTEN wake-up; the worker then polls only. Behind a
// transaction pooler (PgBouncer in transaction mode), which does not carry notifications, the worker
// finds that out by itself when it starts (its LISTEN connection sends itself a notification through
// the pool and waits for it), says so once at WARN and polls: this option only spares it the test and
// the warning. WithListenDB keeps the wake-up there.
func WithoutListen() WorkerOption {
	return func(c *workerConfig) error {
		c.listen = false
		return nil
	}
}

// WithListenDB makes the PostgreSQL LISTEN wake-up take its connection from db instead of the
// worker's pool: a pool opened on the PostgreSQL server itself (with pgx, as gorm.io/driver/postgres
// opens it) when the worker's goes through a transaction pooler such as PgBouncer in transaction mode,
// which does not carry notifications. The worker holds one connection of db while it runs, and sends
// nothing else there; the capture's notifications, sent through the pooler, reach every session
// listening on the server. The start-up self-test sends its notification through the worker's pool,
// so a db on another server or database is found out and said (the worker then polls).
func WithListenDB(db *sql.DB) WorkerOption {
	return func(c *workerConfig) error {
		if db == nil {
			return fmt.Errorf("%w: nil listen *sql.DB", ErrInvalidOption)
		}
		c.listenDB = db
		return nil
	}
}

// WithLogger sets the worker's logger (default slog.Default()).
func WithLogger(l *slog.Logger) WorkerOption {
	return func(c *workerConfig) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// WithObserver sets an Observer that receives batch results, dead events and the backlog.
func WithObserver(o Observer) WorkerOption {
	return func(c *workerConfig) error {
		if o == nil {
			return fmt.Errorf("%w: nil observer", ErrInvalidOption)
		}
		c.observer = o
		return nil
	}
}

// WithBacklogInterval sets how often Run measures the backlog for the Observer (default 15 s).
func WithBacklogInterval(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: backlog interval %v", ErrInvalidOption, d)
		}
		c.backlogEvery = d
		return nil
	}
}

// WithTableHealthInterval sets how often Run reads the table's health for an Observer that is a
// TableHealthObserver (default DefaultTableHealthEvery, a minute). Each reading is a few catalog
// queries (see TableHealth), whatever the table's size.
func WithTableHealthInterval(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: table health interval %v", ErrInvalidOption, d)
		}
		c.healthEvery = d
		return nil
	}
}

// WithProgressInterval sets how often, at most, Run logs its progress at info (default
// DefaultProgressInterval, 30 s): the events published, refused, dead and not delivered since the
// last such line, and the backlog — pending events and the age of the oldest — measured for it. No
// line is written, and nothing measured, for an interval in which nothing happened.
func WithProgressInterval(d time.Duration) WorkerOption {
	return func(c *workerConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: progress interval %v", ErrInvalidOption, d)
		}
		c.progressEvery = d
		return nil
	}
}
