package capture

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// The reads the capture makes besides the write itself, all on the write's connection (its
// transaction): rows by key, rows by the write's own condition under a lock, rows by the values of a
// unique key, and what a table's unique keys are. Each read is traced through the GORM logger like
// GORM's own statements.

// maxKeysPerRead bounds the keys of one IN list, under every database's bind-parameter limit (65535
// on PostgreSQL and MySQL, 32766 on SQLite) even for composite keys of several columns.
const maxKeysPerRead = 1000

// readStmt returns an empty SELECT statement on src's table (its TableExpr too: an alias or a join).
func readStmt(db *gorm.DB, src *gorm.Statement, s *schema.Schema) *gorm.Statement {
	return &gorm.Statement{
		DB: db, Context: src.Context, Table: src.Table, TableExpr: src.TableExpr, Schema: s,
		Clauses: map[string]clause.Clause{},
	}
}

// columnsOf qualifies the fields' columns with the statement's table (its alias when it has one), so
// that a join cannot make them ambiguous.
func columnsOf(fields []*schema.Field) []clause.Column {
	cols := make([]clause.Column, len(fields))
	for i, f := range fields {
		cols[i] = clause.Column{Table: clause.CurrentTable, Name: f.DBName}
	}
	return cols
}

func rawColumns(names []string) []clause.Column {
	cols := make([]clause.Column, len(names))
	for i, n := range names {
		cols[i] = clause.Column{Table: clause.CurrentTable, Name: n}
	}
	return cols
}

// keyIn is the condition (k1, k2) IN ((...), (...)) on the identity columns.
func keyIn(fields []*schema.Field, keys [][]any) clause.Expression {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.DBName
	}
	return tupleIn(names, keys)
}

// keyInLiteral is keyIn with integer keys written into the SQL as literals. On MySQL a statement with
// bind variables is prepared on the server, and a hundred of them cost more than the lookups they
// stand for (an UPDATE of 100 rows by key: 2.43 ms with 100 placeholders, 2.10 ms with literals, 2.16 ms
// by an indexed condition, measured here). Literals are only ever integers formatted by strconv; any
// other key goes through bind variables.
func keyInLiteral(fields []*schema.Field, keys [][]any) clause.Expression {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		if len(fields) > 1 {
			b.WriteByte('(')
		}
		for j, v := range k {
			if j > 0 {
				b.WriteByte(',')
			}
			rv := reflect.Indirect(reflect.ValueOf(v))
			switch rv.Kind() {
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
				b.WriteString(strconv.FormatInt(rv.Int(), 10))
			case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
				b.WriteString(strconv.FormatUint(rv.Uint(), 10))
			default:
				return keyIn(fields, keys)
			}
		}
		if len(fields) > 1 {
			b.WriteByte(')')
		}
	}
	cols := make([]any, len(fields))
	marks := make([]string, len(fields))
	for i, f := range fields {
		cols[i] = clause.Column{Table: clause.CurrentTable, Name: f.DBName}
		marks[i] = "?"
	}
	target := strings.Join(marks, ",")
	if len(fields) > 1 {
		target = "(" + target + ")"
	}
	return clause.Expr{SQL: target + " IN (" + b.String() + ")", Vars: cols}
}

func tupleIn(names []string, tuples [][]any) clause.Expression {
	column, values := schema.ToQueryValues(clause.CurrentTable, names, tuples)
	return clause.IN{Column: column, Values: values}
}

// readRow is one row read back: a model value holding the fields read, the columns among them that
// hold NULL, and the raw values of the extra columns read after them.
type readRow struct {
	elem reflect.Value
	// nulls are the columns the row holds NULL in. The model value cannot say it for a Go type
	// without a NULL of its own (a string holds ""), and a payload must not claim that value.
	nulls []string
	extra []any
}

// query runs sel on pool and reads each row into a model value (fields) and raw extras.
func query(db *gorm.DB, pool gorm.ConnPool, sel *gorm.Statement, s *schema.Schema, fields []*schema.Field, extras int) ([]readRow, error) {
	var out []readRow
	err := queryEach(db, pool, sel, s, fields, extras, func(r readRow) error {
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// queryEach runs sel on pool and hands each row, read into a model value (fields) and raw extras, to
// each as it is read: a caller that keeps only part of a row does not hold every row at once.
func queryEach(db *gorm.DB, pool gorm.ConnPool, sel *gorm.Statement, s *schema.Schema, fields []*schema.Field, extras int, each func(readRow) error) error {
	ctx := sel.Context
	q := sel.SQL.String()
	start := time.Now()
	n := 0
	rows, err := pool.QueryContext(ctx, q, sel.Vars...)
	if err == nil {
		err = readRows(ctx, rows, s, fields, extras, func(r readRow) error {
			n++
			return each(r)
		})
	}
	db.Logger.Trace(ctx, start, func() (string, int64) {
		return db.Dialector.Explain(q, sel.Vars...), int64(n)
	}, err)
	return err
}

func readRows(ctx context.Context, rows *sql.Rows, s *schema.Schema, fields []*schema.Field, extras int, each func(readRow) error) (err error) {
	defer func() { err = errors.Join(err, rows.Close()) }()
	for rows.Next() {
		extra := make([]any, extras)
		dests := make([]any, extras)
		for i := range dests {
			dests[i] = &extra[i]
		}
		r, err := scanModelRow(ctx, rows, s, fields, nil, dests)
		if err != nil {
			return err
		}
		r.extra = extra
		if err := each(r); err != nil {
			return err
		}
	}
	return rows.Err()
}

// readByKeys reads fields (then the raw columns extra) of the rows with the given keys; lock takes
// them FOR UPDATE, which also makes MySQL read the latest committed version instead of the
// transaction's snapshot. Integer keys are written as literals (keyInLiteral): besides MySQL's cost of
// preparing many placeholders, PostgreSQL plans a statement the driver has prepared before once for
// any values, and a plan made while the table was small scans it whole once it has grown, until the
// table is next analyzed (100 rows of a fresh 30 000-row table, in a transaction: 48 ms with bind
// variables, 16 ms with one array parameter, 4 ms with literals, measured here).
func readByKeys(db *gorm.DB, pool gorm.ConnPool, src *gorm.Statement, s *schema.Schema, ident []*schema.Field, keys [][]any, fields []*schema.Field, extra []string, lock bool) ([]readRow, error) {
	var out []readRow
	for start := 0; start < len(keys); start += maxKeysPerRead {
		part := keys[start:min(start+maxKeysPerRead, len(keys))]
		rows, err := readWhere(db, pool, src, s, fields, extra, keyInLiteral(ident, part), lock)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

func readWhere(db *gorm.DB, pool gorm.ConnPool, src *gorm.Statement, s *schema.Schema, fields []*schema.Field, extra []string, cond clause.Expression, lock bool) ([]readRow, error) {
	sel := readStmt(db, src, s)
	sel.AddClause(clause.Select{Columns: append(columnsOf(fields), rawColumns(extra)...)})
	sel.AddClause(clause.From{})
	sel.AddClause(clause.Where{Exprs: []clause.Expression{cond}})
	names := []string{"SELECT", "FROM", "WHERE"}
	if lock {
		sel.AddClause(clause.Locking{Strength: clause.LockingStrengthUpdate})
		names = append(names, "FOR")
	}
	sel.Build(names...)
	return query(db, pool, sel, s, fields, len(extra))
}

// readLocked reads the rows an UPDATE or DELETE is about to change, FOR UPDATE: the write's own
// table expression and the tables it joins (UPDATE … FROM), WHERE and, where the write has them,
// ORDER BY and LIMIT (MySQL applies them to writes). built names the clauses the write was built from.
// Each row is handed to each as it is read.
func readLocked(db *gorm.DB, pool gorm.ConnPool, src *gorm.Statement, s *schema.Schema, fields []*schema.Field, extra []string, built []string, each func(readRow) error) error {
	sel := readStmt(db, src, s)
	sel.AddClause(clause.Select{Columns: append(columnsOf(fields), rawColumns(extra)...)})
	sel.AddClause(joinedFrom(src, built))
	names := []string{"SELECT", "FROM"}
	for _, name := range []string{"WHERE", "ORDER BY", "LIMIT"} {
		if c, ok := src.Clauses[name]; ok && contains(built, name) {
			sel.Clauses[name] = c
			names = append(names, name)
		}
	}
	sel.AddClause(clause.Locking{Strength: clause.LockingStrengthUpdate})
	sel.Build(append(names, "FOR")...)
	return queryEach(db, pool, sel, s, fields, len(extra), each)
}

// joinedFrom is the FROM of a SELECT over the rows a write changes: the write's table, and the tables
// an UPDATE … FROM (or a DELETE's FROM) joins to it.
func joinedFrom(src *gorm.Statement, built []string) clause.From {
	from := clause.From{}
	if c, ok := src.Clauses["FROM"]; ok && contains(built, "FROM") {
		if f, ok := c.Expression.(clause.From); ok && (len(f.Tables) > 0 || len(f.Joins) > 0) {
			from.Tables = append([]clause.Table{{Name: clause.CurrentTable}}, f.Tables...)
			from.Joins = f.Joins
			if _, isDelete := src.Clauses["DELETE"]; isDelete {
				from = f // a DELETE's FROM names its table already
			}
		}
	}
	return from
}

// joins reports whether the write reads other tables: a joined table expression, or UPDATE … FROM.
func joins(src *gorm.Statement, built []string) bool {
	if src.TableExpr != nil && joinedTable.MatchString(src.TableExpr.SQL) {
		return true
	}
	f := joinedFrom(src, built)
	return len(f.Tables) > 1 || len(f.Joins) > 0
}

// joinedTable matches a table expression that joins tables.
var joinedTable = regexp.MustCompile(`(?i)\bjoin\b|,`)

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// tableInfo is what the capture needs to know of a table beyond the model: its unique keys (for
// upserts on MySQL and INSERT OR REPLACE on SQLite, which resolve a conflict on any of them), on
// SQLite how rows are addressed, and on PostgreSQL and SQLite whether triggers may change a row after
// RETURNING reported it.
type tableInfo struct {
	// uniqueKeys are the column sets of the primary key and of every unique index, the primary key
	// first (MySQL and SQLite; PostgreSQL's upserts say per row what they did).
	uniqueKeys [][]string
	// expressionKey names a unique index on an expression, whose conflicts cannot be looked up by
	// column values ("" when there is none).
	expressionKey string
	// SQLite: whether the table has a rowid, and whether its primary key is that rowid (a single
	// INTEGER PRIMARY KEY column).
	hasRowid, rowidKey bool
	// laterTriggers: the table has triggers that run after the row a write returns was computed
	// (PostgreSQL: AFTER INSERT or UPDATE triggers; SQLite, whose triggers cannot change NEW: any
	// trigger). What they change is not in the write's RETURNING, so the stored row is read again
	// by key after the write. MySQL's triggers cannot write the table they fire on.
	laterTriggers bool
}

type tableInfoKey struct{ dialect, table string }

// tableInfos caches tableInfo per table, for the life of the plugin. A unique index added while the
// application runs is seen after a restart, or sooner: the capture forgets a table's entry when the
// database's count of affected rows disagrees with what the entry predicted.
type tableInfos struct{ m sync.Map }

func (t *tableInfos) forget(dialect, table string) { t.m.Delete(tableInfoKey{dialect, table}) }

func (t *tableInfos) get(db *gorm.DB, pool gorm.ConnPool, ctx context.Context, table string) (*tableInfo, error) {
	key := tableInfoKey{db.Dialector.Name(), table}
	if v, ok := t.m.Load(key); ok {
		return v.(*tableInfo), nil
	}
	var (
		info *tableInfo
		err  error
	)
	switch key.dialect {
	case "sqlite":
		info, err = sqliteTableInfo(db, pool, ctx, table)
	case "postgres":
		info, err = postgresTableInfo(db, pool, ctx, table)
	default:
		info, err = mysqlTableInfo(db, pool, ctx, table)
	}
	if err != nil {
		return nil, fmt.Errorf("read the unique keys of %s: %w", table, err)
	}
	t.m.Store(key, info)
	return info, nil
}

// postgresTableInfo reads whether the table has enabled AFTER triggers on INSERT or UPDATE (pg_trigger's
// tgtype: 2 BEFORE, 64 INSTEAD OF, 4 INSERT, 16 UPDATE), row or statement level: both run once the
// statement's RETURNING rows are computed. Constraint triggers of foreign keys are internal and write
// other tables.
func postgresTableInfo(db *gorm.DB, pool gorm.ConnPool, ctx context.Context, table string) (*tableInfo, error) {
	quoted := (&gorm.Statement{DB: db}).Quote(table)
	rows, err := tracedQuery(db, pool, ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1) AND NOT tgisinternal AND tgenabled <> 'D' AND tgtype & 66 = 0 AND tgtype & 20 <> 0)`, quoted)
	if err != nil {
		return nil, err
	}
	info := &tableInfo{}
	if rows.Next() {
		err = rows.Scan(&info.laterTriggers)
	}
	return info, errors.Join(err, rows.Err(), rows.Close())
}

// mysqlTableInfo reads the unique keys from information_schema, PRIMARY first, each index's columns
// in index order. MySQL 8's functional indexes have no column name.
func mysqlTableInfo(db *gorm.DB, pool gorm.ConnPool, ctx context.Context, table string) (*tableInfo, error) {
	schemaExpr, name := "DATABASE()", table
	var args []any
	if i := strings.IndexByte(table, '.'); i >= 0 {
		schemaExpr, name = "?", table[i+1:]
		args = append(args, table[:i])
	}
	q := `SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ` + schemaExpr +
		` AND TABLE_NAME = ? AND NON_UNIQUE = 0 ORDER BY INDEX_NAME <> 'PRIMARY', INDEX_NAME, SEQ_IN_INDEX`
	args = append(args, name)
	rows, err := tracedQuery(db, pool, ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	info := &tableInfo{}
	var last string
	for rows.Next() {
		var index string
		var column sql.NullString
		if err := rows.Scan(&index, &column); err != nil {
			return nil, err
		}
		if !column.Valid {
			info.expressionKey = index
			continue
		}
		if index != last || len(info.uniqueKeys) == 0 {
			info.uniqueKeys = append(info.uniqueKeys, nil)
			last = index
		}
		k := len(info.uniqueKeys) - 1
		info.uniqueKeys[k] = append(info.uniqueKeys[k], column.String)
	}
	return info, rows.Err()
}

// sqliteTableInfo reads the unique indexes with PRAGMA index_list/index_info and the primary key with
// PRAGMA table_info: a rowid primary key (INTEGER PRIMARY KEY) has no index of its own.
func sqliteTableInfo(db *gorm.DB, pool gorm.ConnPool, ctx context.Context, table string) (*tableInfo, error) {
	quoted := (&gorm.Statement{DB: db}).Quote(table)
	info := &tableInfo{hasRowid: true}
	if rows, err := pool.QueryContext(ctx, `SELECT rowid FROM `+quoted+` LIMIT 0`); err != nil {
		info.hasRowid = false // WITHOUT ROWID
	} else {
		rows.Close()
	}

	var pk []string
	var pkType string
	rows, err := tracedQuery(db, pool, ctx, `SELECT name, type, pk FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk`, table)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name, typ string
		var n int
		if err := rows.Scan(&name, &typ, &n); err != nil {
			rows.Close()
			return nil, err
		}
		pk, pkType = append(pk, name), typ
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	info.rowidKey = info.hasRowid && len(pk) == 1 && strings.EqualFold(pkType, "INTEGER")

	row := pool.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1 COLLATE NOCASE
		UNION ALL SELECT 1 FROM sqlite_temp_master WHERE type = 'trigger' AND tbl_name = ?1 COLLATE NOCASE)`, table)
	if err := row.Scan(&info.laterTriggers); err != nil {
		return nil, err
	}
	if len(pk) > 0 {
		info.uniqueKeys = append(info.uniqueKeys, pk)
	}

	rows, err = tracedQuery(db, pool, ctx, `SELECT name, origin FROM pragma_index_list(?) WHERE "unique" = 1 ORDER BY seq`, table)
	if err != nil {
		return nil, err
	}
	var indexes, origins []string
	for rows.Next() {
		var name, origin string
		if err := rows.Scan(&name, &origin); err != nil {
			rows.Close()
			return nil, err
		}
		indexes, origins = append(indexes, name), append(origins, origin)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	for i, index := range indexes {
		if origins[i] == "pk" {
			continue // the primary key, already listed
		}
		cols, expr, err := sqliteIndexColumns(db, pool, ctx, index)
		if err != nil {
			return nil, err
		}
		if expr {
			info.expressionKey = index
			continue
		}
		info.uniqueKeys = append(info.uniqueKeys, cols)
	}
	return info, nil
}

func sqliteIndexColumns(db *gorm.DB, pool gorm.ConnPool, ctx context.Context, index string) (cols []string, expr bool, err error) {
	rows, err := tracedQuery(db, pool, ctx, `SELECT name FROM pragma_index_info(?) ORDER BY seqno`, index)
	if err != nil {
		return nil, false, err
	}
	defer func() { err = errors.Join(err, rows.Close()) }()
	for rows.Next() {
		var name sql.NullString
		if err := rows.Scan(&name); err != nil {
			return nil, false, err
		}
		if !name.Valid {
			expr = true
		}
		cols = append(cols, name.String)
	}
	return cols, expr, rows.Err()
}

func tracedQuery(db *gorm.DB, pool gorm.ConnPool, ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	start := time.Now()
	rows, err := pool.QueryContext(ctx, q, args...)
	db.Logger.Trace(ctx, start, func() (string, int64) { return db.Dialector.Explain(q, args...), -1 }, err)
	return rows, err
}

func tracedExec(db *gorm.DB, pool gorm.ConnPool, ctx context.Context, q string, args ...any) (sql.Result, error) {
	start := time.Now()
	res, err := pool.ExecContext(ctx, q, args...)
	db.Logger.Trace(ctx, start, func() (string, int64) {
		n := int64(-1)
		if err == nil {
			n, _ = res.RowsAffected()
		}
		return db.Dialector.Explain(q, args...), n
	}, err)
	return res, err
}
