package capture

import (
	"fmt"
	"reflect"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

const stateKey = "outboxplugin:state"

// statementState is what the callbacks of one statement share.
type statementState struct {
	op Op
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
func (p *Capturer) capturing(db *gorm.DB) (*schema.Schema, error) {
	s := db.Statement
	if db.DryRun || Suppressed(s.Context) || s.Table == p.cfg.Table {
		return nil, nil
	}
	sch := s.Schema
	if sch == nil {
		if s.Table == "" {
			return nil, nil
		}
		if sch = p.tables.lookup(db, p.cfg.Only, s.Table); sch == nil {
			if p.cfg.StrictTables {
				return nil, fmt.Errorf("outboxplugin: write to table %s: %w", s.Table, ErrUnknownTable)
			}
			return nil, nil
		}
	} else {
		p.tables.remember(sch, s.Table)
	}
	if !p.cfg.Captures(sch) {
		return nil, nil
	}
	return sch, nil
}

// Begin is outbox:begin for op: it decides whether the statement is captured, and opens a transaction
// when there is none.
func (p *Capturer) Begin(op Op) func(*gorm.DB) {
	return func(db *gorm.DB) {
		if db.Error != nil {
			return
		}
		if t := TxOf(db.Statement.ConnPool); t != nil {
			if err := t.ClosedErr(); err != nil {
				db.AddError(err) // the write would commit on its own, outside the transaction
				return
			}
		}
		if db.Statement.Table == p.cfg.Table {
			p.FlushHeld(db, "writing to "+p.cfg.Table) // not captured, but it may change the events held
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
		if InTransaction(db.Statement.ConnPool) {
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

// CommitOrRollback ends the chain: it forgets the statement's state (a *gorm.DB chain may run
// several operations on one statement) and ends the transaction outbox:begin opened, if any.
func (p *Capturer) CommitOrRollback(db *gorm.DB) {
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

// InTransaction reports whether pool, a statement's connection, is a transaction.
func InTransaction(pool gorm.ConnPool) bool {
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

// BeforeCreate is outbox:before_create: it plans how the created rows will be known.
func (p *Capturer) BeforeCreate(db *gorm.DB) {
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

// AfterCreate is outbox:after_create: the created rows' events.
func (p *Capturer) AfterCreate(db *gorm.DB) {
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
func (p *Capturer) after(db *gorm.DB, rowsOf func(*gorm.DB, *statementState, *write) (capturedRows, error)) {
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
		if t := TxOf(db.Statement.ConnPool); t != nil {
			t.Fail(err)
		}
	}
}

// BeforeWrite runs just before an update or delete is executed.
func (p *Capturer) BeforeWrite(db *gorm.DB) {
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

// AfterWrite is outbox:after_update and outbox:after_delete: the written rows' events.
func (p *Capturer) AfterWrite(db *gorm.DB) { p.after(db, p.writtenRows) }

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
