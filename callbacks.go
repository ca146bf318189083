package outboxplugin

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// How the capture rides on GORM's callback chains (callbacks/callbacks.go in gorm):
//
//	create: gorm:begin_transaction, [outbox:begin], gorm:before_create, gorm:save_before_associations,
//	        [outbox:before_create], gorm:create, [outbox:after_create], gorm:save_after_associations,
//	        gorm:after_create, [outbox:commit], gorm:commit_or_rollback_transaction
//	update: ..., [outbox:begin], gorm:setup_reflect_value, ..., [outbox:before_update], gorm:update,
//	        [outbox:after_update], gorm:save_after_associations, gorm:after_update, [outbox:commit], ...
//	delete: ..., [outbox:begin], gorm:before_delete, ..., [outbox:before_delete], gorm:delete,
//	        [outbox:after_delete], gorm:after_delete, [outbox:commit], ...
//
// The events are inserted right after the write, on db.Statement.ConnPool, which is then the
// transaction GORM opened (or the caller's): a failing hook or association later in the chain rolls
// both back. outbox:begin and outbox:commit open and close a transaction of the plugin's own only
// when there is none, which happens under SkipDefaultTransaction. Associations saved through a parent
// run chains of their own, nested inside the parent's, and so get their own events.
//
// All callbacks are registered with Before: GORM's sorter appends a callback registered After an
// already sorted one at the end of the chain, which would put it past the commit.

const callbackPrefix = "outbox:"

func (p *Plugin) registerCallbacks(db *gorm.DB) error {
	create, update, del := db.Callback().Create(), db.Callback().Update(), db.Callback().Delete()
	for _, err := range []error{
		create.Before("gorm:before_create").Register(callbackPrefix+"begin", p.begin(ChangesetCreate)),
		create.Before("gorm:create").Register(callbackPrefix+"before_create", p.beforeCreate),
		create.Before("gorm:save_after_associations").Register(callbackPrefix+"after_create", p.afterCreate),
		create.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"commit", p.commitOrRollback),

		update.Before("gorm:setup_reflect_value").Register(callbackPrefix+"begin", p.begin(ChangesetUpdate)),
		update.Before("gorm:update").Register(callbackPrefix+"before_update", p.beforeWrite),
		update.Before("gorm:save_after_associations").Register(callbackPrefix+"after_update", p.afterWrite),
		update.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"commit", p.commitOrRollback),

		del.Before("gorm:before_delete").Register(callbackPrefix+"begin", p.begin(ChangesetDelete)),
		del.Before("gorm:delete").Register(callbackPrefix+"before_delete", p.beforeWrite),
		del.Before("gorm:after_delete").Register(callbackPrefix+"after_delete", p.afterWrite),
		del.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"commit", p.commitOrRollback),
	} {
		if err != nil {
			return fmt.Errorf("outboxplugin: register callbacks: %w", err)
		}
	}
	return nil
}

const stateKey = "outboxplugin:state"

// statementState is what the callbacks of one statement share.
type statementState struct {
	op     ChangesetType
	fields []*schema.Field // identity fields
	hasPK  bool

	startedTx bool // outbox:begin opened the transaction, outbox:commit ends it

	// create with ON CONFLICT: which elements carried their key into the insert, and which of those
	// keys already existed.
	preKeyed  []bool
	existed   map[string]bool
	doNothing bool // read before GORM builds the statement: MySQL's builder rewrites the clause
	mapRows   int  // rows of a []map create before GORM appended the returned ones

	// update and delete
	single      bool  // the statement targets one model value whose key is known
	singleKeys  []any //
	interceptor *writeInterceptor
}

func stateOf(db *gorm.DB) *statementState {
	v, ok := db.InstanceGet(stateKey)
	if !ok {
		return nil
	}
	st, _ := v.(*statementState)
	return st
}

// capturing decides, once per statement, whether it gives events.
func (p *Plugin) capturing(db *gorm.DB) bool {
	s := db.Statement
	if s.Schema == nil || db.DryRun || captureSuppressed(s.Context) || s.Table == p.cfg.table {
		return false
	}
	return p.cfg.captures(s.Schema)
}

func (p *Plugin) begin(op ChangesetType) func(*gorm.DB) {
	return func(db *gorm.DB) {
		if db.Error != nil || !p.capturing(db) {
			return
		}
		fields := identityFields(db.Statement.Schema)
		st := &statementState{op: op, fields: fields, hasPK: len(db.Statement.Schema.PrimaryFields) > 0}
		db.InstanceSet(stateKey, st)
		if inTransaction(db.Statement.ConnPool) {
			return
		}
		// No transaction (SkipDefaultTransaction): open one, so that the row and its event cannot
		// be committed apart.
		tx := db.Begin()
		if tx.Error != nil {
			db.AddError(fmt.Errorf("outboxplugin: begin transaction for %s %s: %w", op, db.Statement.Schema.Name, tx.Error))
			return
		}
		db.Statement.ConnPool = tx.Statement.ConnPool
		st.startedTx = true
	}
}

// commitOrRollback ends the chain: it forgets the statement's state (a *gorm.DB chain may run
// several operations on one statement) and ends the transaction outbox:begin opened, if any.
func (p *Plugin) commitOrRollback(db *gorm.DB) {
	st := stateOf(db)
	if st == nil {
		return
	}
	db.Statement.Settings.Delete(fmt.Sprintf("%p", db.Statement) + stateKey) // the key InstanceSet used
	if !st.startedTx {
		return
	}
	st.startedTx = false
	if db.Error != nil {
		db.Rollback()
	} else {
		db.Commit()
	}
	db.Statement.ConnPool = db.ConnPool
}

func inTransaction(pool gorm.ConnPool) bool {
	c, ok := pool.(gorm.TxCommitter)
	return ok && c != nil && !reflect.ValueOf(c).IsNil()
}

// beforeCreate prepares upserts. For a create with ON CONFLICT the database does not say which rows
// it inserted, updated or skipped. Rows whose key the database generates are told apart after the
// write: they have a key only if they were inserted. Rows that carry their own key are looked up
// here, before the insert, in the same transaction: a key that already exists was updated (or, with
// DO NOTHING, skipped); one that does not was inserted.
func (p *Plugin) beforeCreate(db *gorm.DB) {
	st := stateOf(db)
	if st == nil || db.Error != nil {
		return
	}
	if rows, ok := db.Statement.Dest.(*[]map[string]any); ok && rows != nil {
		st.mapRows = len(*rows)
	}
	c, ok := db.Statement.Clauses["ON CONFLICT"]
	if !ok || !st.hasPK {
		return
	}
	oc, _ := c.Expression.(clause.OnConflict)
	st.doNothing = oc.DoNothing
	elems := structElems(db.Statement.ReflectValue)
	if len(elems) == 0 {
		return
	}
	ctx := db.Statement.Context
	st.preKeyed = make([]bool, len(elems))
	var keyed [][]any
	for i, e := range elems {
		if !e.IsValid() {
			continue
		}
		if keys, complete := keysOf(ctx, st.fields, e, true); complete {
			st.preKeyed[i] = true
			keyed = append(keyed, keys)
		}
	}
	if len(keyed) == 0 {
		return
	}
	found, err := selectExistingKeys(db, st.fields, keyed)
	if err != nil {
		db.AddError(fmt.Errorf("outboxplugin: create %s: look up existing keys: %w", db.Statement.Schema.Name, err))
		return
	}
	st.existed = make(map[string]bool, len(found))
	for _, k := range found {
		st.existed[keyString(k)] = true
	}
}

func (p *Plugin) afterCreate(db *gorm.DB) {
	st := stateOf(db)
	if st == nil || db.Error != nil || db.RowsAffected == 0 {
		return
	}
	rows := p.createdRows(db, st)
	p.writeEvents(db, st, rows)
}

// createdRows lists the rows a create wrote.
func (p *Plugin) createdRows(db *gorm.DB, st *statementState) []capturedRow {
	stmt := db.Statement
	switch dest := stmt.Dest.(type) {
	case map[string]any:
		return []capturedRow{p.mapRow(st, dest, nil)}
	case *map[string]any:
		return []capturedRow{p.mapRow(st, *dest, nil)}
	case []map[string]any:
		return p.mapRows(st, dest, nil)
	case *[]map[string]any:
		// With RETURNING, GORM appends the returned rows (the generated keys) after the given ones.
		given, returned := *dest, []map[string]any(nil)
		if st.mapRows > 0 && st.mapRows <= len(given) {
			given, returned = given[:st.mapRows], given[st.mapRows:]
		}
		return p.mapRows(st, given, returned)
	}

	c, upsert := stmt.Clauses["ON CONFLICT"]
	if upsert {
		// GORM turns UpdateAll with nothing to update into DO NOTHING while building.
		oc, _ := c.Expression.(clause.OnConflict)
		st.doNothing = st.doNothing || oc.DoNothing
	}
	elems := structElems(stmt.ReflectValue)
	rows := make([]capturedRow, 0, len(elems))
	for i, e := range elems {
		if !e.IsValid() {
			continue
		}
		keys, complete := keysOf(stmt.Context, st.fields, e, st.hasPK)
		row := capturedRow{op: ChangesetCreate, elem: e, keys: keys}
		if upsert && st.hasPK {
			switch {
			case i < len(st.preKeyed) && st.preKeyed[i]:
				if st.existed[keyString(keys)] {
					if st.doNothing {
						continue // skipped by the database
					}
					row.op = ChangesetUpdate
				}
			case !complete:
				continue // no key came back: the database skipped the row
			}
		}
		rows = append(rows, row)
	}
	return rows
}

func (p *Plugin) mapRows(st *statementState, given, returned []map[string]any) []capturedRow {
	rows := make([]capturedRow, 0, len(given))
	for i, m := range given {
		if m == nil {
			continue
		}
		var ret map[string]any
		if i < len(returned) {
			ret = returned[i]
		}
		rows = append(rows, p.mapRow(st, m, ret))
	}
	return rows
}

func (p *Plugin) mapRow(st *statementState, m, returned map[string]any) capturedRow {
	keys, complete := keysFromMap(st.fields, m, st.hasPK)
	if !complete && returned != nil {
		keys, _ = keysFromMap(st.fields, returned, st.hasPK)
	}
	return capturedRow{op: ChangesetCreate, keys: keys, changes: m}
}

// structElems returns the struct values of a statement: itself for a struct, its elements for a
// slice or array (invalid for nil pointers).
func structElems(rv reflect.Value) []reflect.Value {
	rv = reflect.Indirect(rv)
	switch rv.Kind() {
	case reflect.Struct:
		return []reflect.Value{rv}
	case reflect.Slice, reflect.Array:
		elems := make([]reflect.Value, rv.Len())
		for i := range elems {
			e := reflect.Indirect(rv.Index(i))
			if e.Kind() == reflect.Struct {
				elems[i] = e
			}
		}
		return elems
	}
	return nil
}

// beforeWrite runs just before an update or delete is executed. When the statement targets one model
// value with a complete primary key, GORM's WHERE contains that key and the write changes that row or
// none: its key is known. Otherwise (a condition, a slice of values) the affected keys are read by
// the write interceptor, in the same transaction, right before the write, from the WHERE clause GORM
// built for it.
func (p *Plugin) beforeWrite(db *gorm.DB) {
	st := stateOf(db)
	if st == nil || db.Error != nil {
		return
	}
	stmt := db.Statement
	if st.hasPK && stmt.ReflectValue.Kind() == reflect.Struct {
		st.singleKeys, st.single = keysOf(stmt.Context, st.fields, stmt.ReflectValue, true)
	}
	needSet := st.op == ChangesetUpdate && (p.cfg.payload != PayloadKey || p.wantsChangeset(stmt.Schema))
	if st.single && !needSet {
		return
	}
	ic := &writeInterceptor{ConnPool: stmt.ConnPool, db: db, fields: st.fields, selectKeys: !st.single}
	st.interceptor = ic
	stmt.ConnPool = ic
}

// afterWrite runs right after an update or delete, before the after hooks.
func (p *Plugin) afterWrite(db *gorm.DB) {
	st := stateOf(db)
	if st == nil {
		return
	}
	ic := st.interceptor
	if ic != nil {
		db.Statement.ConnPool = ic.ConnPool
		st.interceptor = nil
	}
	if db.Error != nil || db.RowsAffected == 0 {
		return
	}
	var set clause.Set
	if ic != nil {
		if !ic.fired {
			return // GORM found nothing to write
		}
		set = ic.set
	}
	var rows []capturedRow
	if st.single {
		rows = []capturedRow{{op: st.op, elem: db.Statement.ReflectValue, keys: st.singleKeys}}
	} else {
		if db.RowsAffected > int64(len(ic.keys)) {
			db.AddError(fmt.Errorf("outboxplugin: %s %s: %d rows changed, %d locked before the write: %w",
				st.op, db.Statement.Schema.Name, db.RowsAffected, len(ic.keys), ErrConcurrentChange))
			return
		}
		rows = p.rowsForKeys(db, st, ic.keys)
	}
	if set != nil {
		changes := setColumns(set)
		for i := range rows {
			rows[i].changes = changes
		}
	}
	p.writeEvents(db, st, rows)
}

// rowsForKeys pairs keys read from the database with the model values of the statement, when it has
// a slice of them, so that row payloads can use them.
func (p *Plugin) rowsForKeys(db *gorm.DB, st *statementState, keys [][]any) []capturedRow {
	var byKey map[string]reflect.Value
	if p.cfg.payload == PayloadRow || p.wantsChangeset(db.Statement.Schema) {
		if elems := structElems(db.Statement.ReflectValue); len(elems) > 0 && st.hasPK {
			byKey = make(map[string]reflect.Value, len(elems))
			for _, e := range elems {
				if !e.IsValid() {
					continue
				}
				if k, complete := keysOf(db.Statement.Context, st.fields, e, true); complete {
					byKey[keyString(k)] = e
				}
			}
		}
	}
	rows := make([]capturedRow, len(keys))
	for i, k := range keys {
		rows[i] = capturedRow{op: st.op, keys: k}
		if byKey != nil {
			rows[i].elem = byKey[keyString(k)]
		}
	}
	return rows
}

// setColumns keeps the assignments of an update whose values are known: columns set to an SQL
// expression are left out.
func setColumns(set clause.Set) map[string]any {
	m := make(map[string]any, len(set))
	for _, a := range set {
		switch a.Value.(type) {
		case clause.Expression, *gorm.DB:
			continue
		}
		m[a.Column.Name] = a.Value
	}
	return m
}

// writeInterceptor stands in for the statement's connection while GORM executes an update or delete.
// On the first call it records the SET clause and, when needed, reads the keys of the rows the
// write will change: SELECT <key> FROM <table> WHERE <the write's WHERE> FOR UPDATE (ORDER BY and
// LIMIT too where the database allows them on writes), in the same transaction. The lock keeps the
// rows from changing before the write (SQLite needs none: a transaction that read and then writes
// fails with SQLITE_BUSY if another wrote in between). Reading afterwards would see the new values
// and miss rows that no longer match.
type writeInterceptor struct {
	gorm.ConnPool
	db         *gorm.DB
	fields     []*schema.Field
	selectKeys bool

	fired bool
	set   clause.Set
	keys  [][]any
}

func (w *writeInterceptor) beforeWrite(ctx context.Context) error {
	if w.fired {
		return nil
	}
	w.fired = true
	stmt := w.db.Statement
	if c, ok := stmt.Clauses["SET"]; ok {
		w.set, _ = c.Expression.(clause.Set)
	}
	if !w.selectKeys {
		return nil
	}
	keys, err := selectKeys(w.db, w.ConnPool, ctx, w.fields)
	if err != nil {
		return fmt.Errorf("outboxplugin: read the keys of the rows to %s: %w", stmtVerb(stmt), err)
	}
	w.keys = keys
	return nil
}

func stmtVerb(stmt *gorm.Statement) string {
	if _, ok := stmt.Clauses["DELETE"]; ok {
		return "delete"
	}
	return "update"
}

func (w *writeInterceptor) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := w.beforeWrite(ctx); err != nil {
		return nil, err
	}
	return w.ConnPool.ExecContext(ctx, query, args...)
}

func (w *writeInterceptor) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := w.beforeWrite(ctx); err != nil {
		return nil, err
	}
	return w.ConnPool.QueryContext(ctx, query, args...)
}

// Commit and Rollback keep the interceptor a transaction in the eyes of code that checks for one
// (gorm.TxCommitter), such as read/write splitting plugins.
func (w *writeInterceptor) Commit() error {
	if c, ok := w.ConnPool.(gorm.TxCommitter); ok {
		return c.Commit()
	}
	return gorm.ErrInvalidTransaction
}

func (w *writeInterceptor) Rollback() error {
	if c, ok := w.ConnPool.(gorm.TxCommitter); ok {
		return c.Rollback()
	}
	return gorm.ErrInvalidTransaction
}

// selectKeys reads the identity of the rows the statement's WHERE matches, locking them.
func selectKeys(db *gorm.DB, pool gorm.ConnPool, ctx context.Context, fields []*schema.Field) ([][]any, error) {
	src := db.Statement
	sel := newSelect(db, fields)
	names := []string{"SELECT", "FROM", "WHERE"}
	if c, ok := src.Clauses["WHERE"]; ok {
		sel.Clauses["WHERE"] = c
	}
	// MySQL applies ORDER BY and LIMIT to UPDATE and DELETE: select the same rows.
	for _, name := range []string{"ORDER BY", "LIMIT"} {
		if c, ok := src.Clauses[name]; ok && slices.Contains(src.BuildClauses, name) {
			sel.Clauses[name] = c
			names = append(names, name)
		}
	}
	sel.AddClause(clause.Locking{Strength: clause.LockingStrengthUpdate})
	names = append(names, "FOR")
	sel.Build(names...)
	return queryKeys(db, pool, ctx, sel, fields)
}

// selectExistingKeys returns which of keys exist in the statement's table.
func selectExistingKeys(db *gorm.DB, fields []*schema.Field, keys [][]any) ([][]any, error) {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.DBName
	}
	var found [][]any
	const chunk = 5000 // stays under every database's bind-parameter limit
	for start := 0; start < len(keys); start += chunk {
		part := keys[start:min(start+chunk, len(keys))]
		column, values := schema.ToQueryValues(clause.CurrentTable, names, part)
		sel := newSelect(db, fields)
		sel.AddClause(clause.Where{Exprs: []clause.Expression{clause.IN{Column: column, Values: values}}})
		sel.Build("SELECT", "FROM", "WHERE")
		rows, err := queryKeys(db, db.Statement.ConnPool, db.Statement.Context, sel, fields)
		if err != nil {
			return nil, err
		}
		found = append(found, rows...)
	}
	return found, nil
}

func newSelect(db *gorm.DB, fields []*schema.Field) *gorm.Statement {
	src := db.Statement
	sel := &gorm.Statement{
		DB: db, Context: src.Context, Table: src.Table, TableExpr: src.TableExpr, Schema: src.Schema,
		Clauses: map[string]clause.Clause{},
	}
	cols := make([]clause.Column, len(fields))
	for i, f := range fields {
		cols[i] = clause.Column{Table: clause.CurrentTable, Name: f.DBName}
	}
	sel.AddClause(clause.Select{Columns: cols})
	sel.AddClause(clause.From{})
	return sel
}

func queryKeys(db *gorm.DB, pool gorm.ConnPool, ctx context.Context, sel *gorm.Statement, fields []*schema.Field) ([][]any, error) {
	query := sel.SQL.String()
	start := time.Now()
	rows, err := pool.QueryContext(ctx, query, sel.Vars...)
	var keys [][]any
	if err == nil {
		keys, err = scanKeys(rows, fields)
	}
	db.Logger.Trace(ctx, start, func() (string, int64) {
		return db.Dialector.Explain(query, sel.Vars...), int64(len(keys))
	}, err)
	return keys, err
}

func scanKeys(rows *sql.Rows, fields []*schema.Field) (keys [][]any, err error) {
	defer func() { err = errors.Join(err, rows.Close()) }()
	dests := make([]any, len(fields))
	for rows.Next() {
		for i, f := range fields {
			if f.Serializer != nil || f.FieldType.Kind() == reflect.Interface {
				dests[i] = new(any)
			} else {
				dests[i] = reflect.New(f.FieldType).Interface()
			}
		}
		if err := rows.Scan(dests...); err != nil {
			return nil, err
		}
		k := make([]any, len(fields))
		for i, d := range dests {
			v := reflect.ValueOf(d).Elem().Interface()
			if b, ok := v.([]byte); ok {
				v = string(b)
			}
			k[i] = v
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}
