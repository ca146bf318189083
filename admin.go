package outboxplugin

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/internal/dbtime"
	"github.com/gorm-outbox/outboxplugin/internal/msgid"
	"github.com/gorm-outbox/outboxplugin/internal/relay"
	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
	"github.com/gorm-outbox/outboxplugin/internal/sqlname"
)

// Admin looks at an outbox table and repairs it: counts per state, lists and single events, requeue
// and discard of failed events, delivery of scheduled events ahead of their time, cleanup. It needs no broker and no Publisher, so a CLI, a console or
// an application's own admin endpoint can use it beside (or without) a running Worker.
//
// Every query reads one of the table's indexes, so that it stays fast with millions of processed
// rows kept (docs/operations.md lists which one each reads):
//   - the claim index (processed, dead_at, next_attempt_at, created_at, id), which on PostgreSQL and
//     SQLite holds exactly the events still to be delivered (WHERE processed = false AND dead_at IS NULL);
//   - the processed index (processed, created_at), which there holds the processed rows only;
//   - the dead index (dead_at, id) WHERE dead_at IS NOT NULL, which AutoMigrate creates on PostgreSQL
//     and SQLite; on MySQL and MariaDB, which have no partial indexes, the claim index's leading
//     columns (processed = false, dead_at IS NOT NULL) find the dead rows instead.
//
// Events still to be delivered and dead events are read in full (they are the backlog, and a healthy
// outbox keeps few); processed events only ever page by page, or counted approximately.
type Admin struct {
	q       *store.Store
	dialect string
	table   string // unquoted, as given
	db      *gorm.DB
}

// AdminOption configures an Admin.
type AdminOption func(*adminConfig) error

type adminConfig struct {
	table string
}

// WithAdminTable sets the outbox table the Admin works on (default: the plugin's table on db, or
// DefaultTableName).
func WithAdminTable(name string) AdminOption {
	return func(c *adminConfig) error {
		if !sqlname.Valid(name) {
			return fmt.Errorf("%w: %w: %q", ErrInvalidOption, ErrInvalidTableName, name)
		}
		c.table = name
		return nil
	}
}

// ErrInvalidFilter is returned (wrapped) by the Admin's methods for a filter or argument they cannot
// use: an unknown state, a cursor they did not write, a limit out of range, a state the method does
// not act on.
var ErrInvalidFilter = errors.New("invalid filter")

// ErrEventNotFound is returned (wrapped) by Admin.Event when no event has the message id.
var ErrEventNotFound = errors.New("event not found")

// NewAdmin returns an Admin of db's outbox table, or an error wrapping ErrInvalidOption for an invalid
// option or a nil db, and ErrUnsupportedDialect for a database other than PostgreSQL, MySQL/MariaDB
// and SQLite.
func NewAdmin(db *gorm.DB, opts ...AdminOption) (*Admin, error) {
	fail := func(err error) (*Admin, error) { return nil, fmt.Errorf("outboxplugin: NewAdmin: %w", err) }
	if db == nil {
		return fail(fmt.Errorf("%w: nil *gorm.DB", ErrInvalidOption))
	}
	cfg := adminConfig{table: DefaultTableName}
	if p := pluginOf(db); p != nil {
		cfg.table = p.cfg.table
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return fail(err)
		}
	}
	db = db.Session(&gorm.Session{NewDB: true, SkipDefaultTransaction: true})
	q, err := newStore(db, cfg.table, false, DefaultBatchSize, 0, DefaultLease)
	if err != nil {
		return fail(err)
	}
	return &Admin{q: q, dialect: db.Dialector.Name(), table: cfg.table, db: db}, nil
}

// EventState is where an event is in its life. The states are disjoint; StatePending names due,
// leased and waiting together in a filter.
type EventState string

const (
	// StateDue: to be delivered, and claimable now (new, a delayed event whose time has come, or a
	// retry whose time has come).
	StateDue EventState = "due"
	// StateLeased: claimed by a worker whose lease has not run out: being published.
	StateLeased EventState = "leased"
	// StateWaiting: failed, and waiting for its next attempt (NextAttemptAt): attempts > 0 (or a
	// failure recorded) and next_attempt_at in the future.
	StateWaiting EventState = "waiting"
	// StateScheduled: a delayed event (DeliverAfter, DeliverAt, Event.DeliverAt) whose time has not
	// come: never attempted (attempts = 0, no last error) and next_attempt_at in the future. Requeue
	// never moves it; DeliverNow makes it due ahead of its time.
	StateScheduled EventState = "scheduled"
	// StateDead: given up on after its last attempt (or refused as undeliverable); kept until it is
	// requeued or discarded.
	StateDead EventState = "dead"
	// StateProcessed: published and marked done; kept until cleanup.
	StateProcessed EventState = "processed"

	// StatePending is a filter, not a state: due, leased and waiting, the backlog the workers have to
	// work through. Scheduled events are not in it: they are not late until their time comes.
	StatePending EventState = "pending"
)

// ParseEventState reads a state's name (as the CLI and the console take it); "" and "all" are the
// empty state, which a filter reads as every state.
func ParseEventState(s string) (EventState, error) {
	switch st := EventState(strings.ToLower(strings.TrimSpace(s))); st {
	case "", "all":
		return "", nil
	case StateDue, StateLeased, StateWaiting, StateScheduled, StateDead, StateProcessed, StatePending:
		return st, nil
	}
	return "", fmt.Errorf("%w: state %q: want due, leased, waiting, scheduled, dead, processed, pending or all", ErrInvalidFilter, s)
}

// Stats are an outbox table's counts, as of At.
//
// Its JSON form is the one of outbox status --json: snake_case names, times in RFC 3339, the oldest
// pending event's age in seconds (oldest_pending_age_seconds, a float) and its creation time null
// when there is none, and [] for an empty ByType or TableWarnings (see MarshalJSON).
type Stats struct {
	// Table is the outbox table counted, as the Admin was given it.
	Table string    `json:"table"`
	At    time.Time `json:"at"`
	// Pending is the backlog: Due + Leased + Waiting.
	Pending int64 `json:"pending"`
	Due     int64 `json:"due"`
	Leased  int64 `json:"leased"`
	Waiting int64 `json:"waiting"`
	// Scheduled is the delayed events whose time has not come (not in Pending).
	Scheduled int64 `json:"scheduled"`
	Dead      int64 `json:"dead"`
	// Processed is the number of processed rows kept. Exact up to ExactProcessedLimit; above it,
	// the database's estimate (PostgreSQL: the processed index's row count as of its last VACUUM or
	// ANALYZE; MySQL/MariaDB: InnoDB's estimate of the table's rows less the other states), and
	// ProcessedApproximate is true. SQLite counts exactly.
	Processed            int64 `json:"processed"`
	ProcessedApproximate bool  `json:"processed_approximate"`
	// OldestPending is the creation time of the oldest pending event (zero when there is none), and
	// OldestPendingAge its age at At: how far behind the relay is. Scheduled events do not count: a
	// reminder written yesterday for tomorrow is not late. In JSON: oldest_pending (null when there
	// is none) and oldest_pending_age_seconds.
	OldestPending    time.Time     `json:"-"`
	OldestPendingAge time.Duration `json:"-"`
	// ByType has the pending, scheduled and dead counts of each event type that has any, by type
	// name.
	ByType []TypeStats `json:"by_type"`
	// TableWarnings is what the table lacks that makes the relay or the Admin slower than on a
	// table made by AutoMigrate (see CheckTable): empty when the table is as AutoMigrate makes it,
	// and typically non-empty when it was made by GORM's own db.AutoMigrate.
	TableWarnings []TableWarning `json:"table_warnings"`
	// Health is the table's size, bloat and upkeep, and its partitions (see TableHealth): read from
	// the catalog and the statistics views only, and never a reason for Stats to fail: a figure that
	// cannot be read is unknown (nil, null in JSON).
	Health TableHealth `json:"health"`
}

// statsFields is Stats without its methods, for MarshalJSON and UnmarshalJSON.
type statsFields Stats

// statsJSON is the JSON form of Stats: its fields, and those that JSON writes in other units.
type statsJSON struct {
	statsFields
	OldestPending           *time.Time `json:"oldest_pending"`
	OldestPendingAgeSeconds float64    `json:"oldest_pending_age_seconds"`
}

// MarshalJSON writes s as outbox status --json does (see Stats).
func (s Stats) MarshalJSON() ([]byte, error) {
	out := statsJSON{statsFields: statsFields(s), OldestPendingAgeSeconds: s.OldestPendingAge.Seconds()}
	if !s.OldestPending.IsZero() {
		out.OldestPending = &s.OldestPending
	}
	if out.ByType == nil {
		out.ByType = []TypeStats{}
	}
	if out.TableWarnings == nil {
		out.TableWarnings = []TableWarning{}
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads the JSON that MarshalJSON writes (and outbox status --json prints).
func (s *Stats) UnmarshalJSON(b []byte) error {
	var in statsJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*s = Stats(in.statsFields)
	if in.OldestPending != nil {
		s.OldestPending = *in.OldestPending
	}
	s.OldestPendingAge = time.Duration(math.Round(in.OldestPendingAgeSeconds * float64(time.Second)))
	return nil
}

// TypeStats are one event type's counts.
type TypeStats struct {
	EventType string `json:"event_type"`
	Pending   int64  `json:"pending"`
	Scheduled int64  `json:"scheduled"`
	Dead      int64  `json:"dead"`
}

// ExactProcessedLimit is how many processed rows Stats counts exactly before it takes the database's
// estimate instead: counting 10 million index entries takes seconds, an estimate a millisecond.
const ExactProcessedLimit = 10000

// Stats counts the table's events by state and by type. The pending, scheduled and dead counts are
// exact (they read the claim and dead indexes, whose size is the backlog and the delayed events); the
// processed count is exact up to
// ExactProcessedLimit and an estimate above (see Stats.Processed). It also checks the table as
// CheckTable does (catalog reads only), into Stats.TableWarnings, and reads its health as
// TableHealth does (catalog and statistics views only), into Stats.Health.
func (a *Admin) Stats(ctx context.Context) (Stats, error) {
	fail := func(err error) (Stats, error) {
		return Stats{}, fmt.Errorf("outboxplugin: Stats of %s: %w", a.table, err)
	}
	st := Stats{Table: a.table, At: a.q.Clock(now())}
	byType := map[string]*TypeStats{}
	typeOf := func(name string) *TypeStats {
		t := byType[name]
		if t == nil {
			t = &TypeStats{EventType: name}
			byType[name] = t
		}
		return t
	}
	// The claim index (partial on PostgreSQL and SQLite): the events still to be delivered. The
	// leased, waiting and scheduled ones are told apart by columns of the row (lease, attempts, last
	// error), which the count reads anyway.
	query := `SELECT c.event_type, COUNT(*), SUM(CASE WHEN ` + leasedCond + ` THEN 1 ELSE 0 END), ` +
		`SUM(CASE WHEN ` + waitingCond + ` THEN 1 ELSE 0 END), SUM(CASE WHEN ` + scheduledCond + ` THEN 1 ELSE 0 END), ` +
		`MIN(CASE WHEN ` + scheduledCond + ` THEN NULL ELSE c.created_at END) FROM ` + a.q.Table() + ` c ` +
		`WHERE ` + liveGroup + ` GROUP BY c.event_type`
	rows, err := a.query(ctx, query, st.At, st.At, st.At, st.At, st.At, st.At, st.At)
	if err != nil {
		return fail(err)
	}
	for rows.Next() {
		var (
			name                             string
			n, nLeased, nWaiting, nScheduled sql.NullInt64
			oldest                           any
		)
		if err := rows.Scan(&name, &n, &nLeased, &nWaiting, &nScheduled, &oldest); err != nil {
			rows.Close()
			return fail(err)
		}
		t := typeOf(name)
		t.Pending, t.Scheduled = n.Int64-nScheduled.Int64, nScheduled.Int64
		st.Pending += t.Pending
		st.Scheduled += t.Scheduled
		st.Leased += nLeased.Int64
		st.Waiting += nWaiting.Int64
		if oldest != nil {
			t, err := dbtime.FromColumn(oldest)
			if err != nil {
				rows.Close()
				return fail(fmt.Errorf("created_at: %w", err))
			}
			if st.OldestPending.IsZero() || t.Before(st.OldestPending) {
				st.OldestPending = t
			}
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fail(err)
	}
	st.Due = st.Pending - st.Leased - st.Waiting
	if !st.OldestPending.IsZero() {
		st.OldestPendingAge = max(st.At.Sub(st.OldestPending), 0)
	}

	// The dead index (PostgreSQL, SQLite), or the claim index's leading columns (MySQL).
	rows, err = a.query(ctx, `SELECT c.event_type, COUNT(*) FROM `+a.q.Table()+` c WHERE `+deadGroup+` GROUP BY c.event_type`)
	if err != nil {
		return fail(err)
	}
	for rows.Next() {
		var (
			name string
			n    int64
		)
		if err := rows.Scan(&name, &n); err != nil {
			rows.Close()
			return fail(err)
		}
		typeOf(name).Dead = n
		st.Dead += n
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fail(err)
	}
	for _, t := range byType {
		st.ByType = append(st.ByType, *t)
	}
	slices.SortFunc(st.ByType, func(x, y TypeStats) int { return strings.Compare(x.EventType, y.EventType) })

	if st.Processed, st.ProcessedApproximate, err = a.countProcessed(ctx, st.Pending+st.Scheduled+st.Dead); err != nil {
		return fail(err)
	}
	if st.TableWarnings, err = checkTable(a.db.WithContext(ctx), a.table); err != nil {
		return fail(fmt.Errorf("check the table: %w", err))
	}
	if st.Health, err = readTableHealth(ctx, a.q.DB(), a.dialect, a.table, st.At); err != nil {
		return fail(fmt.Errorf("table health: %w", err))
	}
	return st, nil
}

// The three groups of rows, each read through its own index (see Admin); the processed rows'
// condition depends on the database (processedGroup).
const (
	liveGroup = `c.processed = false AND c.dead_at IS NULL`
	deadGroup = `c.processed = false AND c.dead_at IS NOT NULL`
)

// The live group as ListEvents reads it in creation order: the claim index's two runs, the fresh
// events (next_attempt_at NULL), which the index holds in creation order after its fixed prefix, and
// the timed ones (retries, delayed events), which are sorted. Read as one group, the whole backlog
// was sorted for a page: with 300 000 events pending, 322 ms for a page of 50 on MariaDB (where the
// full reference index of earlier versions had held them in creation order, 1.5 ms) and 135 ms on
// PostgreSQL; the fresh run read in order takes 2.6 ms and 0.08 ms.
const (
	freshRun = liveGroup + ` AND c.next_attempt_at IS NULL`
	timedRun = liveGroup + ` AND c.next_attempt_at IS NOT NULL`
)

// processedGroup is the condition of the processed rows as their index reads them. On PostgreSQL and
// SQLite the partial reference index (processed, created_at) holds them. MySQL and MariaDB have no
// partial indexes, and a full one would cost every insert and every mark; there the claim index
// (processed, dead_at, next_attempt_at, created_at, id) holds them in creation order after its fixed
// prefix: a processed row is never dead, and the mark clears its next attempt time (markProcessed;
// AutoMigrate clears it on the rows earlier versions marked).
func (a *Admin) processedGroup() string {
	if a.dialect == dialectMySQL {
		return `c.processed = true AND c.dead_at IS NULL AND c.next_attempt_at IS NULL`
	}
	return `c.processed = true`
}

// The states of the live group (liveGroup) as conditions on a row c, each taking the time of the
// reading as its bind variables (one per ?). Every one is written so that it is true or false, never
// NULL, on any row of the group: next_attempt_at and locked_until are NULL on most rows, and a
// negation of a NULL would drop them. A row is leased first; unleased, it is scheduled when it was
// never attempted and its time has not come, waiting when it failed and its retry time has not come,
// due otherwise (dueCond, which is also pendingCond less the leased rows).
//
// Why "never attempted" is attempts = 0 AND last_error IS NULL: a delayed event is written with its
// time and attempts = 0, like a retry not due yet; a claim counts an attempt, and every failure
// that sets a retry time leaves it counted and records its error. A requeue resets attempts but
// keeps the error, and clears the time. So the two columns together tell a delayed event from a
// failed one, also for a failure whose attempt would be given back.
const (
	leasedCond    = `(c.locked_until IS NOT NULL AND c.locked_until >= ?)`
	notLeasedCond = `(c.locked_until IS NULL OR c.locked_until < ?)`
	neverTried    = `c.attempts = 0 AND c.last_error IS NULL`
	scheduledCond = `(c.next_attempt_at IS NOT NULL AND c.next_attempt_at > ? AND ` + neverTried + ` AND ` + notLeasedCond + `)`
	waitingCond   = `(c.next_attempt_at IS NOT NULL AND c.next_attempt_at > ? AND NOT (` + neverTried + `) AND ` + notLeasedCond + `)`
	dueCond       = `((c.next_attempt_at IS NULL OR c.next_attempt_at <= ?) AND ` + notLeasedCond + `)`
	// pendingCond is due, leased or waiting: every live row that is not scheduled.
	pendingCond = `(c.next_attempt_at IS NULL OR c.next_attempt_at <= ? OR NOT (` + neverTried + `) OR ` + leasedCond + `)`
)

// countProcessed counts the processed rows exactly up to ExactProcessedLimit (the processed index,
// read no further than that), and takes the database's estimate above it; others is the exact count
// of the table's other rows.
func (a *Admin) countProcessed(ctx context.Context, others int64) (int64, bool, error) {
	var n int64
	limit := ` LIMIT ` + strconv.Itoa(ExactProcessedLimit+1)
	if a.dialect == "sqlite" {
		limit = "" // no estimate to fall back on: count them all
	}
	if err := a.q.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM `+a.q.Table()+` c WHERE `+a.processedGroup()+limit+`) x`).Scan(&n); err != nil {
		return 0, false, err
	}
	if limit == "" || n <= ExactProcessedLimit {
		return n, false, nil
	}
	switch a.dialect {
	case "postgres":
		// The partial index holds the processed rows only: its reltuples is their count as of the
		// last VACUUM or ANALYZE (autovacuum keeps it close). -1: never measured. On a partitioned
		// table the index has none of its own: its partitions' indexes (the leaves of its tree) do.
		var est sql.NullFloat64
		err := a.q.DB().QueryRowContext(ctx, `SELECT COALESCE((SELECT SUM(c.reltuples) FILTER (WHERE c.reltuples >= 0)`+
			` FROM pg_partition_tree(to_regclass($1)) t JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf AND t.relid <> to_regclass($1)),`+
			` (SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)))`,
			pgIndexRef(a.table, gormIndexName(a.db, a.table, "processed_created_at"))).Scan(&est)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, false, err
		}
		if est.Valid && est.Float64 > ExactProcessedLimit {
			return int64(est.Float64), true, nil
		}
	case "mysql":
		// InnoDB's row count estimate of the table (persistent statistics, recalculated when a tenth
		// of the table has changed), less the exact counts of the rest. Not the optimizer's estimate of
		// the processed range: InnoDB caps a range estimate at half the table.
		schema, name := "", a.table
		if i := strings.LastIndex(name, "."); i >= 0 {
			schema, name = name[:i], name[i+1:]
		}
		var est sql.NullInt64
		err := a.q.DB().QueryRowContext(ctx, `SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?`,
			schema, name).Scan(&est)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, false, err
		}
		if rest := est.Int64 - others; est.Valid && rest > ExactProcessedLimit {
			return rest, true, nil
		}
	}
	return n, true, nil // at least this many: the estimate is missing or lags behind
}

// EventFilter selects events for ListEvents and the *Where methods. Zero fields select everything.
type EventFilter struct {
	// State is one state, StatePending, or "" for all.
	State EventState
	// EventType, and the aggregate (AggregateType and AggregateID, the message key), match exactly.
	EventType     string
	AggregateType string
	AggregateID   string
	// MessageID matches one event.
	MessageID string
	// LastError matches the error text of the latest failed delivery exactly: one group of
	// DeadGroups. Only dead and waiting events have one.
	//
	// The text fields (and the message ids of Event, Requeue, Discard and DeliverNow) must be UTF-8
	// without NUL bytes, which PostgreSQL cannot store: others are refused with ErrInvalidFilter on
	// every database.
	LastError string
	// Since and Until bound the creation time: Since <= created_at < Until.
	Since, Until time.Time
	// Limit is the page size of ListEvents: 1..1000, 0 for 50. The *Where methods ignore it.
	Limit int
	// Cursor continues a listing where the page that returned it (Page.Next) ended. A cursor belongs
	// to its filter's order: pass it back with the same Oldest.
	Cursor string
	// Oldest lists the oldest events first; the default is newest first.
	Oldest bool
}

// Page is one page of ListEvents.
type Page struct {
	Events []EventInfo
	// Next is the cursor of the next page, or "" when this one is the last.
	Next string
	// Partial is true when the page stopped before it was full because the search among processed
	// events reached MaxProcessedScan rows (see ListEvents): SearchedTo is the creation time it got
	// to, and Next continues the search from there.
	Partial    bool
	SearchedTo time.Time
}

// MaxProcessedScan bounds how many processed rows one ListEvents call reads to find those matching a
// filter the processed index does not cover (an event type, an aggregate, an error text): at most
// this many are read per page, newest (or oldest) first, whatever the table keeps.
const MaxProcessedScan = 20000

// EventInfo is an event as the Admin shows it.
type EventInfo struct {
	ID            int64
	MessageID     string
	EventType     string
	AggregateType string
	AggregateID   string
	Payload       json.RawMessage
	Headers       map[string]string
	CreatedAt     time.Time
	State         EventState
	// Attempts is how many deliveries were started (claims), including one in flight.
	Attempts int
	// NextAttemptAt is when a waiting event will be retried, or a scheduled event delivered.
	NextAttemptAt *time.Time
	// LastError is the error of the latest failed delivery, or "".
	LastError   string
	ProcessedAt *time.Time
	DeadAt      *time.Time
	// LockedBy and LockedUntil are the lease of a leased event (and what is left of an expired one);
	// empty and nil on an event no relay holds, whether its columns are NULL or, on MySQL and MariaDB,
	// hold the placeholders a new row starts with (see OutboxEvent).
	LockedBy    string
	LockedUntil *time.Time
	// History is the event's last failed attempts (WithAttemptHistory of the workers, 10 by default),
	// oldest first, newest last; nil when none failed. It is read with the rest of the row, by the
	// same query, and kept across requeues (the attempt numbers start again at 1 after one). A history
	// edited by hand into something that does not decode reads as nil.
	History []Attempt
}

// adminColumns are the columns the Admin reads of an event. attempt_history is among them: a table of
// an earlier version needs outboxplugin.AutoMigrate (which adds it without rewriting the table) before
// the Admin reads it. It costs a listing little: NULL until an event fails, and bounded after.
const adminColumns = `c.id, c.message_id, c.event_type, c.aggregate_type, c.aggregate_id, c.payload, c.headers, c.created_at, ` +
	`c.processed, c.processed_at, c.attempts, c.next_attempt_at, c.last_error, c.dead_at, c.locked_by, c.locked_until, c.attempt_history`

const (
	defaultPageSize = 50
	maxPageSize     = 1000
)

// ListEvents returns one page of the events f selects, newest first (or oldest first with f.Oldest),
// in creation order (created_at, then id). Each state's rows are read through their own index, in
// that order, up to the page. With f.EventType, an aggregate or f.LastError among processed events,
// which no index holds, the processed index is read newest (or oldest) first for at most
// MaxProcessedScan rows per call: a page that did not fill within them is Partial, says how far the
// search got (SearchedTo), and its Next continues from there. Since and Until narrow the search.
func (a *Admin) ListEvents(ctx context.Context, f EventFilter) (Page, error) {
	fail := func(err error) (Page, error) {
		return Page{}, fmt.Errorf("outboxplugin: ListEvents of %s: %w", a.table, err)
	}
	limit := f.Limit
	switch {
	case limit == 0:
		limit = defaultPageSize
	case limit < 0 || limit > maxPageSize:
		return fail(fmt.Errorf("%w: limit %d not in 1..%d", ErrInvalidFilter, f.Limit, maxPageSize))
	}
	var after *pageCursor
	if f.Cursor != "" {
		c, err := parseCursor(f.Cursor)
		if err != nil {
			return fail(err)
		}
		after = &c
	}
	events, cut, err := a.selectEvents(ctx, f, after, limit+1)
	if err != nil {
		return fail(err)
	}
	if cut != nil {
		// The search among processed rows stopped at cut: an event of another group past it may
		// come after processed events not read yet, so it waits for the next page.
		kept := events[:0]
		for _, e := range events {
			if c := cmpEvent(e, *cut); (!f.Oldest && c >= 0) || (f.Oldest && c <= 0) {
				kept = append(kept, e)
			}
		}
		events = kept
	}
	page := Page{Events: events}
	if cut != nil && len(events) <= limit {
		page.Partial, page.SearchedTo, page.Next = true, cut.createdAt, cut.String()
		return page, nil
	}
	if len(events) > limit {
		page.Events = events[:limit]
		last := page.Events[limit-1]
		page.Next = pageCursor{createdAt: last.CreatedAt, id: last.ID}.String()
	}
	return page, nil
}

// cmpEvent compares an event's place in creation order (created_at, then id) with a cursor's.
func cmpEvent(e EventInfo, c pageCursor) int {
	if r := e.CreatedAt.Compare(c.createdAt); r != 0 {
		return r
	}
	return cmpInt64(e.ID, c.id)
}

// selectEvents returns up to limit events f selects after the cursor, in f's order: one query per
// group of rows the state filter touches, merged. When the processed rows are searched for a filter
// their index does not cover and MaxProcessedScan of them did not fill the page, cut is the last row
// read: nothing past it was looked at.
func (a *Admin) selectEvents(ctx context.Context, f EventFilter, after *pageCursor, limit int) (_ []EventInfo, cut *pageCursor, _ error) {
	state, err := ParseEventState(string(f.State))
	if err != nil {
		return nil, nil, err
	}
	if err := checkFilterText(f); err != nil {
		return nil, nil, err
	}
	at := a.q.Clock(now())
	processedGroup := a.processedGroup()
	var groups []string
	switch state {
	case "":
		groups = []string{freshRun, timedRun, deadGroup, processedGroup}
	case StateDead:
		groups = []string{deadGroup}
	case StateProcessed:
		groups = []string{processedGroup}
	default:
		groups = []string{freshRun, timedRun}
	}
	dir := "DESC"
	if f.Oldest {
		dir = "ASC"
	}
	var out []EventInfo
	for _, g := range groups {
		// where: what the group's index reads (its range, and conditions on the row it reaches);
		// filters: the event type, aggregate and error text, which no index of processed rows holds.
		var (
			where, filters []string
			args, fargs    []any
		)
		add := func(cond string, v ...any) { where = append(where, cond); args = append(args, v...) }
		filter := func(cond string, v ...any) { filters = append(filters, cond); fargs = append(fargs, v...) }
		add(g)
		switch state {
		case StateLeased:
			add(leasedCond, at)
		case StateWaiting:
			add(waitingCond, at, at)
		case StateScheduled:
			add(scheduledCond, at, at)
		case StateDue:
			add(dueCond, at, at)
		case StatePending:
			add(pendingCond, at, at)
		}
		if f.EventType != "" {
			filter(`c.event_type = ?`, f.EventType)
		}
		if f.AggregateType != "" || f.AggregateID != "" {
			filter(`c.aggregate_type = ? AND c.aggregate_id = ?`, f.AggregateType, f.AggregateID)
		}
		if f.LastError != "" {
			filter(`c.last_error = ?`, f.LastError)
		}
		if g == processedGroup && a.dialect == "postgres" {
			// The planner drops processed = true from the index conditions of the partial processed
			// index (its predicate implies it), and a bound on created_at, the index's second column,
			// then neither starts nor stops the scan: a one-minute window of a million rows read the
			// whole index (3 836 buffers, EXPLAIN). Spelled IS TRUE as well, processed = true is an
			// index condition again, and the window reads 11 buffers.
			add(`c.processed IS TRUE`)
		}
		// MySQL and MariaDB store microseconds, and MariaDB bounds no index range by a time with
		// nanoseconds (a Since of time.Now() read the whole run): the bound is rounded up to the
		// microsecond, where created_at >= t and created_at < t select what they would with t exact.
		bound := func(op string, t time.Time) {
			if r := t.Truncate(time.Microsecond); a.dialect == dialectMySQL && !r.Equal(t) {
				t = r.Add(time.Microsecond)
			}
			add(`c.created_at `+op+` ?`, t)
		}
		if f.MessageID != "" {
			add(`c.message_id = ?`, f.MessageID)
			if g == processedGroup {
				// Processed rows have no message id index: a UUIDv7 carries its creation time,
				// which bounds the processed index's range.
				if t, ok := msgid.Time(f.MessageID); ok {
					bound(">=", t.Add(-messageIDSlack))
					bound("<", t.Add(messageIDSlack))
				}
			}
		}
		if !f.Since.IsZero() {
			bound(">=", f.Since.UTC())
		}
		if !f.Until.IsZero() {
			bound("<", f.Until.UTC())
		}
		if after != nil {
			cmp := "<"
			if f.Oldest {
				cmp = ">"
			}
			bound(cmp+"=", after.createdAt) // an index bound, where the scan starts; the exact condition follows
			add(`(c.created_at `+cmp+` ? OR (c.created_at = ? AND c.id `+cmp+` ?))`, after.createdAt, after.createdAt, after.id)
		}
		// The processed index reads in this order without a sort: InnoDB's secondary index holds the
		// primary key after its columns, SQLite's the rowid (id), and PostgreSQL sorts only the ties
		// of created_at (an incremental sort).
		order := `c.created_at ` + dir + `, c.id ` + dir
		if g == freshRun && a.dialect == "postgres" {
			// PostgreSQL takes next_attempt_at IS NULL for no constant: it reads the claim index in
			// order only when the ORDER BY names its leading columns (which the predicate fixes, so
			// the order is the same). MariaDB would sort if it named them.
			order = `c.processed ` + dir + `, c.dead_at ` + dir + `, c.next_attempt_at ` + dir + `, ` + order
		}
		indexed := `SELECT ` + adminColumns + ` FROM ` + a.q.Table() + ` c WHERE ` + strings.Join(where, " AND ")
		// Processed rows searched for a filter their index does not hold: the first MaxProcessedScan
		// rows of the index range, in order (a scan that stops there), filtered; a rare type then
		// costs a bounded read per page instead of the whole table.
		bounded := g == processedGroup && f.MessageID == "" && len(filters) > 0
		var query string
		switch {
		case bounded:
			query = `SELECT ` + adminColumns + ` FROM (` + indexed + ` ORDER BY ` + order + ` LIMIT ` + strconv.Itoa(MaxProcessedScan) +
				`) c WHERE ` + strings.Join(filters, " AND ") + ` ORDER BY ` + order + ` LIMIT ` + strconv.Itoa(limit)
		case len(filters) > 0:
			query = indexed + ` AND ` + strings.Join(filters, " AND ") + ` ORDER BY ` + order + ` LIMIT ` + strconv.Itoa(limit)
		default:
			query = indexed + ` ORDER BY ` + order + ` LIMIT ` + strconv.Itoa(limit)
		}
		evs, err := a.scanEvents(ctx, at, query, append(args, fargs...)...)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, evs...)
		if bounded && len(evs) < limit {
			// The page is not full: did the scan stop at MaxProcessedScan rows? Then its last row is
			// where the search got to.
			if cut, err = a.nthRow(ctx, `SELECT c.created_at, c.id FROM `+a.q.Table()+` c WHERE `+strings.Join(where, " AND ")+
				` ORDER BY `+order+` LIMIT 1 OFFSET `+strconv.Itoa(MaxProcessedScan-1), args...); err != nil {
				return nil, nil, err
			}
		}
	}
	slices.SortFunc(out, func(x, y EventInfo) int {
		c := x.CreatedAt.Compare(y.CreatedAt)
		if c == 0 {
			c = cmpInt64(x.ID, y.ID)
		}
		if !f.Oldest {
			c = -c
		}
		return c
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, cut, nil
}

// checkFilterText refuses a text of f that is not UTF-8 without NUL bytes: PostgreSQL cannot store
// one in a text column and answers a parameter holding one with an error of its own (so that a
// console's /events/%00 was a database error), and the Admin refuses it on every database, so that
// a filter means the same on each.
func checkFilterText(f EventFilter) error {
	for _, v := range []struct{ name, s string }{
		{"event type", f.EventType}, {"aggregate type", f.AggregateType}, {"aggregate id", f.AggregateID},
		{"message id", f.MessageID}, {"error text", f.LastError},
	} {
		if !utf8.ValidString(v.s) || strings.ContainsRune(v.s, 0) {
			return fmt.Errorf("%w: %s %q is not text: it has a NUL byte or bytes that are not UTF-8", ErrInvalidFilter, v.name, v.s)
		}
	}
	return nil
}

// nthRow runs a query of one (created_at, id) row and returns it as a cursor, or nil when there is
// none.
func (a *Admin) nthRow(ctx context.Context, query string, args ...any) (*pageCursor, error) {
	rows, err := a.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	var cut *pageCursor
	if rows.Next() {
		var (
			created any
			c       pageCursor
		)
		if err = rows.Scan(&created, &c.id); err == nil {
			c.createdAt, err = dbtime.FromColumn(created)
		}
		cut = &c
	}
	if err := errors.Join(err, rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	return cut, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// messageIDSlack is how far an event's created_at may lie from its UUIDv7's timestamp: both are
// taken from the writing process's clock as the event is built, a few microseconds apart; the id's
// counter can carry it a few milliseconds ahead.
const messageIDSlack = time.Minute

// Event returns the event with the message id, with its attempts, last error and state, or an error
// wrapping ErrEventNotFound. Events to be delivered and dead ones are found through their indexes;
// a processed one through the processed index within a minute of the time its UUIDv7 id carries
// (the plugin takes both from one clock as it writes the event), so that an id that is not there
// costs no more than one that is. A message id that is not a UUIDv7 (written by hand) makes the
// search read every processed row.
func (a *Admin) Event(ctx context.Context, messageID string) (EventInfo, error) {
	if messageID == "" {
		return EventInfo{}, fmt.Errorf("outboxplugin: Event: %w: empty message id", ErrInvalidFilter)
	}
	if err := checkFilterText(EventFilter{MessageID: messageID}); err != nil {
		return EventInfo{}, fmt.Errorf("outboxplugin: Event: %w", err)
	}
	evs, err := a.findByMessageID(ctx, messageID)
	if err != nil {
		return EventInfo{}, fmt.Errorf("outboxplugin: Event %s: %w", messageID, err)
	}
	if len(evs) == 0 {
		return EventInfo{}, fmt.Errorf("outboxplugin: Event %s in %s: %w", messageID, a.table, ErrEventNotFound)
	}
	return evs[0], nil
}

// findByMessageID returns the events with the message id (one, unless ids were written by hand);
// among processed rows, within a minute of the time its UUIDv7 carries (see Event).
func (a *Admin) findByMessageID(ctx context.Context, messageID string) ([]EventInfo, error) {
	evs, _, err := a.selectEvents(ctx, EventFilter{MessageID: messageID}, nil, 2)
	return evs, err
}

// scanEvents runs query and reads its rows as EventInfo, their state as of at.
func (a *Admin) scanEvents(ctx context.Context, at time.Time, query string, args ...any) ([]EventInfo, error) {
	rows, err := a.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []EventInfo
	for rows.Next() {
		var (
			e                                    EventInfo
			payload, headers                     []byte
			created, processedAt, nextAt, deadAt any
			lockedUntil                          any
			lastError, lockedBy                  sql.NullString
			processed                            bool
			history                              AttemptHistory
		)
		if err := rows.Scan(&e.ID, &e.MessageID, &e.EventType, &e.AggregateType, &e.AggregateID, &payload, &headers, &created,
			&processed, &processedAt, &e.Attempts, &nextAt, &lastError, &deadAt, &lockedBy, &lockedUntil, &history); err != nil {
			return nil, err
		}
		// An event that cannot be shown whole is still shown: its history is what helps least.
		e.History, _ = history.Attempts()
		e.Payload = json.RawMessage(payload)
		if len(headers) > 0 && string(headers) != "null" {
			if err := json.Unmarshal(headers, &e.Headers); err != nil {
				return nil, fmt.Errorf("event %d: headers: %w", e.ID, err)
			}
		}
		var terr error
		times := []struct {
			v   any
			dst **time.Time
		}{{processedAt, &e.ProcessedAt}, {nextAt, &e.NextAttemptAt}, {deadAt, &e.DeadAt}, {lockedUntil, &e.LockedUntil}}
		if e.CreatedAt, terr = dbtime.FromColumn(created); terr != nil {
			return nil, fmt.Errorf("event %d: created_at: %w", e.ID, terr)
		}
		for _, t := range times {
			if t.v == nil {
				continue
			}
			v, err := dbtime.FromColumn(t.v)
			if err != nil {
				return nil, fmt.Errorf("event %d: %w", e.ID, err)
			}
			*t.dst = &v
		}
		e.LastError, e.LockedBy = lastError.String, lockedBy.String
		if strings.TrimSpace(e.LockedBy) == "" {
			// No relay has claimed it since it was written (the defaults of MySQL's lease columns,
			// NoLeaseOwner and noLeaseUntil), or one handed it back.
			e.LockedBy, e.LockedUntil = "", nil
		}
		e.State = eventStateAt(processed, e, lastError.Valid, at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// eventStateAt is the state of an event read at at, as the conditions of the live group (leasedCond,
// scheduledCond, waitingCond, dueCond) tell it; failed is true when its last_error is not NULL.
func eventStateAt(processed bool, e EventInfo, failed bool, at time.Time) EventState {
	switch {
	case processed:
		return StateProcessed
	case e.DeadAt != nil:
		return StateDead
	case e.LockedUntil != nil && !e.LockedUntil.Before(at):
		return StateLeased
	case e.NextAttemptAt != nil && e.NextAttemptAt.After(at) && e.Attempts == 0 && !failed:
		return StateScheduled
	case e.NextAttemptAt != nil && e.NextAttemptAt.After(at):
		return StateWaiting
	}
	return StateDue
}

// query runs a statement of the Admin with the dialect's bind variables.
func (a *Admin) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	query, args = a.q.Literal(a.q.Bind(query), args)
	return a.q.DB().QueryContext(ctx, query, args...)
}

// pageCursor is where a page ended: the last event's creation time and id.
type pageCursor struct {
	createdAt time.Time
	id        int64
}

// String writes the cursor as <unix nanoseconds>.<id>.
func (c pageCursor) String() string {
	return strconv.FormatInt(c.createdAt.UnixNano(), 10) + "." + strconv.FormatInt(c.id, 10)
}

func parseCursor(s string) (pageCursor, error) {
	ns, id, ok := strings.Cut(s, ".")
	n, err1 := strconv.ParseInt(ns, 10, 64)
	i, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil || i < 0 {
		return pageCursor{}, fmt.Errorf("%w: cursor %q is not one ListEvents returned", ErrInvalidFilter, s)
	}
	return pageCursor{createdAt: time.Unix(0, n).UTC(), id: i}, nil
}

// Requeue makes the failed events with these message ids — dead, or waiting for a retry — due now,
// with their attempts reset (their last error stays, until a delivery succeeds or fails anew), and
// returns how many it requeued. Events of any other state are left alone: being delivered, already
// processed, and scheduled (a delayed event keeps its time: DeliverNow is the action that moves it).
func (a *Admin) Requeue(ctx context.Context, messageIDs ...string) (int64, error) {
	n, err := a.byMessageIDs(ctx, messageIDs, a.requeueIDs)
	if err != nil {
		return n, fmt.Errorf("outboxplugin: Requeue: %w", err)
	}
	return n, nil
}

// RequeueWhere requeues, as Requeue does, every failed event f selects; f.State must be StateDead,
// StateWaiting or "" (both). It never selects a scheduled event. It works in chunks of 1000 events,
// each its own statement.
func (a *Admin) RequeueWhere(ctx context.Context, f EventFilter) (int64, error) {
	n, err := a.where(ctx, f, []EventState{StateDead, StateWaiting}, a.requeueIDs)
	if err != nil {
		return n, fmt.Errorf("outboxplugin: RequeueWhere: %w", err)
	}
	return n, nil
}

// DeliverNow makes the scheduled events with these message ids due now, ahead of the time they were
// written with (their next_attempt_at is cleared, as if they had been written without a delay), and
// returns how many it moved. Events of any other state are left alone: a failed one is requeued with
// Requeue, not by this.
func (a *Admin) DeliverNow(ctx context.Context, messageIDs ...string) (int64, error) {
	n, err := a.byMessageIDs(ctx, messageIDs, a.deliverNowIDs)
	if err != nil {
		return n, fmt.Errorf("outboxplugin: DeliverNow: %w", err)
	}
	return n, nil
}

// DeliverNowWhere makes every scheduled event f selects due now, as DeliverNow does; f.State must be
// StateScheduled or "". It works in chunks of 1000 events, each its own statement.
func (a *Admin) DeliverNowWhere(ctx context.Context, f EventFilter) (int64, error) {
	n, err := a.where(ctx, f, []EventState{StateScheduled}, a.deliverNowIDs)
	if err != nil {
		return n, fmt.Errorf("outboxplugin: DeliverNowWhere: %w", err)
	}
	return n, nil
}

// Discard deletes the dead events with these message ids, and returns how many it deleted. Events of
// any other state are left alone.
func (a *Admin) Discard(ctx context.Context, messageIDs ...string) (int64, error) {
	n, err := a.byMessageIDs(ctx, messageIDs, a.discardIDs)
	if err != nil {
		return n, fmt.Errorf("outboxplugin: Discard: %w", err)
	}
	return n, nil
}

// DiscardWhere deletes every dead event f selects; f.State must be StateDead or "". It works in
// chunks of 1000 events.
func (a *Admin) DiscardWhere(ctx context.Context, f EventFilter) (int64, error) {
	n, err := a.where(ctx, f, []EventState{StateDead}, a.discardIDs)
	if err != nil {
		return n, fmt.Errorf("outboxplugin: DiscardWhere: %w", err)
	}
	return n, nil
}

// Cleanup deletes processed events created more than olderThan ago, in chunks of 1000 rows (each its
// own statement, through the processed index), and returns how many it deleted. It may run beside
// workers, and beside their periodic cleanup.
func (a *Admin) Cleanup(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("outboxplugin: Cleanup: %w: negative age %v", ErrInvalidFilter, olderThan)
	}
	n, _, err := relay.Cleanup(ctx, a.q, now().Add(-olderThan), false)
	if err != nil {
		return n, fmt.Errorf("outboxplugin: Cleanup of %s: %w", a.table, err)
	}
	return n, nil
}

// byMessageIDs finds the rows of the message ids, chunk by chunk, and hands their ids to act.
func (a *Admin) byMessageIDs(ctx context.Context, messageIDs []string, act func(context.Context, []int64) (int64, error)) (int64, error) {
	var total int64
	for chunk := range slices.Chunk(messageIDs, adminChunk) {
		var ids []int64
		for _, m := range chunk {
			if m == "" {
				return total, fmt.Errorf("%w: empty message id", ErrInvalidFilter)
			}
			evs, err := a.findByMessageID(ctx, m)
			if err != nil {
				return total, err
			}
			for _, e := range evs {
				ids = append(ids, e.ID)
			}
		}
		if len(ids) == 0 {
			continue
		}
		n, err := act(ctx, ids)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// where hands the ids of the events f selects to act, chunk by chunk, until none is left; f's state
// must be one of allowed, or "" for all of them.
func (a *Admin) where(ctx context.Context, f EventFilter, allowed []EventState, act func(context.Context, []int64) (int64, error)) (int64, error) {
	state, err := ParseEventState(string(f.State))
	if err != nil {
		return 0, err
	}
	states := allowed
	if state != "" {
		if !slices.Contains(allowed, state) {
			return 0, fmt.Errorf("%w: state %q: this acts on %v events only", ErrInvalidFilter, state, allowed)
		}
		states = []EventState{state}
	}
	f.Cursor, f.Oldest = "", true
	var total int64
	for _, st := range states {
		f.State = st
		var after *pageCursor
		for {
			evs, _, err := a.selectEvents(ctx, f, after, adminChunk)
			if err != nil {
				return total, err
			}
			if len(evs) == 0 {
				break
			}
			ids := make([]int64, len(evs))
			for i, e := range evs {
				ids[i] = e.ID
			}
			n, err := act(ctx, ids)
			total += n
			if err != nil {
				return total, err
			}
			last := evs[len(evs)-1]
			after = &pageCursor{createdAt: last.CreatedAt, id: last.ID}
			if len(evs) < adminChunk {
				break
			}
		}
	}
	return total, nil
}

// adminChunk is how many rows one statement of the *Where methods changes.
const adminChunk = 1000

// requeueIDs makes the dead or waiting rows among ids due now. The condition is checked again in the
// UPDATE: a row a worker leased since it was read is not touched, nor a scheduled one.
func (a *Admin) requeueIDs(ctx context.Context, ids []int64) (int64, error) {
	at := a.q.Clock(now())
	return a.q.Exec(ctx, a.q.DB(), `UPDATE `+a.q.Table()+` SET dead_at = NULL, attempts = 0, next_attempt_at = NULL WHERE `, nil, ids,
		` AND processed = false AND (dead_at IS NOT NULL OR `+bareCond(waitingCond)+`)`, at, at)
}

// deliverNowIDs makes the scheduled rows among ids due now, checked again in the UPDATE.
func (a *Admin) deliverNowIDs(ctx context.Context, ids []int64) (int64, error) {
	at := a.q.Clock(now())
	return a.q.Exec(ctx, a.q.DB(), `UPDATE `+a.q.Table()+` SET next_attempt_at = NULL WHERE `, nil, ids,
		` AND processed = false AND dead_at IS NULL AND `+bareCond(scheduledCond), at, at)
}

// bareCond is a condition on the row c written for an UPDATE of the table, which has no alias.
func bareCond(cond string) string { return strings.ReplaceAll(cond, "c.", "") }

// discardIDs deletes the dead rows among ids.
func (a *Admin) discardIDs(ctx context.Context, ids []int64) (int64, error) {
	return a.q.Exec(ctx, a.q.DB(), `DELETE FROM `+a.q.Table()+` WHERE `, nil, ids, ` AND processed = false AND dead_at IS NOT NULL`)
}
