package outboxplugin

import (
	"fmt"
	"reflect"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"

	"github.com/gorm-outbox/outboxplugin/internal/capture"
)

// The capture path, stage by stage:
//
//	callbacks.go where the capture rides on GORM's callback chains, and the state of one statement
//	write.go     the write as the database runs it: what is read before it, what is added to it
//	             (RETURNING), and GORM's own result handed back unchanged
//	classify.go  what the statement wrote, row by row: created, updated, deleted or nothing
//	keys.go      keys and values of a row: reading them, comparing them, formatting aggregate ids
//	events.go    the outbox event of each captured row: type, payload, aggregate, headers, customizers
//	encode.go    JSON text of payloads and headers
//	insert.go    the events of a transaction (txwatch.go holds them) written in one multi-row INSERT
//
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
// outbox:before_* decides how the statement's rows will be known and, when GORM's own result does not
// say it, stands in for the statement's connection (write.go) while gorm:create/update/delete runs.
// outbox:after_* classifies what was written and hands its events to db.Statement.ConnPool, which is
// then the transaction GORM opened (or the caller's): that transaction holds them and writes all of its
// events just before it commits (txwatch.go), or, when the plugin does not watch it, they are inserted
// right after the write. A failing hook or association later in the chain rolls both back. outbox:begin and outbox:commit open and close a
// transaction of the plugin's own only when there is none, which happens under SkipDefaultTransaction.
// Associations saved through a parent run chains of their own, nested inside the parent's, and so get
// their own events.
//
// All callbacks are registered with Before: GORM's sorter appends a callback registered After an
// already sorted one at the end of the chain, which would put it past the commit.

const callbackPrefix = "outbox:"

func (p *Plugin) registerCallbacks(db *gorm.DB) error {
	create, update, del := db.Callback().Create(), db.Callback().Update(), db.Callback().Delete()
	for _, err := range []error{
		// Events held by the transaction are written before anything that could see the outbox
		// table without them or end the transaction without them (txwatch.go).
		db.Callback().Raw().Before("gorm:raw").Register(callbackPrefix+"flush", p.ins.FlushBeforeExec),
		db.Callback().Query().Before("gorm:query").Register(callbackPrefix+"flush", p.ins.FlushBeforeRead),
		db.Callback().Row().Before("gorm:row").Register(callbackPrefix+"flush", p.ins.FlushBeforeRead),
		// A transaction the database rolled back whole (a MySQL deadlock) drops its events; these see
		// the errors of statements its connection does not see itself (PrepareStmt's). Registered
		// After, they run last in their chains.
		db.Callback().Raw().After("gorm:raw").Register(callbackPrefix+"observe", p.ins.ObserveError),
		db.Callback().Query().After("gorm:query").Register(callbackPrefix+"observe", p.ins.ObserveError),
		db.Callback().Row().After("gorm:row").Register(callbackPrefix+"observe", p.ins.ObserveError),

		create.Before("gorm:before_create").Register(callbackPrefix+"begin", p.begin(ChangesetCreate)),
		create.Before("gorm:create").Register(callbackPrefix+"before_create", p.beforeCreate),
		create.Before("gorm:save_after_associations").Register(callbackPrefix+"after_create", p.afterCreate),
		create.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"observe", p.ins.ObserveError),
		create.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"commit", p.commitOrRollback),

		update.Before("gorm:setup_reflect_value").Register(callbackPrefix+"begin", p.begin(ChangesetUpdate)),
		update.Before("gorm:update").Register(callbackPrefix+"before_update", p.beforeWrite),
		update.Before("gorm:save_after_associations").Register(callbackPrefix+"after_update", p.afterWrite),
		update.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"observe", p.ins.ObserveError),
		update.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"commit", p.commitOrRollback),

		del.Before("gorm:before_delete").Register(callbackPrefix+"begin", p.begin(ChangesetDelete)),
		del.Before("gorm:delete").Register(callbackPrefix+"before_delete", p.beforeWrite),
		del.Before("gorm:after_delete").Register(callbackPrefix+"after_delete", p.afterWrite),
		del.Before("gorm:commit_or_rollback_transaction").Register(callbackPrefix+"observe", p.ins.ObserveError),
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
	op ChangesetType
	// schema is the model of the rows written: the statement's, or for a Table(...) write without a
	// model the one the application uses for that table (tables.go). Everything the capture reads of
	// the rows goes through it; GORM's own statement is left as it is.
	schema *schema.Schema
	fields []*schema.Field // identity fields
	hasPK  bool

	startedTx bool // outbox:begin opened the transaction, outbox:commit ends it

	mapRows int // rows of a []map create before GORM appended the returned ones

	// update and delete: the statement targets one model value whose complete key is in its WHERE,
	// so it changes that row or none.
	single     bool
	singleKeys []any

	w *write // the write in flight, when the statement's rows are learnt from more than GORM's result
}

func stateOf(db *gorm.DB) *statementState {
	v, ok := db.InstanceGet(stateKey)
	if !ok {
		return nil
	}
	st, _ := v.(*statementState)
	return st
}

// capturing decides, once per statement, whether it gives events, and for which model.
func (p *Plugin) capturing(db *gorm.DB) (*schema.Schema, error) {
	s := db.Statement
	if db.DryRun || captureSuppressed(s.Context) || s.Table == p.cfg.table {
		return nil, nil
	}
	sch := s.Schema
	if sch == nil {
		if s.Table == "" {
			return nil, nil
		}
		if sch = p.tables.lookup(db, p.cfg.only, s.Table); sch == nil {
			if p.cfg.strictTables {
				return nil, fmt.Errorf("outboxplugin: write to table %s: %w", s.Table, ErrUnknownTable)
			}
			return nil, nil
		}
	} else {
		p.tables.remember(sch, s.Table)
	}
	if !p.cfg.captures(sch) {
		return nil, nil
	}
	return sch, nil
}

func (p *Plugin) begin(op ChangesetType) func(*gorm.DB) {
	return func(db *gorm.DB) {
		if db.Error != nil {
			return
		}
		if t := capture.TxOf(db.Statement.ConnPool); t != nil {
			if err := t.ClosedErr(); err != nil {
				db.AddError(err) // the write would commit on its own, outside the transaction
				return
			}
		}
		if db.Statement.Table == p.cfg.table {
			p.ins.FlushHeld(db, "writing to "+p.cfg.table) // not captured, but it may change the events held
		}
		sch, err := p.capturing(db)
		if err != nil {
			db.AddError(err)
			return
		}
		if sch == nil {
			return
		}
		st := &statementState{op: op, schema: sch, fields: identityFields(sch), hasPK: len(sch.PrimaryFields) > 0}
		db.InstanceSet(stateKey, st)
		if inTransaction(db.Statement.ConnPool) {
			return
		}
		// No transaction (SkipDefaultTransaction): open one, so that the row and its event cannot
		// be committed apart.
		tx := db.Begin()
		if tx.Error != nil {
			db.AddError(fmt.Errorf("outboxplugin: begin transaction for %s %s: %w", op, sch.Name, tx.Error))
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

// intercept puts w in place of the statement's connection until the write has run.
func (st *statementState) intercept(db *gorm.DB, w *write) {
	w.ConnPool = db.Statement.ConnPool
	st.w = w
	db.Statement.ConnPool = w
}

// release gives the statement its connection back; it runs whatever happened to the write.
func (st *statementState) release(db *gorm.DB) *write {
	w := st.w
	if w != nil {
		db.Statement.ConnPool = w.ConnPool
		st.w = nil
	}
	return w
}

func (p *Plugin) beforeCreate(db *gorm.DB) {
	st := stateOf(db)
	if st == nil || db.Error != nil {
		return
	}
	if rows, ok := db.Statement.Dest.(*[]map[string]any); ok && rows != nil {
		st.mapRows = len(*rows)
	}
	if w := p.planCreate(db, st); w != nil {
		st.intercept(db, w)
	}
}

func (p *Plugin) afterCreate(db *gorm.DB) {
	p.after(db, func(db *gorm.DB, st *statementState, w *write) (capturedRows, error) {
		rows, err := p.createdRows(db, st, w)
		return listedRows(rows), err
	})
}

// after runs right after the write, before the after hooks: it gives the statement its connection
// back, lists the rows written and hands their events to the transaction. When that fails, the
// statement fails, and its transaction cannot commit unless it rolls back to a savepoint set before
// the statement: the rows are written, and would otherwise commit without their events (or with
// some of them).
func (p *Plugin) after(db *gorm.DB, rowsOf func(*gorm.DB, *statementState, *write) (capturedRows, error)) {
	st := stateOf(db)
	if st == nil {
		return
	}
	w := st.release(db)
	if db.Error != nil || db.RowsAffected == 0 {
		return
	}
	rows, err := rowsOf(db, st, w)
	if err != nil {
		err = fmt.Errorf("outboxplugin: %s %s: %w", st.op, st.schema.Name, err)
	} else {
		err = p.writeEvents(db, st, rows)
	}
	if err != nil {
		db.AddError(err)
		if t := capture.TxOf(db.Statement.ConnPool); t != nil {
			t.Fail(err)
		}
	}
}

// beforeWrite runs just before an update or delete is executed.
func (p *Plugin) beforeWrite(db *gorm.DB) {
	st := stateOf(db)
	if st == nil || db.Error != nil {
		return
	}
	stmt := db.Statement
	if st.hasPK && stmt.ReflectValue.Kind() == reflect.Struct && stmt.ReflectValue.Type() == st.schema.ModelType {
		// GORM's WHERE holds the key of the model value when every part of it is set (it leaves
		// zero parts out, and then the write may change several rows).
		st.singleKeys, st.single = keysOf(stmt.Context, st.fields, stmt.ReflectValue, true)
	}
	if w := p.planWrite(db, st); w != nil {
		st.intercept(db, w)
	}
}

func (p *Plugin) afterWrite(db *gorm.DB) { p.after(db, p.writtenRows) }

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

// assignedColumns are the columns of a SET (or DO UPDATE) clause, without assignments of a column to
// itself (MySQL's stand-in for DO NOTHING, id = id).
func assignedColumns(set []clause.Assignment) []string {
	cols := make([]string, 0, len(set))
	for _, a := range set {
		if c, ok := a.Value.(clause.Column); ok && c.Name == a.Column.Name && (c.Table == "" || c.Table == clause.CurrentTable) {
			continue
		}
		if !contains(cols, a.Column.Name) {
			cols = append(cols, a.Column.Name)
		}
	}
	return cols
}
