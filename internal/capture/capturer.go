package capture

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"time"

	"gorm.io/gorm/schema"
)

// The capture path, stage by stage (the root package's callbacks.go registers the callbacks):
//
//	statement.go where the capture rides on GORM's callback chains, and the state of one statement
//	write.go     the write as the database runs it: what is read before it, what is added to it
//	             (RETURNING), and GORM's own result handed back unchanged (replay.go)
//	lookup.go    reads of rows before or after the write, by key or by the statement's condition
//	rowstore.go  a statement's rows kept compactly between the write and their events
//	classify.go  what the statement wrote, row by row: created, updated, deleted or nothing
//	keys.go      keys and values of a row: reading them, comparing them, formatting aggregate ids
//	events.go    the outbox event of each captured row: type, payload, aggregate, headers, and the
//	             Changeset and Shape that user code sees through Config's hooks
//	encode.go    JSON text of payloads and headers
//	txwatch.go   the transaction holds its events: savepoints, rollbacks, early flushes
//	insert.go    the events of a transaction written in one multi-row INSERT just before it commits

// Config is what the capture needs of the plugin's options. The root package makes it from its
// options; the hooks are where user code (typed with the root's public types) is called.
type Config struct {
	Table   string      // the outbox table, a validated identifier
	Payload PayloadMode // what a captured event carries
	Notify  bool        // wake the relays of other processes after commits (PostgreSQL)
	// Headers derives the headers of a statement's events from its context; nil: none.
	Headers func(context.Context) map[string]string
	// Captures reports whether writes of a model give events (WithModels, WithoutModels, never the
	// outbox itself).
	Captures func(*schema.Schema) bool
	// Only are the models of WithModels (nil: every model), among which a write through
	// db.Table(name) without a model looks for the model of its table.
	Only map[reflect.Type]bool
	// StrictTables fails a write through db.Table(name) to a table no model maps to.
	StrictTables bool
	// EventType names the event of a row in place of "<Model>_<op>"; nil: the default.
	EventType func(*Changeset) string
	// Customizer is the interface a model implements to shape its own events (EventCustomizer);
	// Customize calls it on model, a pointer to the row's model value.
	Customizer reflect.Type
	Customize  func(model any, c *Changeset, e *Shape) error
}

// Capturer is the capture of one plugin: it turns the statements GORM runs into events, and has its
// Inserter write them.
type Capturer struct {
	*Inserter
	cfg Config

	customizers sync.Map // reflect.Type of a model -> bool: whether it implements cfg.Customizer

	tables     modelTables // the models of tables written through db.Table(...) without one
	tableInfos tableInfos  // unique keys, rowid and later triggers of tables (lookup.go)

	// LockedWrites runs updates and deletes by condition as a locked read and a write by key, the
	// way it does where the database has no RETURNING (MySQL, SQLite before 3.35); set by tests, so
	// that they run that path on every database.
	LockedWrites bool
}

// New returns the capture of cfg.
func New(cfg Config) *Capturer {
	return &Capturer{Inserter: &Inserter{Table: cfg.Table, Notify: cfg.Notify}, cfg: cfg}
}

// PayloadMode chooses what the payload of a captured event holds (outboxplugin.PayloadMode documents
// each, with the same values).
type PayloadMode int

const (
	PayloadKey PayloadMode = iota + 1
	PayloadRow
	PayloadChanges
)

// Op is what the database did to a captured row (outboxplugin.ChangesetType, with the same text).
type Op string

const (
	OpCreate Op = "create"
	OpUpdate Op = "update"
	OpDelete Op = "delete"
)

// Errors of the capture, which the root package exports under the same names and documents.
var (
	ErrEmptyEventType   = errors.New("empty event type")
	ErrInvalidJSON      = errors.New("invalid JSON")
	ErrEncodePayload    = errors.New("cannot encode event payload as JSON")
	ErrConcurrentChange = errors.New("rows changed concurrently")
	ErrUnsupportedWrite = errors.New("write cannot be captured exactly")
	ErrUnknownTable     = errors.New("no model maps to the table")
)

type suppressKey struct{}

// Suppress returns a context under which nothing is captured (outboxplugin.WithoutCapture).
func Suppress(ctx context.Context) context.Context {
	return context.WithValue(ctx, suppressKey{}, true)
}

// Suppressed reports whether ctx is one of Suppress.
func Suppressed(ctx context.Context) bool {
	if ctx == nil {
		return false
	}
	v, _ := ctx.Value(suppressKey{}).(bool)
	return v
}

// now is the time events are stamped with, in UTC.
func now() time.Time { return time.Now().UTC() }
