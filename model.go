package outboxplugin

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/gorm-outbox/outboxplugin/internal/jsontext"
	"github.com/gorm-outbox/outboxplugin/internal/msgid"
	"github.com/gorm-outbox/outboxplugin/internal/sqlname"
)

// DefaultTableName is the table OutboxEvent maps to, and the table the plugin writes to unless
// WithTableName names another.
const DefaultTableName = "outbox_events"

// OutboxEvent is one row of the outbox table: an event written in the same transaction as the change
// it describes, waiting for a relay to publish it.
//
// The first five columns are the reference design's (id, event_type, payload, created_at,
// processed). The others carry what a relay needs without a later migration: a message id that is
// stable across retries and unique (a UUIDv7, for consumers to de-duplicate on), the aggregate the
// event belongs to (type and id, which together form the message key), headers, the retry
// bookkeeping (attempts, next attempt time, last error, and the history of the last failed attempts),
// the time it was processed, the time it was given up on (dead), and a lease (owner and expiry) for
// relays that claim rows before publishing.
//
// The package's AutoMigrate creates the table with the primary key and these indexes. The claim index
// on (processed, dead_at, next_attempt_at, created_at, id) makes finding the next batch cost in
// proportion to the batch — not to the processed rows the table keeps, nor to the dead events and the
// events waiting for a retry. Fresh events (next_attempt_at NULL) form one run of it in creation
// order, retries another in due order, and a claim reads the head of each: dead rows and retries not
// yet due are never stepped over. On PostgreSQL and SQLite it is partial (WHERE processed = false AND
// dead_at IS NULL: the rows a claim may take), and the reference index (processed, created_at) WHERE
// processed = true holds the processed rows, for cleanup and the Admin; a new event is added to one
// of them and moves to the other when it is processed, as it would anyway since processed changes.
// Queries must spell the predicate out (processed = false, not processed = ?) for the planner to use a
// partial index. MySQL and MariaDB have no partial indexes: there the claim index covers every row, its
// leading columns do what the predicate does elsewhere, and its run of processed rows (processed, no
// dead time, no next attempt time: the mark clears it) serves cleanup and the Admin in creation order,
// so that no second index costs every insert and every mark. The dead index (dead_at, id) WHERE dead_at
// IS NOT NULL serves the Admin's dead events on PostgreSQL and SQLite. AutoMigrate also drops what
// earlier versions made and nothing reads now (the pending index (created_at, id); on MySQL and
// MariaDB the full reference index), and on PostgreSQL builds indexes CONCURRENTLY on a live table.
//
// db.AutoMigrate(&OutboxEvent{}) (GORM's own) creates the table and the claim index its tags declare,
// without the reference and dead indexes or PostgreSQL's storage settings: the worker, Admin.CheckTable
// and outbox status say what such a table lacks and what it costs (TableWarning).
//
// The lease columns (locked_by, locked_until) say which worker holds a claimed row and until when.
// On PostgreSQL and SQLite they are NULL until a relay claims the row. On MySQL and MariaDB
// AutoMigrate gives them defaults, 32 spaces and 1970-01-01 00:00:00, which the plugin's INSERT
// leaves to the database: a claim then overwrites values of the size it writes (a worker's id is
// always 32 bytes), which InnoDB does in place, where from NULL it had to make every row longer
// (docs/benchmarks.md). Both mean no lease, as NULL does, and a relay hands rows back with NULL;
// LeaseOwner reads either as none. Queries of your own should do the same: locked_by IS NULL alone
// misses the rows that were never claimed there.
//
// Rows may be written by hand inside a transaction, as in the reference design
// (tx.Create(&OutboxEvent{EventType: "OrderPlaced", Payload: ...})); the capture callbacks never
// create events for OutboxEvent itself. Emit does the same with less ceremony and honours
// WithTableName.
type OutboxEvent struct {
	ID            int64      `gorm:"primaryKey;autoIncrement;index:,composite:claim,priority:5,where:processed = false AND dead_at IS NULL"`
	MessageID     string     `gorm:"size:36;not null"`
	EventType     string     `gorm:"size:255;not null"`
	AggregateType string     `gorm:"size:255;not null;default:''"`
	AggregateID   string     `gorm:"size:255;not null;default:''"`
	Payload       JSON       `gorm:"not null"`
	Headers       JSON       ``
	CreatedAt     time.Time  `gorm:"not null;precision:6;index:,composite:claim,priority:4,where:processed = false AND dead_at IS NULL"`
	Processed     bool       `gorm:"not null;default:false;index:,composite:claim,priority:1,where:processed = false AND dead_at IS NULL"`
	ProcessedAt   *time.Time `gorm:"precision:6"`
	Attempts      int        `gorm:"not null;default:0"`
	NextAttemptAt *time.Time `gorm:"precision:6;index:,composite:claim,priority:3,where:processed = false AND dead_at IS NULL"`
	LastError     *string    `gorm:"type:text"`
	DeadAt        *time.Time `gorm:"precision:6;index:,composite:claim,priority:2,where:processed = false AND dead_at IS NULL"`
	LockedBy      *string    `gorm:"size:64"`
	LockedUntil   *time.Time `gorm:"precision:6"`
	// AttemptHistory is the event's last failed attempts, oldest first (NULL until the first): see
	// AttemptHistory and WithAttemptHistory. The relay writes it; rows written by hand leave it nil.
	AttemptHistory AttemptHistory
}

// NoLeaseOwner is locked_by of a row no relay has claimed since it was written, on MySQL and MariaDB:
// 32 spaces, the column's default there, as 1970-01-01 00:00:00 is locked_until's. A claim's stamp
// then writes values of the same size as the ones it replaces (every worker's id is 32 bytes), which
// InnoDB writes in place; from NULL, every stamp made each row longer, and the page had to make room
// for it (half the relay's time on MariaDB, docs/benchmarks.md). The relay takes it, like NULL, for
// no owner; rows written before the defaults, and rows a relay handed back, hold NULL. A query of
// your own for the rows a relay holds is locked_by <> NoLeaseOwner (which NULL fails as well).
const NoLeaseOwner = "                                " // 32 spaces

// leaseOwnerWidth is the length of every worker's id (workerID): that of NoLeaseOwner.
const leaseOwnerWidth = len(NoLeaseOwner)

// LeaseOwner is the id of the worker that holds the row's lease, or held it until it ran out; ""
// when no relay holds the row: locked_by is NULL, or holds the placeholder a new row starts with on
// MySQL and MariaDB (spaces).
func (e OutboxEvent) LeaseOwner() string {
	if e.LockedBy == nil || strings.TrimSpace(*e.LockedBy) == "" {
		return ""
	}
	return *e.LockedBy
}

// TableName returns DefaultTableName. A plugin configured WithTableName writes elsewhere; migrate
// that table with AutoMigrate, or db.Table(name).AutoMigrate(&OutboxEvent{}).
func (OutboxEvent) TableName() string { return DefaultTableName }

// BeforeCreate completes a row written by hand: it gives it a message id and a creation time when
// they are missing, stores a nil payload as JSON null, and refuses an empty event type, a payload that
// is not valid JSON in UTF-8, or headers that are not a JSON object of strings, so that no row the
// relay cannot publish is committed.
func (e *OutboxEvent) BeforeCreate(*gorm.DB) error {
	if e.EventType == "" {
		return fmt.Errorf("outboxplugin: OutboxEvent: %w", ErrEmptyEventType)
	}
	if e.Payload == nil {
		e.Payload = JSON("null")
	} else if !jsontext.Valid(e.Payload) {
		return fmt.Errorf("outboxplugin: OutboxEvent %q: payload: %w", e.EventType, ErrInvalidJSON)
	}
	if e.Headers != nil {
		// The relay reads headers into Message.Headers, a map of strings: a document of another
		// shape would fail every claim that reaches the row.
		var h map[string]string
		if !jsontext.Valid(e.Headers) || json.Unmarshal(e.Headers, &h) != nil {
			return fmt.Errorf("outboxplugin: OutboxEvent %q: headers must be a JSON object of strings: %w", e.EventType, ErrInvalidJSON)
		}
	}
	if e.MessageID == "" {
		e.MessageID = msgid.New()
	}
	if e.CreatedAt.IsZero() {
		e.CreatedAt = now()
	}
	return nil
}

// now is the creation time of events: UTC, so that SQLite, which stores times as text, orders and
// compares them correctly whatever the time zone of the writer.
func now() time.Time { return time.Now().UTC() }

// JSON is a JSON document held as its encoded bytes. It is stored as json on PostgreSQL, MySQL and
// MariaDB, and text on SQLite (see GormDBDataType). A nil JSON is SQL NULL.
type JSON []byte

// Value sends the document as text, which every supported driver accepts for its JSON column type.
func (j JSON) Value() (driver.Value, error) {
	if j == nil {
		return nil, nil
	}
	return string(j), nil
}

// Scan reads a document from a JSON, text or blob column.
func (j *JSON) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*j = nil
	case []byte:
		*j = append(JSON(nil), v...)
	case string:
		*j = JSON(v)
	default:
		return fmt.Errorf("outboxplugin: cannot scan %T into JSON", src)
	}
	return nil
}

// MarshalJSON embeds the document as it is; a nil JSON is null.
func (j JSON) MarshalJSON() ([]byte, error) {
	if j == nil {
		return []byte("null"), nil
	}
	return j, nil
}

// UnmarshalJSON keeps a copy of the document.
func (j *JSON) UnmarshalJSON(b []byte) error {
	if j == nil {
		return errors.New("outboxplugin: JSON: UnmarshalJSON on nil pointer")
	}
	*j = append((*j)[:0], b...)
	return nil
}

// String returns the document as text.
func (j JSON) String() string { return string(bytes.TrimSpace(j)) }

// GormDataType is the generic type GORM reports for the column.
func (JSON) GormDataType() string { return "json" }

// GormDBDataType picks the column type per database: json on PostgreSQL, which keeps a document's text
// as written (jsonb would reorder its keys and respace it, so that one event would read differently on
// different databases); json on MySQL and MariaDB (on MariaDB an alias of LONGTEXT with a validity
// check, which keeps the text too); text on SQLite. A PostgreSQL column that is jsonb already, as
// earlier versions of the plugin created it, stays jsonb under GORM's own db.AutoMigrate too (the
// package's AutoMigrate never re-types a column): migrating it would rewrite the table under an
// exclusive lock (docs/capture.md has the statement to run at a quiet hour).
func (JSON) GormDBDataType(db *gorm.DB, field *schema.Field) string {
	switch db.Dialector.Name() {
	case "postgres":
		if pgColumnType(db, field) == "jsonb" {
			return "jsonb"
		}
		return "json"
	case "mysql":
		return "json"
	default:
		return "text"
	}
}

// pgColumnType returns the type of the field's column in the table being migrated, or "" when the
// column does not exist yet.
func pgColumnType(db *gorm.DB, field *schema.Field) string {
	table := db.Statement.Table
	if table == "" && field.Schema != nil {
		table = field.Schema.Table
	}
	if table == "" {
		return ""
	}
	var typ string
	err := db.Session(&gorm.Session{NewDB: true}).Raw(`SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = to_regclass(?) AND attname = ? AND attnum > 0 AND NOT attisdropped`, sqlname.PG(table), field.DBName).Scan(&typ).Error
	if err != nil {
		return ""
	}
	return typ
}

// pgStorageOptions are the storage settings of the outbox table on PostgreSQL; each is applied unless
// the table already has a value for it.
//
// fillfactor: a relay's claim rewrites each row it leases (owner, lease expiry, attempts), none of them
// indexed columns; with room left on the row's page PostgreSQL updates it in place (a HOT update),
// with no new index entries and none left dead for the next claim to step over. A claim leases a whole
// batch, every row of a page at once, so the page needs room for a second copy of each of its rows:
// half of it. Measured in docs/benchmarks.md: against 70, 50 cut the database's time per drained event
// by 29% and raised one worker's throughput by a fifth or more, at no cost to the write path the
// benchmark could see. It costs no space once events are relayed: 100 000 events took 32 MB at 50
// against 22 MB at 70, but 35 MB against 41 MB once drained, where copies that did not fit on their
// page went to new pages.
//
// autovacuum: every processed event leaves a dead entry in the pending index until VACUUM removes it,
// and every claim steps over the dead entries at the head of that index. With the default thresholds
// (a fifth of the table dead) a table that keeps days of processed rows is vacuumed rarely and claims
// slow down in between; a fixed threshold of 10 000 dead rows keeps the head clean.
var pgStorageOptions = []struct{ name, value string }{
	{"fillfactor", "50"},
	{"autovacuum_vacuum_scale_factor", "0"},
	{"autovacuum_vacuum_threshold", "10000"},
}

// missingStorageOptions returns the pgStorageOptions a PostgreSQL table has no value for ("name =
// value"); nothing on other databases. A table it cannot see has none of them: AutoMigrate has just
// created it, or (in the outbox command's dry run) would have, and the ALTER TABLE that follows either
// sets them or fails naming the missing table.
func missingStorageOptions(db *gorm.DB, table string) ([]string, error) {
	if db.Dialector.Name() != "postgres" {
		return nil, nil
	}
	var found struct {
		Exists      bool
		Partitioned bool
		Options     string
	}
	// Each part quoted, as GORM created it: an unquoted mixed-case name would be folded to lower case.
	err := db.Raw(`SELECT to_regclass(?) IS NOT NULL AS exists, COALESCE((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(?)), false) AS partitioned,`+
		` COALESCE((SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = to_regclass(?)), '') AS options`,
		sqlname.PG(table), sqlname.PG(table), sqlname.PG(table)).Scan(&found).Error
	if err != nil {
		return nil, fmt.Errorf("read storage options: %w", err)
	}
	if found.Partitioned {
		return nil, nil // a partitioned table keeps none: each partition is given them as it is made
	}
	var set []string
	for _, o := range pgStorageOptions {
		if !found.Exists || !strings.Contains(","+found.Options, ","+o.name+"=") {
			set = append(set, o.name+" = "+o.value)
		}
	}
	return set, nil
}
