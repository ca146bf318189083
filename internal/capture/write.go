package capture

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// The write stage: the statement as the database runs it. Which rows a write changed is taken from
// the database, never guessed from the model:
//
//   - PostgreSQL and SQLite (3.35+) say it in the write itself: the plugin adds its columns to the
//     statement's RETURNING (the key, the stored row when the payload mode needs it, and for an
//     upsert what tells an inserted row from an updated one), reads the returned rows, and hands GORM
//     the rows or result it would have had without the plugin. MariaDB does the same for DELETE.
//   - MySQL and MariaDB have no RETURNING for UPDATE (and MySQL none at all), and report only a total
//     of affected rows: an UPDATE or DELETE by condition first locks and reads the rows it matches,
//     then runs on exactly those keys; an upsert is classified from the affected-row count when it has
//     one row, and from the rows of its unique keys, locked and read before and after, when it has
//     several.
//
// writeStrategy names these ways; plan* picks one per statement before GORM runs it, and the write
// settles the details when it runs, once GORM has built the final clauses.
type writeStrategy int

const (
	// plainWrite: GORM's statement as it is. The rows are known without asking: the model values of
	// a plain create (GORM reads generated keys back), or the one model value of an update or delete
	// whose whole key is in its WHERE. The write only records the SET clause, which GORM drops after
	// building the statement.
	plainWrite writeStrategy = iota + 1
	// returningWrite: RETURNING the plugin's columns.
	returningWrite
	// mysqlUpsert: INSERT … ON DUPLICATE KEY UPDATE or INSERT IGNORE on MySQL/MariaDB.
	mysqlUpsert
	// lockedWrite: SELECT … FOR UPDATE with the write's condition, then the write on those keys.
	lockedWrite
)

// write stands in for the statement's connection while GORM executes it. The first Exec or Query
// GORM sends through it is the write; anything after goes straight to the connection.
type write struct {
	gorm.ConnPool
	p        *Capturer
	db       *gorm.DB
	st       *statementState
	strategy writeStrategy
	stored   bool // read the stored row (PayloadRow, PayloadChanges)

	fired bool

	// What the statement is, from the clauses GORM built.
	ins  *insertClauses
	set  clause.Set
	soft bool // a soft delete: the delete chain runs an UPDATE

	info *tableInfo

	// Before the write.
	maxRowid sql.NullInt64   // SQLite upsert: the highest rowid
	existing map[string]bool // SQLite upsert: which supplied keys (or rowids) already existed
	pre      []readRow       // rows read (and locked) before the write
	many     bool            // mysqlUpsert with several rows
	viaQuery bool            // GORM ran the write as a query (RETURNING) and scanned its rows

	// compact: the rows of an update or delete in key payloads are known by their keys alone, held
	// in keys (and a locked read's values of the assigned columns in extras) instead of returned and
	// pre (rowstore.go).
	compact bool
	keys    keyList
	extras  valueList

	// The write.
	returned    []returnedRow
	affected    int64
	hasAffected bool // affected holds the database's count (not the rows GORM scanned)
	lastID      int64
	one         *upsertOne
}

// returnedRow is one row of the write's RETURNING, as the plugin asked for it.
type returnedRow struct {
	readRow
	inserted bool  // PostgreSQL upsert: xmax = 0
	rowid    int64 // SQLite: the rowid
	op       Op
}

// insertClauses are the clauses of an INSERT as GORM built it.
type insertClauses struct {
	columns   []string
	values    [][]any
	conflict  bool     // ON CONFLICT / ON DUPLICATE KEY UPDATE
	doUpdates []string // columns an existing row gets assigned; none: a conflict skips the row
	modifier  modifierKind
}

type modifierKind int

const (
	modifierNone modifierKind = iota
	modifierIgnore
	modifierReplace
)

// upserts reports whether the insert can update existing rows.
func (s *insertClauses) upserts() bool { return s.conflict && len(s.doUpdates) > 0 }

// parseModifier reads clause.Insert's Modifier. A modifier whose effect on the written rows is
// unknown is refused rather than captured by a guess.
func parseModifier(mod string) (modifierKind, error) {
	kind := modifierNone
	for _, word := range strings.Fields(strings.ToUpper(mod)) {
		switch word {
		case "IGNORE":
			kind = modifierIgnore
		case "REPLACE":
			kind = modifierReplace
		case "OR", "ABORT", "ROLLBACK", "LOW_PRIORITY", "HIGH_PRIORITY", "DELAYED":
		case "FAIL":
			// SQLite's OR FAIL keeps the rows written before the failing one, and the statement
			// fails: no RETURNING says which they were.
			return 0, fmt.Errorf("%w: INSERT %s leaves the rows before a failing one written and reports none of them; use OR ABORT (the default) or ON CONFLICT", ErrUnsupportedWrite, mod)
		default:
			return 0, fmt.Errorf("%w: INSERT modifier %q", ErrUnsupportedWrite, mod)
		}
	}
	return kind, nil
}

func readInsertClauses(stmt *gorm.Statement) *insertClauses {
	s := &insertClauses{}
	if c, ok := stmt.Clauses["VALUES"]; ok {
		if v, ok := c.Expression.(clause.Values); ok {
			s.columns = make([]string, len(v.Columns))
			for i, col := range v.Columns {
				s.columns[i] = col.Name
			}
			s.values = v.Values
		}
	}
	if c, ok := stmt.Clauses["ON CONFLICT"]; ok {
		if oc, ok := c.Expression.(clause.OnConflict); ok {
			s.conflict = true
			if !oc.DoNothing {
				s.doUpdates = assignedColumns(oc.DoUpdates)
			}
		}
	}
	if c, ok := stmt.Clauses["INSERT"]; ok {
		if in, ok := c.Expression.(clause.Insert); ok {
			s.modifier, _ = parseModifier(in.Modifier) // refused ones were refused at plan time
		}
	}
	return s
}

// supplied reports whether an INSERT value is a value of the row's own, as opposed to SQL standing in
// for one (DEFAULT, an expression) or NULL, which never conflicts.
func supplied(v any) bool {
	switch v.(type) {
	case clause.Expression, *gorm.DB:
		return false
	}
	return plainValue(v) != nil
}

// tuple returns the values row gives the named columns, or false when it does not supply them all.
func (s *insertClauses) tuple(row int, names []string) ([]any, bool) {
	out := make([]any, len(names))
	for i, name := range names {
		j := indexOf(s.columns, name)
		if j < 0 || !supplied(s.values[row][j]) {
			return nil, false
		}
		out[i] = s.values[row][j]
	}
	return out, true
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

func fieldNames(fields []*schema.Field) []string {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.DBName
	}
	return names
}

// returns reports whether the statement's dialect takes RETURNING on the statement being built.
func returns(stmt *gorm.Statement) bool { return contains(stmt.BuildClauses, "RETURNING") }

func (p *Capturer) newWrite(db *gorm.DB, st *statementState, strategy writeStrategy) *write {
	return &write{p: p, db: db, st: st, strategy: strategy, stored: p.cfg.Payload != PayloadKey}
}

// planCreate picks how the rows of a create will be known; nil: from the model values GORM fills in.
func (p *Capturer) planCreate(db *gorm.DB, st *statementState) *write {
	stmt := db.Statement
	_, conflict := stmt.Clauses["ON CONFLICT"]
	modifier := modifierNone
	if c, ok := stmt.Clauses["INSERT"]; ok {
		if in, ok := c.Expression.(clause.Insert); ok {
			kind, err := parseModifier(in.Modifier)
			if err != nil {
				db.AddError(fmt.Errorf("outboxplugin: create %s: %w", st.schema.Name, err))
				return nil
			}
			modifier = kind
		}
	}
	stored := p.cfg.Payload != PayloadKey
	switch db.Dialector.Name() {
	case "postgres":
		// A Table(...) create of a map has no model for GORM to read the generated key into.
		if conflict || modifier != modifierNone || stored || stmt.Schema == nil {
			return p.newWrite(db, st, returningWrite)
		}
	case "sqlite":
		if !returns(stmt) {
			if conflict || modifier != modifierNone {
				db.AddError(fmt.Errorf("outboxplugin: create %s: %w: upserts and INSERT OR … need SQLite 3.35 or later (RETURNING)", st.schema.Name, ErrUnsupportedWrite))
			}
			return nil // stored rows are read back by key after the write
		}
		if conflict || modifier != modifierNone || stored {
			return p.newWrite(db, st, returningWrite)
		}
	case "mysql":
		if conflict || modifier == modifierIgnore {
			return p.newWrite(db, st, mysqlUpsert)
		}
	default:
		if conflict || modifier != modifierNone {
			db.AddError(fmt.Errorf("outboxplugin: create %s: %w: upserts and INSERT modifiers are captured on PostgreSQL, MySQL, MariaDB and SQLite, not on %s", st.schema.Name, ErrUnsupportedWrite, db.Dialector.Name()))
		}
	}
	return nil
}

// planWrite picks how the rows of an update or delete will be known; nil: the statement targets one
// model value (st.single) and GORM's count of affected rows says whether it was written.
func (p *Capturer) planWrite(db *gorm.DB, st *statementState) *write {
	stored := p.cfg.Payload != PayloadKey
	if st.single && !stored {
		if st.op == OpUpdate && p.wantsChangeset(st.schema) {
			return p.newWrite(db, st, plainWrite) // to keep the SET clause for the Changeset
		}
		return nil
	}
	stmt := db.Statement
	if p.LockedWrites {
		return p.newWrite(db, st, lockedWrite)
	}
	switch db.Dialector.Name() {
	case "postgres":
		return p.newWrite(db, st, returningWrite)
	case "sqlite":
		if returns(stmt) {
			return p.newWrite(db, st, returningWrite)
		}
	case "mysql":
		// MariaDB (10.5+, unless the dialector was told DisableWithReturning) has DELETE … RETURNING;
		// a soft delete is an UPDATE, which it has not: the write switches when it sees one.
		if st.op == OpDelete && returns(stmt) {
			return p.newWrite(db, st, returningWrite)
		}
	}
	return p.newWrite(db, st, lockedWrite)
}

func (w *write) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if w.fired {
		return w.ConnPool.ExecContext(ctx, query, args...)
	}
	w.fired = true
	res, _, err := w.run(ctx, query, args, false)
	return res, err
}

func (w *write) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if w.fired {
		return w.ConnPool.QueryContext(ctx, query, args...)
	}
	w.fired = true
	_, rows, err := w.run(ctx, query, args, true)
	return rows, err
}

// Commit and Rollback keep the write a transaction in the eyes of code that checks for one
// (gorm.TxCommitter), such as read/write splitting plugins.
// StoodFor is the statement's own connection, which the write stands in for (capture.StandIn).
func (w *write) StoodFor() gorm.ConnPool { return w.ConnPool }

func (w *write) Commit() error {
	if c, ok := w.ConnPool.(gorm.TxCommitter); ok {
		return c.Commit()
	}
	return gorm.ErrInvalidTransaction
}

func (w *write) Rollback() error {
	if c, ok := w.ConnPool.(gorm.TxCommitter); ok {
		return c.Rollback()
	}
	return gorm.ErrInvalidTransaction
}

// run executes the write GORM sends (as a query when it expects rows back) and returns what GORM
// would have had without the plugin.
func (w *write) run(ctx context.Context, query string, args []any, isQuery bool) (sql.Result, *sql.Rows, error) {
	stmt := w.db.Statement
	if c, ok := stmt.Clauses["SET"]; ok {
		w.set, _ = c.Expression.(clause.Set)
	}
	if w.st.op == OpCreate {
		w.ins = readInsertClauses(stmt)
	} else if w.st.op == OpDelete {
		w.soft = strings.HasPrefix(strings.TrimSpace(query), "UPDATE")
		if w.soft && w.strategy == returningWrite && w.db.Dialector.Name() == "mysql" {
			w.strategy = lockedWrite
		}
	}
	// The key is all an update or delete's event needs of a row in key payloads (a customizer gets
	// the model value GORM holds, found by key).
	w.compact = w.ins == nil && !w.stored && w.st.hasPK
	if w.compact {
		w.keys = newKeyList(w.st.fields)
	}
	var (
		res  sql.Result
		rows *sql.Rows
		err  error
	)
	if w.strategy == lockedWrite && isQuery && returns(stmt) {
		// The application's own RETURNING: the rows come back with it.
		w.strategy = returningWrite
	}
	switch w.strategy {
	case returningWrite:
		res, rows, err = w.runReturning(ctx, query, args, isQuery)
	case mysqlUpsert:
		res, rows, err = w.runMySQLUpsert(ctx, query, args, isQuery)
	case lockedWrite:
		res, err = w.runLocked(ctx, query, args, isQuery)
	default:
		if isQuery {
			rows, err = w.ConnPool.QueryContext(ctx, query, args...)
		} else {
			res, err = w.ConnPool.ExecContext(ctx, query, args...)
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return res, rows, nil
}

// setSQL makes GORM log the statement that actually ran.
func (w *write) setSQL(query string, vars []any) {
	stmt := w.db.Statement
	stmt.SQL.Reset()
	stmt.SQL.WriteString(query)
	if vars != nil {
		stmt.Vars = vars
	}
}

// readFields are the fields the write reads of each row: the key, or the whole model when the
// payload needs the stored row.
func (w *write) readFields() []*schema.Field {
	if w.stored {
		return modelColumns(w.st.schema)
	}
	return w.st.fields
}

// writeResult is the sql.Result of a write the plugin ran as a query.
type writeResult struct {
	rows      int64
	lastID    int64
	lastIDErr error
}

func (r writeResult) RowsAffected() (int64, error) { return r.rows, nil }
func (r writeResult) LastInsertId() (int64, error) { return r.lastID, r.lastIDErr }

// errNoLastInsertID is what pgx answers; GORM ignores it on PostgreSQL, which has RETURNING.
var errNoLastInsertID = errors.New("LastInsertId is not supported by this driver")

// runReturning runs the write with the plugin's RETURNING columns: the read fields, then on
// PostgreSQL for an upsert (xmax = 0) — true for a row the statement inserted, false for one it
// updated (the new version of an updated row carries the updater's lock in xmax) — and on SQLite the
// rowid.
func (w *write) runReturning(ctx context.Context, query string, args []any, isQuery bool) (sql.Result, *sql.Rows, error) {
	db, stmt := w.db, w.db.Statement
	dialect := db.Dialector.Name()
	if err := w.beforeReturning(ctx); err != nil {
		return nil, nil, err
	}
	fields := w.readFields()
	var b strings.Builder
	b.WriteString(query)
	// GORM asked for rows back: its RETURNING ends the statement, and the plugin's columns follow
	// it. (GORM can ask for rows of a statement it built without RETURNING, and then gets none: a
	// soft delete built before GORM 1.31 did that.)
	gormReturns := isQuery && strings.HasSuffix(query, w.returningSuffix())
	if gormReturns {
		b.WriteString(", ")
	} else {
		b.WriteString(" RETURNING ")
	}
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		if dialect == "mysql" {
			b.WriteString(stmt.Quote(f.DBName)) // MariaDB's RETURNING takes no table prefix
		} else {
			b.WriteString(stmt.Quote(clause.Column{Table: clause.CurrentTable, Name: f.DBName}))
		}
	}
	flags := 0
	xmax := dialect == "postgres" && w.ins != nil && w.ins.upserts()
	rowid := dialect == "sqlite" && w.ins != nil && w.info != nil && w.info.hasRowid
	if xmax {
		b.WriteString(",(xmax = 0)")
		flags++
	}
	if rowid {
		b.WriteString(",rowid")
		flags++
	}
	q := b.String()
	w.setSQL(q, nil)
	rows, err := w.ConnPool.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	buf, err := w.readReturned(rows, fields, flags, xmax, rowid, gormReturns)
	if err != nil {
		return nil, nil, err
	}
	written := int64(len(w.returned)) // the rows REPLACE deleted, added below, are not counted by SQLite
	if w.compact {
		written = int64(w.keys.len())
	}
	if err := w.classifyReturned(ctx); err != nil {
		return nil, nil, err
	}
	if isQuery {
		if !gormReturns {
			buf = &bufferedRows{}
		}
		replayed, err := replay(ctx, buf)
		return nil, replayed, err
	}
	res := writeResult{rows: written}
	switch dialect {
	case "postgres":
		res.lastIDErr = errNoLastInsertID
	case "sqlite":
		// What the driver would have said: the rowid of the last row inserted.
		if i := w.lastInserted(); i >= 0 {
			res.lastID = w.returned[i].rowid
		}
	}
	return res, nil, nil
}

func (w *write) readReturned(rows *sql.Rows, fields []*schema.Field, flags int, xmax, rowid, gormReturns bool) (buf *bufferedRows, err error) {
	defer func() { err = errors.Join(err, rows.Close()) }()
	ctx := w.db.Statement.Context
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	n := len(cols) - len(fields) - flags
	if n < 0 || (!gormReturns && n != 0) {
		return nil, fmt.Errorf("outboxplugin: RETURNING gave %d columns, %d expected", len(cols), len(fields)+flags)
	}
	buf = &bufferedRows{columns: cols[:n]}
	if n > 0 {
		types, err := rows.ColumnTypes()
		if err != nil {
			return nil, err
		}
		buf.types = types[:n]
	}
	for rows.Next() {
		values := make([]any, n)
		before := make([]any, n)
		for i := range before {
			before[i] = &values[i]
		}
		var r returnedRow
		var after []any
		if xmax {
			after = append(after, &r.inserted)
		}
		if rowid {
			after = append(after, &r.rowid)
		}
		r.readRow, err = scanModelRow(ctx, rows, w.st.schema, fields, before, after)
		if err != nil {
			return nil, err
		}
		if w.compact {
			key, _ := w.key(r.readRow)
			w.keys.add(key)
		} else {
			w.returned = append(w.returned, r)
		}
		if n > 0 {
			buf.values = append(buf.values, values)
		}
	}
	return buf, rows.Err()
}

// beforeReturning reads, under the write lock, what SQLite needs to classify an upsert or an INSERT OR
// REPLACE: SQLite's RETURNING lists the rows an upsert inserted and those it updated alike. SQLite
// allows one writer at a time, and a transaction that has read cannot take the write lock once
// another has written since: the plugin takes the lock first, with a write that changes nothing, so
// that its read cannot fail the write with SQLITE_BUSY where the write alone would have waited.
func (w *write) beforeReturning(ctx context.Context) error {
	if w.ins == nil || w.db.Dialector.Name() != "sqlite" {
		return nil
	}
	db, stmt := w.db, w.db.Statement
	info, err := w.p.tableInfos.get(db, w.ConnPool, ctx, stmt.Table)
	if err != nil {
		return err
	}
	w.info = info
	if !w.ins.upserts() && w.ins.modifier != modifierReplace {
		return nil // every returned row was inserted
	}
	if w.ins.modifier == modifierReplace && info.expressionKey != "" {
		return fmt.Errorf("%w: INSERT OR REPLACE into %s, whose unique index %s is on an expression: the rows it replaces cannot be found", ErrUnsupportedWrite, stmt.Table, info.expressionKey)
	}
	if _, err := tracedExec(db, w.ConnPool, ctx, `DELETE FROM `+stmt.Quote(stmt.Table)+` WHERE 0`); err != nil {
		return err
	}
	if w.ins.modifier == modifierReplace {
		w.pre, err = w.readConflicting(ctx, false)
		return err
	}
	w.existing = map[string]bool{}
	if info.hasRowid {
		row := w.ConnPool.QueryRowContext(ctx, `SELECT max(rowid) FROM `+stmt.Quote(stmt.Table))
		if err := row.Scan(&w.maxRowid); err != nil {
			return err
		}
		if w.maxRowid.Valid && w.maxRowid.Int64 == math.MaxInt64 {
			// SQLite then picks rowids at random, below the highest one.
			return fmt.Errorf("%w: upsert into %s, whose highest rowid is the largest there is", ErrUnsupportedWrite, stmt.Table)
		}
		if !info.rowidKey {
			return nil // a new row's rowid is above every existing one
		}
	}
	// Supplied keys that already exist: an explicit rowid key below the highest one, or the key of a
	// table WITHOUT ROWID.
	var keys [][]any
	names := fieldNames(w.st.fields)
	for i := range w.ins.values {
		if k, ok := w.ins.tuple(i, names); ok {
			keys = append(keys, k)
		}
	}
	found, err := readByKeys(db, w.ConnPool, stmt, w.st.schema, w.st.fields, keys, w.st.fields, nil, false)
	for _, r := range found {
		_, ks := w.key(r)
		w.existing[ks] = true
	}
	return err
}

// readConflicting reads the rows that the statement's rows may conflict with: for each unique key of
// the table, the rows holding the values an inserted row gives it. lock takes them FOR UPDATE.
func (w *write) readConflicting(ctx context.Context, lock bool) ([]readRow, error) {
	db, stmt := w.db, w.db.Statement
	var out []readRow
	seen := map[string]bool{}
	for _, names := range w.info.uniqueKeys {
		var tuples [][]any
		for i := range w.ins.values {
			if t, ok := w.ins.tuple(i, names); ok {
				tuples = append(tuples, t)
			}
		}
		for start := 0; start < len(tuples); start += maxKeysPerRead {
			part := tuples[start:min(start+maxKeysPerRead, len(tuples))]
			rows, err := readWhere(db, w.ConnPool, stmt, w.st.schema, w.readFields(), w.compareColumns(), tupleIn(names, part), lock)
			if err != nil {
				return nil, err
			}
			for _, r := range rows {
				if _, ks := w.key(r); !seen[ks] {
					seen[ks] = true
					out = append(out, r)
				}
			}
		}
	}
	return out, nil
}

// compareColumns are the columns whose values, read before and after, tell an updated row from one
// left as it was: those an upsert's DO UPDATE assigns, or an UPDATE's SET.
func (w *write) compareColumns() []string {
	if w.ins != nil {
		return w.ins.doUpdates
	}
	return assignedColumns(w.set)
}

// upsertOne is what a one-row upsert on MySQL did.
type upsertOne struct {
	written bool
	op      Op
	keys    []any
}

// runMySQLUpsert runs an INSERT … ON DUPLICATE KEY UPDATE or INSERT IGNORE. One row: the database's
// count of affected rows says what happened to it (1 inserted, 2 updated, 0 left as it was or
// ignored), with no lock beyond the write's own. Several rows: the count is a total, so the rows of
// the table's unique keys that the statement's rows hold are locked and read first (and read again
// after, in afterCreate); under REPEATABLE READ the locks cover the gaps too, so no other transaction
// can insert one of those keys in between.
func (w *write) runMySQLUpsert(ctx context.Context, query string, args []any, isQuery bool) (sql.Result, *sql.Rows, error) {
	db, stmt := w.db, w.db.Statement
	info, err := w.p.tableInfos.get(db, w.ConnPool, ctx, stmt.Table)
	if err != nil {
		return nil, nil, err
	}
	w.info = info
	if len(w.ins.values) != 1 {
		w.many = true
		if info.expressionKey != "" {
			return nil, nil, fmt.Errorf("%w: multi-row upsert into %s, whose unique index %s is on an expression: the rows it conflicts with cannot be found", ErrUnsupportedWrite, stmt.Table, info.expressionKey)
		}
		if w.pre, err = w.readConflicting(ctx, true); err != nil {
			return nil, nil, err
		}
		if isQuery {
			w.viaQuery = true
			rows, err := w.ConnPool.QueryContext(ctx, query, args...)
			return nil, rows, err
		}
		res, err := w.ConnPool.ExecContext(ctx, query, args...)
		if err == nil {
			w.affected, _ = res.RowsAffected()
			w.hasAffected = true
		}
		return res, nil, err
	}

	// One row. MariaDB's INSERT … RETURNING reports no count, so the write runs without GORM's
	// RETURNING and GORM gets the returned row from the plugin.
	q := query
	if isQuery {
		if q, err = w.withoutReturning(query); err != nil {
			return nil, nil, err
		}
		w.setSQL(q, nil)
	}
	res, err := w.ConnPool.ExecContext(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	w.affected, _ = res.RowsAffected()
	w.hasAffected = true
	w.lastID, _ = res.LastInsertId()
	if err := w.classifyOne(ctx); err != nil {
		return nil, nil, err
	}
	if !isQuery {
		return res, nil, nil
	}
	rows, err := w.replayReturning(ctx)
	return nil, rows, err
}

// returningSuffix is the text GORM's RETURNING clause ends the statement with (" RETURNING ..."); with
// no RETURNING clause, a text no statement ends with.
func (w *write) returningSuffix() string {
	stmt := w.db.Statement
	c, ok := stmt.Clauses["RETURNING"]
	if !ok {
		return "\x00" // matches no statement's end
	}
	ret := &gorm.Statement{DB: w.db, Table: stmt.Table, TableExpr: stmt.TableExpr, Schema: stmt.Schema,
		Clauses: map[string]clause.Clause{"RETURNING": c}}
	ret.Build("RETURNING")
	return " " + ret.SQL.String()
}

// withoutReturning cuts GORM's RETURNING clause off the end of the statement.
func (w *write) withoutReturning(query string) (string, error) {
	suffix := w.returningSuffix()
	if !strings.HasSuffix(query, suffix) {
		return "", fmt.Errorf("outboxplugin: cannot find %q at the end of the statement", suffix)
	}
	return strings.TrimSuffix(query, suffix), nil
}

// autoKey reports whether the database generates the key of the row: an auto-increment primary key
// the row does not supply.
func (w *write) autoKey(row int) bool {
	pf := w.st.schema.PrioritizedPrimaryField
	if pf == nil || !pf.AutoIncrement || len(w.st.schema.PrimaryFields) != 1 {
		return false
	}
	_, ok := w.ins.tuple(row, []string{pf.DBName})
	return !ok
}

// classifyOne reads what a one-row upsert did from the count of affected rows: 1 inserted, 2
// updated, 0 ignored or left as it was. (With the driver's clientFoundRows, a row left as it was
// counts 1 too; it is told apart from an insert by the absence of a generated key.)
func (w *write) classifyOne(ctx context.Context) error {
	out := &upsertOne{}
	w.one = out
	auto := w.autoKey(0)
	switch {
	case w.affected == 1 && (!auto || w.lastID > 0):
		out.written, out.op = true, OpCreate
		if auto {
			out.keys = []any{w.lastID}
		} else {
			k, ok := w.ins.tuple(0, fieldNames(w.st.fields))
			if !ok {
				return fmt.Errorf("%w: the inserted row's key is neither supplied nor generated", ErrUnsupportedWrite)
			}
			out.keys = k
		}
		return nil
	case w.affected == 2:
		out.written, out.op = true, OpUpdate
	case w.affected == 0 || w.affected == 1:
		if w.ins.modifier == modifierIgnore {
			return nil // ignored
		}
		// Left as it was: no event. Its key is still needed to give GORM the row MariaDB's RETURNING
		// would have returned.
	default:
		return fmt.Errorf("%w: one-row upsert affected %d rows", ErrConcurrentChange, w.affected)
	}
	r, err := w.findConflicting(ctx)
	if err != nil {
		return err
	}
	out.keys, _ = w.key(r)
	return nil
}

// findConflicting finds the existing row a one-row upsert went to: the row holding its primary key
// if it supplies one (InnoDB checks the primary key first), else the one row holding one of its
// unique keys. The write has locked it.
func (w *write) findConflicting(ctx context.Context) (readRow, error) {
	rows, err := w.readConflicting(ctx, true)
	if err != nil {
		return readRow{}, err
	}
	if pk, ok := w.ins.tuple(0, fieldNames(w.st.fields)); ok && w.st.hasPK {
		for _, r := range rows {
			if _, ks := w.key(r); ks == keyString(pk) {
				return r, nil
			}
		}
	}
	if len(rows) != 1 {
		return readRow{}, fmt.Errorf("%w: the upserted row conflicts with %d existing rows of %s; the one it updated cannot be told", ErrUnsupportedWrite, len(rows), w.db.Statement.Table)
	}
	return rows[0], nil
}

// replayReturning gives GORM the row MariaDB's INSERT … RETURNING would have returned: the row
// written or left as it was (none for an ignored one), with the columns GORM asked for.
func (w *write) replayReturning(ctx context.Context) (*sql.Rows, error) {
	db, stmt := w.db, w.db.Statement
	ret, _ := stmt.Clauses["RETURNING"].Expression.(clause.Returning)
	names := make([]string, len(ret.Columns))
	for i, c := range ret.Columns {
		names[i] = c.Name
	}
	buf := &bufferedRows{columns: names}
	if w.one.keys == nil {
		return replay(ctx, buf)
	}
	sel := readStmt(db, stmt, w.st.schema)
	sel.AddClause(clause.Select{Columns: rawColumns(names)})
	sel.AddClause(clause.From{})
	sel.AddClause(clause.Where{Exprs: []clause.Expression{keyIn(w.st.fields, [][]any{w.one.keys})}})
	sel.Build("SELECT", "FROM", "WHERE")
	q := sel.SQL.String()
	rows, err := tracedQuery(db, w.ConnPool, ctx, q, sel.Vars...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if buf.types, err = rows.ColumnTypes(); err != nil {
		return nil, err
	}
	for rows.Next() {
		values := make([]any, len(names))
		dests := make([]any, len(names))
		for i := range dests {
			dests[i] = &values[i]
		}
		if err := rows.Scan(dests...); err != nil {
			return nil, err
		}
		buf.values = append(buf.values, values)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return replay(ctx, buf)
}

// runLocked runs an UPDATE or DELETE on MySQL/MariaDB (or SQLite without RETURNING) as a locking read
// of the rows it matches — its own table expression, WHERE, ORDER BY and LIMIT, FOR UPDATE — and then
// the write on exactly those keys. Reading the same WHERE twice could match different rows (rows
// committed in between under READ COMMITTED, a time-based condition, ties under ORDER BY … LIMIT);
// writing by the keys read cannot. The write keeps its own WHERE as well when its table expression is
// a join (the WHERE may tie the tables together), and loses ORDER BY and LIMIT, which the keys already
// decided.
func (w *write) runLocked(ctx context.Context, query string, args []any, isQuery bool) (sql.Result, error) {
	db, stmt := w.db, w.db.Statement
	if isQuery {
		return nil, fmt.Errorf("%w: %s … RETURNING on %s", ErrUnsupportedWrite, stmtVerb(w), db.Dialector.Name())
	}
	if db.Dialector.Name() == "sqlite" {
		// Without FOR UPDATE, the write lock taken first keeps the rows read as they are.
		if _, err := tracedExec(db, w.ConnPool, ctx, `DELETE FROM `+stmt.Quote(stmt.Table)+` WHERE 0`); err != nil {
			return nil, err
		}
	}
	built := stmt.BuildClauses
	if w.soft {
		built = db.Callback().Update().Clauses // GORM's soft delete builds an UPDATE as the update chain does
	}
	fields := w.st.fields
	if w.stored && w.st.op == OpDelete && !w.soft {
		fields = modelColumns(w.st.schema) // the row as it was, before it is gone
	}
	err := readLocked(db, w.ConnPool, stmt, w.st.schema, fields, w.compareColumns(), built, func(r readRow) error {
		if w.compact {
			key, _ := w.key(r)
			w.keys.add(key)
			w.extras.add(r.extra)
		} else {
			w.pre = append(w.pre, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outboxplugin: read the rows to %s: %w", stmtVerb(w), err)
	}
	locked := w.lockedCount()
	if locked == 0 {
		return writeResult{}, nil
	}
	if !w.st.hasPK {
		// A model without a primary key is identified by all its columns, and a row with a NULL
		// column cannot be matched by value: the write runs as GORM built it, on the rows locked.
		res, err := w.ConnPool.ExecContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		w.affected, _ = res.RowsAffected()
		w.hasAffected = true
		return res, nil
	}
	// A write that joins other tables keeps its WHERE, which may tie the tables together.
	var where []clause.Expression
	joined := joins(stmt, built)
	if joined {
		if c, ok := stmt.Clauses["WHERE"]; ok {
			if wc, ok := c.Expression.(clause.Where); ok {
				where = wc.Exprs
			}
		}
	}
	var total int64
	var last sql.Result
	for start := 0; start < locked; start += maxKeysPerRead {
		part := w.lockedKeys(start, min(start+maxKeysPerRead, locked))
		wr := readStmt(db, stmt, stmt.Schema)
		wr.Clauses["WHERE"] = clause.Clause{Name: "WHERE", Expression: clause.Where{Exprs: append([]clause.Expression{keyInLiteral(w.st.fields, part)}, where...)}}
		if w.st.op == OpUpdate || w.soft {
			wr.Clauses["UPDATE"] = clauseOr(stmt, "UPDATE", clause.Update{})
			wr.Clauses["SET"] = stmt.Clauses["SET"]
			if c, ok := stmt.Clauses["FROM"]; ok && joined && contains(built, "FROM") {
				wr.Clauses["FROM"] = c // UPDATE … FROM
				wr.Build("UPDATE", "SET", "FROM", "WHERE")
			} else {
				wr.Build("UPDATE", "SET", "WHERE")
			}
		} else {
			wr.Clauses["DELETE"] = clauseOr(stmt, "DELETE", clause.Delete{})
			wr.Clauses["FROM"] = clauseOr(stmt, "FROM", clause.From{})
			wr.Build("DELETE", "FROM", "WHERE")
		}
		q := wr.SQL.String()
		var res sql.Result
		if start == 0 {
			w.setSQL(q, wr.Vars) // GORM logs the first as the statement that ran
			res, err = w.ConnPool.ExecContext(ctx, q, wr.Vars...)
		} else {
			res, err = tracedExec(db, w.ConnPool, ctx, q, wr.Vars...)
		}
		if err != nil {
			return nil, err
		}
		n, _ := res.RowsAffected()
		total += n
		last = res
	}
	w.affected, w.hasAffected = total, true
	r := writeResult{rows: total}
	r.lastID, r.lastIDErr = last.LastInsertId()
	return r, nil
}

// lockedCount is the number of rows a locked write locked.
func (w *write) lockedCount() int {
	if w.compact {
		return w.keys.len()
	}
	return len(w.pre)
}

// lockedKeys are the keys of the locked rows start to end.
func (w *write) lockedKeys(start, end int) [][]any {
	if w.compact {
		return w.keys.chunk(start, end)
	}
	keys := make([][]any, 0, end-start)
	for _, r := range w.pre[start:end] {
		k, _ := w.key(r)
		keys = append(keys, k)
	}
	return keys
}

func clauseOr(stmt *gorm.Statement, name string, def clause.Expression) clause.Clause {
	if c, ok := stmt.Clauses[name]; ok {
		return c
	}
	return clause.Clause{Name: name, Expression: def}
}

func stmtVerb(w *write) string {
	if w.st.op == OpDelete && !w.soft {
		return "delete"
	}
	return "update"
}
