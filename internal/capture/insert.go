package capture

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
)

// Inserter writes the events of a plugin's statements: into the statement's watched transaction,
// which holds them until it writes them all together (Watch), or at once. Its fields are set before
// the plugin is registered and not changed after.
type Inserter struct {
	Table  string // the outbox table, a validated identifier
	Notify bool   // wake the relays of other processes on PostgreSQL (WithNotify)
	// Strategy is how events reach the table; zero: per dialect. Set by tests and benchmarks to
	// compare.
	Strategy Strategy
	// PerStatement writes the events of each statement right after it instead of holding a
	// transaction's events until commit; set by benchmarks to compare.
	PerStatement bool

	sqlMu    sync.RWMutex
	sqlCache map[insertShape]string
}

// insertColumns are the columns the plugin writes; processed and attempts take their defaults, the
// relay's columns start NULL.
var insertColumns = [...]string{"message_id", "event_type", "aggregate_type", "aggregate_id", "payload", "headers", "created_at"}

// MaxRowsPerInsert bounds one INSERT: 1000 rows of 7 values stay far below the bind-parameter limits
// of PostgreSQL and MySQL (65535) and SQLite (32766). A statement that changes more rows writes its
// events in INSERTs of this size.
const MaxRowsPerInsert = 1000

type insertShape struct {
	dialect string
	rows    int // -1: unnest, any number of rows
	notify  bool
	delayed bool // with next_attempt_at (delayedSQL)
}

// Strategy is how the events of one transaction (or statement) reach the table.
type Strategy int

const (
	// InsertValues: INSERT INTO t (...) VALUES (...), (...) with one bind variable per value. Every
	// database takes it; the text depends on the row count.
	InsertValues Strategy = iota + 1
	// InsertUnnest (PostgreSQL): INSERT INTO t (...) SELECT ... FROM unnest($1::text[], ...), one
	// array per column. Seven bind variables whatever the row count, so one prepared statement
	// serves every batch, and the server decodes seven arrays instead of hundreds of parameters. A
	// single event still goes through VALUES, which is cheaper for one row.
	InsertUnnest
)

func (s Strategy) String() string {
	switch s {
	case InsertValues:
		return "values"
	case InsertUnnest:
		return "unnest"
	}
	return "unknown"
}

// strategy picks the insert of db's dialect; docs/benchmarks.md has the measurements behind it.
func (p *Inserter) strategy(db *gorm.DB) Strategy {
	if p.Strategy != 0 {
		return p.Strategy
	}
	if db.Dialector.Name() == "postgres" {
		return InsertUnnest
	}
	return InsertValues
}

// Insert has the events of statement db (origin: "create User") written in its transaction,
// pool: held by the transaction until it writes them all together (txwatch.go) when the plugin
// watches it, written now otherwise.
func (p *Inserter) Insert(db *gorm.DB, pool gorm.ConnPool, events []Event, origin string) error {
	t := TxOf(pool)
	if t != nil && !p.PerStatement {
		return t.hold(p, db, events, origin)
	}
	if t != nil {
		if err := t.ClosedErr(); err != nil {
			return err
		}
		t.dirty.Store(true)
	}
	return p.insertNow(db.Statement.Context, db, pool, events, p.notifyInTransaction(db, t))
}

// notifyInTransaction reports whether events written in t (nil: a transaction the plugin does not
// watch) carry their own wake-up, pg_notify inside the transaction, because none follows its commit.
func (p *Inserter) notifyInTransaction(db *gorm.DB, t *Tx) bool {
	return p.Notify && db.Dialector.Name() == "postgres" && (t == nil || !t.cw.notify)
}

// insertNow writes events with multi-row INSERTs on pool (the transaction of the write) under ctx,
// with notify preceded by pg_notify. db gives the dialect and the logger.
func (p *Inserter) insertNow(ctx context.Context, db *gorm.DB, pool gorm.ConnPool, events []Event, notify bool) error {
	return p.statements(db, events, notify, func(query string, args []any, n int) error {
		start := time.Now()
		_, err := pool.ExecContext(ctx, query, args...)
		db.Logger.Trace(ctx, start, func() (string, int64) {
			return db.Dialector.Explain(query, args...), int64(n)
		}, err)
		if err != nil {
			return fmt.Errorf("insert into %s: %w", p.Table, err)
		}
		return nil
	})
}

// statements calls write with each INSERT that writes events (of n of them), in order, and stops
// at its first error.
func (p *Inserter) statements(db *gorm.DB, events []Event, notify bool, write func(query string, args []any, n int) error) error {
	strategy := p.strategy(db)
	for len(events) > 0 {
		// A run of events of one kind, delayed (DeliverAfter, DeliverAt) or not, in their order: the
		// ids keep the order of the writes, which per-key ordering follows.
		delayed := events[0].DeliverAt != nil
		n := 1
		for n < len(events) && n < MaxRowsPerInsert && (events[n].DeliverAt != nil) == delayed {
			n++
		}
		var (
			query string
			args  []any
		)
		switch {
		case delayed:
			// Not due before its time: no wake-up either, the relay polls for it.
			query, args = p.delayedSQL(db, n), delayedArgs(events[:n])
		case strategy == InsertUnnest && n > 1:
			query, args = p.unnestSQL(db, notify), unnestArgs(events[:n])
		default:
			query, args = p.valuesSQL(db, n, notify), valuesArgs(events[:n])
		}
		if err := write(query, args, n); err != nil {
			return err
		}
		events = events[n:]
	}
	return nil
}

// inlineSQL is the INSERTs of events on PostgreSQL, their values written as literals (conntx.go
// sends them with the COMMIT), with how many events each writes; false when a value cannot be (a NUL
// byte, which PostgreSQL refuses in text anyway: the usual path then reports it).
func (p *Inserter) inlineSQL(db *gorm.DB, events []Event, notify bool) (stmts []string, counts []int, ok bool) {
	err := p.statements(db, events, notify, func(query string, args []any, n int) error {
		var b strings.Builder
		b.Grow(len(query) + 64*n)
		if !appendInlined(&b, query, args) {
			return errNotInlined
		}
		stmts, counts = append(stmts, b.String()), append(counts, n)
		return nil
	})
	return stmts, counts, err == nil
}

var errNotInlined = errors.New("not inlined")

// appendInlined writes query with each $n replaced by the literal of args[n-1]. The statements are
// the plugin's own, with no $ but their bind variables.
func appendInlined(b *strings.Builder, query string, args []any) bool {
	for i := 0; i < len(query); i++ {
		c := query[i]
		if c != '$' {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(query) && query[j] >= '0' && query[j] <= '9' {
			j++
		}
		n, err := strconv.Atoi(query[i+1 : j])
		if err != nil || n < 1 || n > len(args) || !appendPGLiteral(b, args[n-1]) {
			return false
		}
		i = j - 1
	}
	return true
}

// appendPGLiteral writes v as a PostgreSQL literal: NULL, or a quoted string (times as UTC text with
// microseconds, truncated as pgx truncates a bound time). A string with a backslash is written as
// E'...' with the backslashes doubled, so that it reads the same whatever
// standard_conforming_strings says; quotes are doubled.
func appendPGLiteral(b *strings.Builder, v any) bool {
	var s string
	switch v := v.(type) {
	case nil:
		b.WriteString("NULL")
		return true
	case string:
		s = v
	case time.Time:
		s = v.UTC().Format("2006-01-02 15:04:05.999999Z07:00")
	default:
		return false
	}
	if strings.IndexByte(s, 0) >= 0 {
		return false
	}
	escape := strings.IndexByte(s, '\\') >= 0
	if escape {
		b.WriteByte('E')
	}
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			b.WriteString("''")
		case c == '\\' && escape:
			b.WriteString(`\\`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return true
}

func valuesArgs(events []Event) []any {
	args := make([]any, 0, len(events)*len(insertColumns))
	for i := range events {
		e := &events[i]
		var headers any
		if e.Headers != nil {
			headers = *e.Headers
		}
		args = append(args, e.MessageID, e.Type, e.AggregateType, e.AggregateID, e.Payload, headers, e.CreatedAt)
	}
	return args
}

// unnestArgs passes each column as a PostgreSQL array literal ({"a","b"}) in a text parameter, which
// every PostgreSQL driver accepts. Creation times go as text with microseconds, truncated as pgx
// truncates a time.Time: the events of one transaction's statements each keep their own.
func unnestArgs(events []Event) []any {
	var cols [7][]byte
	for c := range cols {
		cols[c] = append(make([]byte, 0, 2+len(events)*40), '{')
	}
	for i := range events {
		e := &events[i]
		sep := i > 0
		cols[0] = appendArrayElem(cols[0], e.MessageID, sep)
		cols[1] = appendArrayElem(cols[1], e.Type, sep)
		cols[2] = appendArrayElem(cols[2], e.AggregateType, sep)
		cols[3] = appendArrayElem(cols[3], e.AggregateID, sep)
		cols[4] = appendArrayElem(cols[4], e.Payload, sep)
		if sep {
			cols[5] = append(cols[5], ',')
			cols[6] = append(cols[6], ',')
		}
		if e.Headers == nil {
			cols[5] = append(cols[5], "NULL"...)
		} else {
			cols[5] = appendArrayElem(cols[5], *e.Headers, false)
		}
		cols[6] = e.CreatedAt.UTC().AppendFormat(cols[6], "2006-01-02 15:04:05.999999Z07:00")
	}
	args := make([]any, 0, len(cols))
	for c := range cols {
		args = append(args, string(append(cols[c], '}')))
	}
	return args
}

// appendArrayElem writes s as a double-quoted element of an array literal: backslash escapes
// backslashes and double quotes, and nothing else needs it inside the quotes.
func appendArrayElem(b []byte, s string, sep bool) []byte {
	if sep {
		b = append(b, ',')
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// cachedSQL returns the statement text for shape, building it once.
func (p *Inserter) cachedSQL(shape insertShape, build func() string) string {
	p.sqlMu.RLock()
	query, ok := p.sqlCache[shape]
	p.sqlMu.RUnlock()
	if ok {
		return query
	}
	query = build()
	p.sqlMu.Lock()
	if p.sqlCache == nil {
		p.sqlCache = make(map[insertShape]string)
	}
	if len(p.sqlCache) < 256 {
		p.sqlCache[shape] = query
	}
	p.sqlMu.Unlock()
	return query
}

// insertHead writes INSERT INTO <table> (<columns>), preceded with notify by a CTE
// n AS MATERIALIZED (SELECT pg_notify(...)) on the channel named after the table, with an empty
// payload. The notification rides in the INSERT itself, so it costs no round trip; the CTE is
// materialised so that it runs once per statement, and PostgreSQL folds the identical notifications
// of one transaction into one, delivered at commit (none on rollback). The table name is a validated
// identifier, safe to write as a literal.
func (p *Inserter) insertHead(stmt *gorm.Statement, notify bool) *strings.Builder {
	b := new(strings.Builder)
	if notify {
		b.WriteString("WITH n AS MATERIALIZED (SELECT pg_notify('")
		b.WriteString(p.Table)
		b.WriteString("', '')) ")
	}
	b.WriteString("INSERT INTO ")
	b.WriteString(stmt.Quote(p.Table))
	b.WriteString(" (")
	for i, c := range insertColumns {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(stmt.Quote(c))
	}
	b.WriteString(") ")
	return b
}

// unnestSQL is INSERT INTO t (...) SELECT m, t, a, i, p::json, h::json, c FROM unnest($1::text[],
// ..., $6::text[], $7::timestamptz[]) [, n].
func (p *Inserter) unnestSQL(db *gorm.DB, notify bool) string {
	return p.cachedSQL(insertShape{dialect: db.Dialector.Name(), rows: -1, notify: notify}, func() string {
		stmt := &gorm.Statement{DB: db}
		var from strings.Builder
		from.WriteString(" FROM unnest(")
		for c := 0; c < 7; c++ {
			if c > 0 {
				from.WriteByte(',')
			}
			stmt.Vars = append(stmt.Vars, nil)
			db.Dialector.BindVarTo(&from, stmt, nil)
			if c < 6 {
				from.WriteString("::text[]")
			} else {
				from.WriteString("::timestamptz[]")
			}
		}
		from.WriteString(") AS u(m,t,a,i,p,h,c)")
		if notify {
			from.WriteString(", n")
		}
		b := p.insertHead(stmt, notify)
		b.WriteString("SELECT m,t,a,i,p::json,h::json,c")
		b.WriteString(from.String())
		return b.String()
	})
}

func delayedArgs(events []Event) []any {
	args := make([]any, 0, len(events)*(len(insertColumns)+1))
	for i := range events {
		e := &events[i]
		var headers any
		if e.Headers != nil {
			headers = *e.Headers
		}
		args = append(args, e.MessageID, e.Type, e.AggregateType, e.AggregateID, e.Payload, headers, e.CreatedAt,
			e.DeliverAt.UTC().Truncate(time.Microsecond))
	}
	return args
}

// delayedSQL is INSERT INTO t (..., next_attempt_at) VALUES (...), ... for n delayed events: the
// claim takes a row whose next_attempt_at has come as a due one, and leaves it alone before, so a
// delayed event lies past the end of the claim index's due run until its time (see OutboxEvent).
func (p *Inserter) delayedSQL(db *gorm.DB, n int) string {
	return p.cachedSQL(insertShape{dialect: db.Dialector.Name(), rows: n, delayed: true}, func() string {
		stmt := &gorm.Statement{DB: db}
		pg := db.Dialector.Name() == "postgres"
		b := p.insertHead(stmt, false)
		// insertHead closed the column list after created_at: reopen it for next_attempt_at.
		head := strings.TrimSuffix(b.String(), ") ")
		b.Reset()
		b.WriteString(head + "," + stmt.Quote("next_attempt_at") + ") VALUES ")
		for r := 0; r < n; r++ {
			if r > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('(')
			for c := 0; c <= len(insertColumns); c++ {
				if c > 0 {
					b.WriteByte(',')
				}
				stmt.Vars = append(stmt.Vars, nil)
				db.Dialector.BindVarTo(b, stmt, nil)
				if pg {
					if c < len(insertColumns) {
						b.WriteString(pgValueCasts[c])
					} else {
						b.WriteString("::timestamptz")
					}
				}
			}
			b.WriteByte(')')
		}
		return b.String()
	})
}

// pgValueCasts type the values of a VALUES list on PostgreSQL, which cannot infer them from the target
// columns when the list is a FROM item (with notify). json is assigned to a json or a jsonb column alike.
var pgValueCasts = [...]string{"::text", "::text", "::text", "::text", "::json", "::json", "::timestamptz"}

// valuesSQL is INSERT INTO t (...) VALUES (...), ... for n rows, in the bind-variable syntax of db's
// dialect; with notify, INSERT INTO t (...) SELECT v.* FROM (VALUES ...) v, n. The text is cached per
// dialect and row count: drivers that cache prepared statements by text (pgx) then reuse the
// server-side plan.
func (p *Inserter) valuesSQL(db *gorm.DB, n int, notify bool) string {
	return p.cachedSQL(insertShape{dialect: db.Dialector.Name(), rows: n, notify: notify}, func() string {
		stmt := &gorm.Statement{DB: db}
		// On PostgreSQL the values are typed even where the target columns would type them: a
		// column of another type (a table migrated by hand) then fails naming the column ("column
		// \"payload\" is of type integer but expression is of type json").
		pg := db.Dialector.Name() == "postgres"
		b := p.insertHead(stmt, notify)
		if notify {
			b.WriteString("SELECT v.* FROM (")
		}
		b.WriteString("VALUES ")
		for r := 0; r < n; r++ {
			if r > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('(')
			for c := range insertColumns {
				if c > 0 {
					b.WriteByte(',')
				}
				stmt.Vars = append(stmt.Vars, nil)
				db.Dialector.BindVarTo(b, stmt, nil)
				if pg {
					b.WriteString(pgValueCasts[c])
				}
			}
			b.WriteByte(')')
		}
		if notify {
			b.WriteString(") AS v, n")
		}
		return b.String()
	})
}
