// Package inbox makes a consumer's handling of outbox messages take effect once, however often a
// message is delivered: the handler runs in a transaction of the consumer's database together with a
// record of (consumer, message id) under a unique key, so a redelivered message finds its record and
// is skipped, and a handler that fails rolls back its effects and the record alike.
//
//	ran, err := inbox.Handle(ctx, db, "billing", msgID, func(tx *gorm.DB) error {
//		return tx.Create(&Invoice{OrderID: order.ID}).Error
//	})
//	switch {
//	case errors.Is(err, inbox.ErrInProgress):
//		// another delivery of it is being handled right now: do not acknowledge this one
//	case err != nil:
//		// the handler failed and nothing of it stayed: let the broker redeliver
//	default:
//		// ran: handled now; !ran: handled before. Acknowledge either way.
//	}
//
// Concurrent deliveries of one message do not wait for each other: exactly one runs its handler, and
// the others return ErrInProgress at once (PostgreSQL: a transaction-level advisory lock tried without
// waiting; MySQL/MariaDB: a named lock, GET_LOCK with a timeout of 0; SQLite, whose writers are
// serialised anyway: a lock in the process). A delivery leaves no lock behind, whatever becomes of it:
// a handler that fails, panics or outlives its context's deadline lets the next delivery run, through
// any connection or process. Locks are per inbox table, so two databases on one server (or two schemas
// of one database) never block each other.
//
// Consumer names and message ids are compared exactly, byte for byte, on every database: "AbC-1",
// "abc-1" and "abc-1 " are three messages. The table AutoMigrate makes ensures it (on MySQL and MariaDB
// with binary columns), and AutoMigrate converts a table made before. The record is the message id as
// the publishers send it: see the MessageID helpers of each publisher package. Guide:
// https://github.com/gorm-outbox/outboxplugin/blob/main/docs/consuming.md
package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/internal/sqlname"
)

// DefaultTableName is the inbox table's name unless WithTable says otherwise.
const DefaultTableName = "outbox_inbox"

// DefaultRetention is how long a record is worth keeping by default: a redelivery later than this
// (7 days, as NServiceBus keeps its inbox) runs the handler again. Cleanup deletes older records.
const DefaultRetention = 7 * 24 * time.Hour

// MaxKeyLength bounds the consumer name and the message id, in characters: together they form the
// table's primary key, which MySQL limits to 3072 bytes (191 characters of up to 4 bytes each).
const MaxKeyLength = 191

var (
	// ErrInProgress is returned by Handle when another delivery of the same message is being handled
	// at this moment. Its outcome is not known yet: if it fails, the message must be handled again, so
	// do not acknowledge this delivery (nack it, or let it be redelivered).
	ErrInProgress = errors.New("inbox: the message is being handled by another delivery")
	// ErrInvalidKey is returned for a consumer name or message id that is empty, longer than
	// MaxKeyLength characters, not UTF-8, or holds a NUL character: none could be stored exactly as it
	// is on every database.
	ErrInvalidKey = errors.New("inbox: invalid consumer name or message id")
	// ErrInexactTable is returned by Handle when the inbox table takes the consumer name and message
	// id for those of a record that differs from them — a table made before the inbox compared them
	// exactly, which on MySQL and MariaDB compares by its collation (case, accents and trailing spaces
	// ignored). The message is neither handled nor skipped: run AutoMigrate, which converts the table,
	// and let it be redelivered.
	ErrInexactTable = errors.New("inbox: the inbox table does not compare ids exactly: run AutoMigrate")
	// ErrInvalidOption is returned by New for an option it cannot use.
	ErrInvalidOption = errors.New("inbox: invalid option")
)

// Record is a row of the inbox table: a message a consumer has handled. Make the table with
// AutoMigrate (or the statements of PlanMigration), not with GORM's migrator: on MySQL and MariaDB the
// table GORM makes from Record compares ids by its collation, and Handle returns ErrInexactTable for
// the ids it confuses.
type Record struct {
	Consumer  string    `gorm:"primaryKey;size:191;not null"`
	MessageID string    `gorm:"primaryKey;size:191;not null"`
	HandledAt time.Time `gorm:"precision:6;not null;index"`
}

// Inbox is the inbox table of one database.
type Inbox struct {
	db        *gorm.DB
	table     string
	dialect   string
	retention time.Duration
	locks     *keyLocks // the deliveries this Inbox is handling now

	scopeMu sync.Mutex
	scope   string // the table's place on its server, read once: see lockScope
}

// Option configures an Inbox.
type Option func(*Inbox) error

// WithTable sets the inbox table (default DefaultTableName): a plain identifier, optionally
// schema-qualified.
func WithTable(name string) Option {
	return func(in *Inbox) error {
		if !sqlname.Valid(name) {
			return fmt.Errorf("%w: table name %q", ErrInvalidOption, name)
		}
		in.table = name
		return nil
	}
}

// WithRetention sets how long Cleanup and RunCleanup keep a record (default DefaultRetention). Keep
// it longer than the broker can take to redeliver a message: a redelivery after its record is gone
// runs the handler again.
func WithRetention(d time.Duration) Option {
	return func(in *Inbox) error {
		if d <= 0 {
			return fmt.Errorf("%w: retention %v: want a positive duration", ErrInvalidOption, d)
		}
		in.retention = d
		return nil
	}
}

// New returns the inbox of db, or an error wrapping ErrInvalidOption. It supports PostgreSQL,
// MySQL/MariaDB and SQLite.
func New(db *gorm.DB, opts ...Option) (*Inbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *gorm.DB", ErrInvalidOption)
	}
	in := &Inbox{db: db.Session(&gorm.Session{NewDB: true}), table: DefaultTableName, dialect: db.Dialector.Name(),
		retention: DefaultRetention, locks: &keyLocks{held: map[string]struct{}{}}}
	switch in.dialect {
	case "postgres", "mysql", "sqlite":
	default:
		return nil, fmt.Errorf("%w: database %q: want postgres, mysql or sqlite", ErrInvalidOption, in.dialect)
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(in); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// Handle runs fn in a transaction of the inbox's database with the record of (consumer, messageID),
// unless a record is already there. It returns true when fn ran and its transaction committed, false
// (and no error) when an earlier delivery was handled, ErrInProgress (wrapped) when another delivery
// is being handled right now, and fn's error (wrapped) when fn failed: its effects and the record are
// rolled back, so a redelivery runs it again. fn must do its work through tx.
//
// Whatever becomes of the delivery — fn fails or panics (the panic goes on to the caller), ctx ends
// inside fn — it leaves no lock behind: the next delivery of the message, through any connection or
// process, runs fn. When ctx ends inside fn the transaction does not commit (fn's effects and the
// record are rolled back) and Handle returns an error; the work of leaving no lock behind is done
// under a context of its own, for at most 5 seconds more.
//
// Consumer and messageID are compared exactly, byte for byte, with those of the records: on a table
// that cannot (made before AutoMigrate converted it), an id it confuses with another record's is
// ErrInexactTable, never skipped as handled.
func (in *Inbox) Handle(ctx context.Context, consumer, messageID string, fn func(tx *gorm.DB) error) (bool, error) {
	fail := func(err error) (bool, error) {
		return false, fmt.Errorf("inbox: %s/%s: %w", consumer, messageID, err)
	}
	if err := checkKey(consumer, messageID); err != nil {
		return fail(err)
	}
	if fn == nil {
		return fail(errors.New("nil handler"))
	}
	key := in.table + "\x00" + consumer + "\x00" + messageID
	// In this Inbox first: a delivery it is handling now makes another one return at once on every
	// database, and on SQLite it is the only lock (its writers are serialised, and a second writer
	// would otherwise wait for the first to commit). Share one Inbox among a process's consumers.
	if !in.locks.tryLock(key) {
		return fail(ErrInProgress)
	}
	defer in.locks.unlock(key)

	db := in.db.WithContext(ctx)
	scope, err := in.lockScope(db)
	if err != nil {
		return fail(err)
	}
	digest := lockDigest(scope, consumer, messageID)
	var ran bool
	var pid int64 // the PostgreSQL session that took the advisory lock
	if in.dialect == "postgres" {
		defer func() { // also when fn panics
			if pid != 0 && ctx.Err() != nil {
				in.awaitAdvisoryRelease(ctx, advisoryLockKey(digest), pid)
			}
		}()
	}
	handle := func(conn *gorm.DB) error {
		return conn.Transaction(func(tx *gorm.DB) error {
			if in.dialect == "postgres" {
				// A transaction-level advisory lock, tried without waiting: released by this
				// transaction's COMMIT or ROLLBACK, once its record is visible to the next taker. A
				// transaction whose context ends is rolled back by database/sql, and one whose
				// statement is cut off is cancelled on the server by the driver: the lock goes with
				// it, a moment later (awaitAdvisoryRelease).
				var lock struct {
					Got bool  `gorm:"column:got"`
					PID int64 `gorm:"column:pid"`
				}
				if err := tx.Raw(`SELECT pg_try_advisory_xact_lock(?) AS got, pg_backend_pid() AS pid`, advisoryLockKey(digest)).Scan(&lock).Error; err != nil {
					return err
				}
				if !lock.Got {
					return ErrInProgress
				}
				pid = lock.PID
			}
			res := tx.Exec(in.insertSQL(), consumer, messageID, time.Now().UTC())
			if res.Error != nil {
				return res.Error
			}
			if res.RowsAffected == 0 {
				return in.duplicate(tx, consumer, messageID) // roll back, run nothing
			}
			if err := fn(tx); err != nil {
				return handlerError{err}
			}
			ran = true
			return nil
		})
	}
	if in.dialect == "mysql" {
		err = in.withNamedLock(ctx, db, namedLock(digest), handle)
	} else {
		err = handle(db)
	}
	var he handlerError
	switch {
	case err == nil:
		return ran, nil
	case errors.As(err, &he): // first: fn's own error is fn's, whatever it wraps
		return fail(he.err)
	case errors.Is(err, errDuplicate):
		return false, nil
	case errors.Is(err, ErrInProgress):
		return fail(ErrInProgress)
	case in.dialect == "sqlite" && strings.Contains(err.Error(), "database is locked"):
		// Another process's consumer holds SQLite's write lock past the busy timeout.
		return fail(fmt.Errorf("%w (%v)", ErrInProgress, err))
	}
	return fail(err)
}

// Handle is the Handle of the Inbox of db on DefaultTableName, one per connection pool of the process
// (so that its deliveries share the lock of the process).
func Handle(ctx context.Context, db *gorm.DB, consumer, messageID string, fn func(tx *gorm.DB) error) (bool, error) {
	if db == nil || db.Statement == nil {
		return false, fmt.Errorf("%w: nil *gorm.DB", ErrInvalidOption)
	}
	pool := any(db.Statement.ConnPool)
	if sqlDB, err := db.DB(); err == nil {
		pool = sqlDB
	}
	if in, ok := defaultInboxes.Load(pool); ok {
		return in.(*Inbox).Handle(ctx, consumer, messageID, fn)
	}
	in, err := New(db)
	if err != nil {
		return false, err
	}
	actual, _ := defaultInboxes.LoadOrStore(pool, in)
	return actual.(*Inbox).Handle(ctx, consumer, messageID, fn)
}

// defaultInboxes holds the Inbox of Handle per connection pool.
var defaultInboxes sync.Map

var errDuplicate = errors.New("inbox: duplicate")

// handlerError carries fn's error out of the transaction, told apart from the database's.
type handlerError struct{ err error }

func (e handlerError) Error() string { return e.err.Error() }
func (e handlerError) Unwrap() error { return e.err }

// checkKey refuses what no database stores exactly as it is: PostgreSQL refuses a NUL and bytes that
// are not UTF-8, and MySQL's text columns would cut them off.
func checkKey(consumer, messageID string) error {
	for _, s := range []struct{ what, v string }{{"consumer name", consumer}, {"message id", messageID}} {
		switch {
		case s.v == "":
			return fmt.Errorf("%w: empty %s", ErrInvalidKey, s.what)
		case !utf8.ValidString(s.v):
			return fmt.Errorf("%w: %s %q is not UTF-8", ErrInvalidKey, s.what, s.v)
		case strings.IndexByte(s.v, 0) >= 0:
			return fmt.Errorf("%w: %s %q holds a NUL character", ErrInvalidKey, s.what, s.v)
		}
		if n := utf8.RuneCountInString(s.v); n > MaxKeyLength {
			return fmt.Errorf("%w: %s of %d characters, at most %d", ErrInvalidKey, s.what, n, MaxKeyLength)
		}
	}
	return nil
}

// duplicate is the outcome of a record that could not be written because the table has one of that
// key: errDuplicate when it is the record of (consumer, messageID) — handled before — and
// ErrInexactTable when the table took another record's key for this one.
func (in *Inbox) duplicate(tx *gorm.DB, consumer, messageID string) error {
	var found []struct{ Consumer, MessageID string }
	if err := tx.Raw(`SELECT consumer, message_id FROM `+in.quotedTable()+` WHERE consumer = ? AND message_id = ?`,
		consumer, messageID).Scan(&found).Error; err != nil {
		return err
	}
	for _, r := range found {
		if r.Consumer == consumer && r.MessageID == messageID {
			return errDuplicate
		}
	}
	if len(found) == 0 {
		return errDuplicate // deleted since by Cleanup: it was there, so the message was handled
	}
	return fmt.Errorf("%w: it takes them for those of the record %q/%q", ErrInexactTable, found[0].Consumer, found[0].MessageID)
}

// insertSQL writes the record unless one is there, affecting no row then. Never a plain INSERT that
// fails on the duplicate: on PostgreSQL that error would abort the transaction.
func (in *Inbox) insertSQL() string {
	t := in.quotedTable()
	if in.dialect == "mysql" {
		// IGNORE turns only the duplicate key into a warning here: the key's lengths are checked
		// before, so nothing is truncated.
		return `INSERT IGNORE INTO ` + t + ` (consumer, message_id, handled_at) VALUES (?, ?, ?)`
	}
	return `INSERT INTO ` + t + ` (consumer, message_id, handled_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`
}

// quotedTable is the inbox table's name quoted for SQL.
func (in *Inbox) quotedTable() string {
	return (&gorm.Statement{DB: in.db}).Quote(in.table)
}

// cleanupBatch is how many records one statement of Cleanup deletes: short statements, so that
// deleting a week of records does not hold locks (or SQLite's write lock) for long.
const cleanupBatch = 1000

// Cleanup deletes the records handled more than olderThan ago (0: the Inbox's retention,
// DefaultRetention unless WithRetention), cleanupBatch at a time, and returns how many it deleted. A
// message redelivered after its record is gone is handled again.
func (in *Inbox) Cleanup(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("inbox: Cleanup: %w: olderThan %v: want a positive age, or 0 for the retention", ErrInvalidOption, olderThan)
	}
	if olderThan == 0 {
		olderThan = in.retention
	}
	cutoff := time.Now().UTC().Add(-olderThan)
	t := in.quotedTable()
	var query string
	switch in.dialect {
	case "postgres": // by ctid through the handled_at index: PostgreSQL's DELETE has no LIMIT
		query = `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + t + ` WHERE handled_at < ? LIMIT ` + fmt.Sprint(cleanupBatch) + `))`
	case "mysql":
		query = `DELETE FROM ` + t + ` WHERE handled_at < ? LIMIT ` + fmt.Sprint(cleanupBatch)
	default:
		query = `DELETE FROM ` + t + ` WHERE rowid IN (SELECT rowid FROM ` + t + ` WHERE handled_at < ? LIMIT ` + fmt.Sprint(cleanupBatch) + `)`
	}
	var total int64
	for {
		res := in.db.WithContext(ctx).Exec(query, cutoff)
		if res.Error != nil {
			return total, fmt.Errorf("inbox: Cleanup of %s: %w", in.table, res.Error)
		}
		total += res.RowsAffected
		if res.RowsAffected < cleanupBatch {
			return total, nil
		}
	}
}

// RunCleanup runs Cleanup with the Inbox's retention every interval until ctx ends, and returns nil
// then. A failed cleanup is retried at the next interval; onError (if not nil) hears of it.
func (in *Inbox) RunCleanup(ctx context.Context, every time.Duration, onError func(error)) error {
	if every <= 0 {
		return fmt.Errorf("inbox: RunCleanup: %w: interval %v: want a positive duration", ErrInvalidOption, every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := in.Cleanup(ctx, 0); err != nil && ctx.Err() == nil && onError != nil {
				onError(err)
			}
		}
	}
}
