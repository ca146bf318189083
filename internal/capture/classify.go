package capture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// The classification stage: what the statement wrote, row by row, from what the write learnt. Each
// row the database wrote becomes one capturedRow, with the key of the row actually written and the
// change it went through; a row it skipped becomes none.

// capturedRow is one row the statement wrote. The public Changeset is built from it only when an
// option or a customizer needs one, so the default path allocates little per row.
type capturedRow struct {
	op   Op
	keys []any // values of the identity fields, in order
	// held is the model value GORM holds for the row (an element of the statement's value); invalid
	// when there is none.
	held reflect.Value
	// stored is the row as the database stored it, read back (PayloadRow, PayloadChanges); its elem
	// is invalid when not read.
	stored readRow
	// assigned are the columns the statement assigned to the row.
	assigned []string
	// values are the values the statement sent, by column, when known: the map of a map create, the
	// SET of an update (columns set to an expression left out). Changeset.Changes in PayloadKey mode.
	values map[string]any
	// unknown are columns whose stored value the plugin does not know, left out of the payload and
	// the Changeset: only for a model without a primary key, whose rows cannot be read back by key,
	// the columns its INSERT did not write (on MySQL, and in PayloadKey mode) or its UPDATE assigned
	// (on MySQL).
	unknown []string
}

// errBypassed: GORM wrote rows without going through the connection the plugin put in place, which
// happens when another plugin replaces db.Statement.ConnPool between outbox:before_* and the write.
// The rows are unknown; the write fails rather than commit without its events.
var errBypassed = errors.New("the write did not go through the plugin's connection (another callback replaced db.Statement.ConnPool after outbox:before_create/update/delete)")

// createdRows lists the rows a create wrote.
func (p *Capturer) createdRows(db *gorm.DB, st *statementState, w *write) ([]capturedRow, error) {
	if w == nil {
		rows := p.plainCreated(db, st)
		if p.cfg.Payload == PayloadKey && !p.wantsChangeset(st.schema) {
			return rows, nil
		}
		cols := readInsertClauses(db.Statement).columns
		for i := range rows {
			rows[i].assigned = cols
		}
		if p.cfg.Payload == PayloadKey {
			return rows, nil
		}
		return rows, p.readBack(db, st, db.Statement.ConnPool, rows)
	}
	if !w.fired {
		return nil, errBypassed
	}
	switch w.strategy {
	case returningWrite:
		return w.returnedRows()
	case mysqlUpsert:
		if w.many {
			return w.classifyMany()
		}
		return w.oneRows()
	}
	return nil, fmt.Errorf("outboxplugin: create with write strategy %d", w.strategy)
}

// plainCreated lists the rows of a plain INSERT: every row of the statement was inserted, and GORM
// has read generated keys back into the values (with RETURNING or LAST_INSERT_ID()).
func (p *Capturer) plainCreated(db *gorm.DB, st *statementState) []capturedRow {
	stmt := db.Statement
	switch dest := stmt.Dest.(type) {
	case map[string]any:
		return []capturedRow{mapRow(st, dest, nil)}
	case *map[string]any:
		return []capturedRow{mapRow(st, *dest, nil)}
	case []map[string]any:
		return mapRows(st, dest, nil)
	case *[]map[string]any:
		// With RETURNING, GORM appends the returned rows (the generated keys) after the given ones.
		given, returned := *dest, []map[string]any(nil)
		if st.mapRows > 0 && st.mapRows <= len(given) {
			given, returned = given[:st.mapRows], given[st.mapRows:]
		}
		return mapRows(st, given, returned)
	}
	elems := structElems(stmt.ReflectValue)
	rows := make([]capturedRow, 0, len(elems))
	var unknown []string
	if !st.hasPK {
		unknown = unwritten(st, readInsertClauses(stmt).columns)
	}
	for _, e := range elems {
		if !e.IsValid() {
			continue
		}
		keys, _ := keysOf(stmt.Context, st.fields, e, st.hasPK)
		rows = append(rows, capturedRow{op: OpCreate, held: e, keys: keys, unknown: unknown})
	}
	return rows
}

// unwritten are the identity columns of a model without a primary key that an INSERT of the given
// columns did not write: the model value holds a value for each, the row its default.
func unwritten(st *statementState, columns []string) []string {
	var out []string
	for _, f := range st.fields {
		if !contains(columns, f.DBName) {
			out = append(out, f.DBName)
		}
	}
	return out
}

func mapRows(st *statementState, given, returned []map[string]any) []capturedRow {
	rows := make([]capturedRow, 0, len(given))
	for i, m := range given {
		if m == nil {
			continue
		}
		var ret map[string]any
		if i < len(returned) {
			ret = returned[i]
		}
		rows = append(rows, mapRow(st, m, ret))
	}
	return rows
}

func mapRow(st *statementState, m, returned map[string]any) capturedRow {
	keys, complete := keysFromMap(st.fields, m, st.hasPK)
	if !complete && returned != nil {
		keys, _ = keysFromMap(st.fields, returned, st.hasPK)
	}
	row := capturedRow{op: OpCreate, keys: keys, values: m}
	if !st.hasPK {
		// A column the map does not name holds its default, not the nil keysFromMap gives it.
		for _, f := range st.fields {
			if _, ok := m[f.DBName]; !ok {
				if _, ok := m[f.Name]; !ok {
					row.unknown = append(row.unknown, f.DBName)
				}
			}
		}
	}
	return row
}

// readBack reads the stored row of each captured row by its key, in the same transaction. On MySQL it
// locks them (FOR UPDATE also makes MySQL read the latest version rather than the transaction's
// snapshot); on PostgreSQL the rows were written by this transaction, which holds their locks, and a
// FOR UPDATE would only write a lock into each row again; SQLite has no row locks, and the
// transaction's write lock is held.
func (p *Capturer) readBack(db *gorm.DB, st *statementState, pool gorm.ConnPool, rows []capturedRow) error {
	keys := make([][]any, 0, len(rows))
	for _, r := range rows {
		if r.unknown == nil {
			keys = append(keys, r.keys)
		} // else a row without a key, part of which is unknown: it cannot be found, or may find another
	}
	if len(keys) == 0 {
		return nil
	}
	lock := db.Dialector.Name() == "mysql"
	found, err := readByKeys(db, pool, db.Statement, st.schema, st.fields, keys, modelColumns(st.schema), nil, lock)
	if err != nil {
		return fmt.Errorf("read back the rows written: %w", err)
	}
	byKey := make(map[string]readRow, len(found))
	for _, r := range found {
		k, _ := keysOf(db.Statement.Context, st.fields, r.elem, false)
		byKey[keyString(k)] = r
	}
	for i := range rows {
		if rows[i].unknown == nil {
			rows[i].stored = byKey[keyString(rows[i].keys)]
		}
	}
	return nil
}

// heldByKey indexes the statement's model values by key, to pair rows the database returned with the
// values GORM holds for them.
func heldByKey(db *gorm.DB, st *statementState) map[string]reflect.Value {
	if !st.hasPK {
		return nil
	}
	elems := structElems(db.Statement.ReflectValue)
	if len(elems) == 0 || elems[0].IsValid() && elems[0].Type() != st.schema.ModelType {
		return nil
	}
	byKey := make(map[string]reflect.Value, len(elems))
	for _, e := range elems {
		if !e.IsValid() {
			continue
		}
		if k, complete := keysOf(db.Statement.Context, st.fields, e, true); complete {
			byKey[keyString(k)] = e
		}
	}
	return byKey
}

// classifyReturned decides, right after the write, what each returned row went through. The
// returned rows are the rows the write wrote, no more: an upsert's skipped rows are not among them.
// What is left to tell is an insert from an update: PostgreSQL says it per row (xmax); on SQLite an
// inserted row has a rowid above every row that existed before (or, with an INTEGER PRIMARY KEY, the
// key the row supplied, which did not exist); a row returned twice was inserted and then updated by a
// later row of the same statement.
func (w *write) classifyReturned(ctx context.Context) error {
	var supplied map[string]bool
	sqliteUpsert := w.ins != nil && w.ins.upserts() && w.db.Dialector.Name() == "sqlite"
	if sqliteUpsert && (w.info.rowidKey || !w.info.hasRowid) {
		supplied = map[string]bool{}
		names := fieldNames(w.st.fields)
		for i := range w.ins.values {
			if k, ok := w.ins.tuple(i, names); ok {
				supplied[keyString(k)] = true
			}
		}
	}
	var replaced map[string]bool
	if w.ins != nil && w.ins.modifier == modifierReplace {
		replaced = make(map[string]bool, len(w.pre))
		for _, r := range w.pre {
			_, ks := w.key(r)
			replaced[ks] = true
		}
	}
	seen := make(map[string]bool, len(w.returned))
	for i := range w.returned {
		r := &w.returned[i]
		r.op = w.st.op
		if w.ins == nil {
			continue
		}
		_, ks := w.key(r.readRow)
		switch {
		case seen[ks]:
			r.op = OpUpdate
		case replaced != nil:
			if replaced[ks] {
				r.op = OpUpdate // REPLACE deleted the row with this key and inserted it anew
			} else {
				r.op = OpCreate
			}
		case !w.ins.upserts():
			r.op = OpCreate
		case w.db.Dialector.Name() == "postgres":
			r.op = OpUpdate
			if r.inserted {
				r.op = OpCreate
			}
		case sqliteUpsert:
			inserted := false
			switch {
			case !w.info.hasRowid:
				if !supplied[ks] {
					return fmt.Errorf("%w: upsert into %s (WITHOUT ROWID) returned key %s, which no row supplied: generated, or an existing row's found by another unique key", ErrUnsupportedWrite, w.db.Statement.Table, ks)
				}
				inserted = !w.existing[ks]
			case !w.maxRowid.Valid || r.rowid > w.maxRowid.Int64:
				inserted = true
			case w.info.rowidKey && supplied[ks] && !w.existing[ks]:
				inserted = true
			}
			r.op = OpUpdate
			if inserted {
				r.op = OpCreate
			}
		}
		seen[ks] = true
	}
	if replaced == nil {
		return nil
	}
	// Rows REPLACE deleted under another unique key: the conflicting rows whose key did not come
	// back and that are gone now.
	var gone [][]any
	var goneRows []readRow
	for _, r := range w.pre {
		k, ks := w.key(r)
		if !seen[ks] {
			gone = append(gone, k)
			goneRows = append(goneRows, r)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	still, err := readByKeys(w.db, w.ConnPool, w.db.Statement, w.st.schema, w.st.fields, gone, w.st.fields, nil, false)
	if err != nil {
		return err
	}
	exists := w.byKey(still)
	for _, r := range goneRows {
		if _, ks := w.key(r); !exists[ks].elem.IsValid() {
			w.returned = append(w.returned, returnedRow{readRow: r, op: OpDelete})
		}
	}
	return nil
}

// lastInserted returns the index of the last returned row that was inserted, or -1.
func (w *write) lastInserted() int {
	for i := len(w.returned) - 1; i >= 0; i-- {
		if w.returned[i].op == OpCreate {
			return i
		}
	}
	return -1
}

// returnedRows turns the rows the write returned into captured rows, paired with the model values
// GORM holds (which GORM has filled from RETURNING by now).
func (w *write) returnedRows() ([]capturedRow, error) {
	held := heldByKey(w.db, w.st)
	var maps []map[string]any
	if w.ins != nil && !w.ins.conflict && w.ins.modifier == modifierNone {
		// A plain insert returns its rows in the order given.
		switch dest := w.db.Statement.Dest.(type) {
		case []map[string]any:
			maps = dest
		case *[]map[string]any:
			maps = *dest
		case map[string]any:
			maps = []map[string]any{dest}
		case *map[string]any:
			maps = []map[string]any{*dest}
		}
	}
	values := setValues(w.set)
	rows := make([]capturedRow, 0, len(w.returned))
	for i, r := range w.returned {
		keys, ks := w.key(r.readRow)
		row := capturedRow{op: r.op, keys: keys, held: held[ks], assigned: w.assigned(r.op)}
		if w.stored {
			row.stored = r.readRow
		}
		switch {
		case i < len(maps):
			row.values = maps[i]
		case w.st.op == OpUpdate:
			row.values = values
		}
		if w.st.single && !row.held.IsValid() {
			row.held = w.db.Statement.ReflectValue
		}
		rows = append(rows, row)
	}
	if w.stored {
		return rows, w.rereadAfterTriggers(rows)
	}
	return rows, nil
}

// rereadAfterTriggers reads the rows the write inserted or updated again, by key, when the table has
// triggers that may have changed them after RETURNING reported them (tableInfo.laterTriggers). It runs
// after the write: on SQLite the write lock is held by then, so the catalog read cannot make the
// write wait on a lock it could not upgrade.
func (w *write) rereadAfterTriggers(rows []capturedRow) error {
	db, stmt := w.db, w.db.Statement
	if dialect := db.Dialector.Name(); dialect != "postgres" && dialect != "sqlite" {
		return nil // MySQL's triggers cannot write the table they fire on
	}
	if w.st.op == OpDelete && !w.soft {
		return nil // the rows are gone; RETURNING had them as they were deleted
	}
	info := w.info
	if info == nil {
		var err error
		if info, err = w.p.tableInfos.get(db, w.ConnPool, stmt.Context, stmt.Table); err != nil {
			return err
		}
	}
	if !info.laterTriggers {
		return nil
	}
	written := make([]capturedRow, 0, len(rows))
	at := make([]int, 0, len(rows))
	for i, r := range rows {
		if r.op != OpDelete || w.soft {
			written = append(written, r)
			at = append(at, i)
		}
	}
	if err := w.p.readBack(db, w.st, w.ConnPool, written); err != nil {
		return err
	}
	for j, i := range at {
		rows[i].stored = written[j].stored
	}
	return nil
}

// assigned returns the columns the statement assigned to a row that went through op.
func (w *write) assigned(op Op) []string {
	switch {
	case w.ins != nil && op == OpCreate:
		return w.ins.columns
	case w.ins != nil && op == OpUpdate:
		return w.ins.doUpdates
	case w.set != nil && (w.st.op == OpUpdate || w.soft):
		return assignedColumns(w.set)
	}
	return nil
}

// oneRows is the row of a one-row upsert on MySQL.
func (w *write) oneRows() ([]capturedRow, error) {
	if w.one == nil || !w.one.written {
		return nil, nil
	}
	row := capturedRow{op: w.one.op, keys: w.one.keys, assigned: w.assigned(w.one.op)}
	if elems := structElems(w.db.Statement.ReflectValue); len(elems) == 1 && elems[0].IsValid() && elems[0].Type() == w.st.schema.ModelType {
		row.held = elems[0]
	}
	rows := []capturedRow{row}
	if w.stored {
		return rows, w.p.readBack(w.db, w.st, w.ConnPool, rows)
	}
	return rows, nil
}

// classifyMany classifies a multi-row upsert on MySQL from the rows of its unique keys as they were
// before the write (locked, so unchanged since) and as they are after it: a row there only after was
// inserted, one whose assigned columns changed was updated, one gone under its key had its key changed
// by the update. Rows that hold no unique key at all cannot conflict and were inserted: their keys are
// those GORM read back (LAST_INSERT_ID() or RETURNING), which are right only while every row taking a
// generated key was inserted; when that cannot be vouched for the write fails. Where the driver
// reports the count of affected rows (not with RETURNING), it is checked against the classification.
func (w *write) classifyMany() ([]capturedRow, error) {
	db, stmt := w.db, w.db.Statement
	ctx := stmt.Context
	post, err := w.readConflicting(ctx, true)
	if err != nil {
		return nil, err
	}
	postBy := w.byKey(post)
	preBy := make(map[string]readRow, len(w.pre))
	var moved [][]any
	for _, r := range w.pre {
		k, ks := w.key(r)
		preBy[ks] = r
		if _, ok := postBy[ks]; !ok {
			moved = append(moved, k)
		}
	}
	if len(moved) > 0 {
		// Rows the update gave other unique values: read them by key.
		again, err := readByKeys(db, w.ConnPool, stmt, w.st.schema, w.st.fields, moved, w.readFields(), w.compareColumns(), true)
		if err != nil {
			return nil, err
		}
		for _, r := range again {
			_, ks := w.key(r)
			postBy[ks] = r
			post = append(post, r)
		}
	}

	held := heldByKey(db, w.st)
	supplied := map[string]bool{}
	names := fieldNames(w.st.fields)
	for i := range w.ins.values {
		if k, ok := w.ins.tuple(i, names); ok {
			supplied[keyString(k)] = true
		}
	}
	var rows []capturedRow
	seen := map[string]bool{}
	add := func(op Op, keys []any, r readRow) {
		ks := keyString(keys)
		seen[ks] = true
		row := capturedRow{op: op, keys: keys, held: held[ks], assigned: w.assigned(op)}
		if w.stored {
			row.stored = r
		}
		rows = append(rows, row)
	}
	var created, updated, unchanged, deleted, autoCreated int
	for _, r := range post {
		keys, ks := w.key(r)
		if seen[ks] {
			continue
		}
		before, existed := preBy[ks]
		switch {
		case !existed:
			created++
			if !supplied[ks] {
				autoCreated++
			}
			add(OpCreate, keys, r)
		case len(w.ins.doUpdates) > 0 && !sameValues(before.extra, r.extra):
			updated++
			add(OpUpdate, keys, r)
		default:
			unchanged++
			seen[ks] = true
		}
	}
	for _, r := range w.pre {
		keys, ks := w.key(r)
		if _, ok := postBy[ks]; !ok {
			deleted++
			add(OpDelete, keys, r)
		}
	}

	// Rows holding no unique key, and the rows taking a generated key that hold one.
	var keyless []int
	autoWithKey, dups := 0, 0
	tuplesSeen := map[string]bool{}
	for i := range w.ins.values {
		holds := false
		for s, set := range w.info.uniqueKeys {
			if t, ok := w.ins.tuple(i, set); ok {
				holds = true
				ts := fmt.Sprint(s) + ":" + keyString(t)
				if tuplesSeen[ts] {
					dups++
				}
				tuplesSeen[ts] = true
			}
		}
		switch {
		case !holds:
			keyless = append(keyless, i)
		case w.autoKey(i):
			autoWithKey++
		}
	}
	if len(keyless) > 0 {
		if autoCreated != autoWithKey && !(w.viaQuery && w.ins.conflict) {
			return nil, fmt.Errorf("%w: rows without a unique key in an upsert whose other rows took no generated key: their keys cannot be told; write them in a statement of their own", ErrUnsupportedWrite)
		}
		if w.viaQuery && w.ins.modifier == modifierIgnore && created+len(keyless) != len(w.ins.values) {
			return nil, fmt.Errorf("%w: INSERT IGNORE … RETURNING skipped rows of a statement that has rows without a unique key: their keys cannot be told", ErrUnsupportedWrite)
		}
		elems := structElems(stmt.ReflectValue)
		var maps []map[string]any
		switch dest := stmt.Dest.(type) {
		case []map[string]any:
			maps = dest
		case *[]map[string]any:
			maps = *dest
		}
		for _, i := range keyless {
			var r capturedRow
			switch {
			case i < len(maps):
				r = mapRow(w.st, maps[i], nil)
			case i < len(elems) && elems[i].IsValid():
				keys, _ := keysOf(ctx, w.st.fields, elems[i], w.st.hasPK)
				r = capturedRow{op: OpCreate, keys: keys, held: elems[i]}
				if !w.st.hasPK {
					r.unknown = unwritten(w.st, w.ins.columns)
				}
			default:
				return nil, fmt.Errorf("%w: row %d of the upsert has no model value to read its key from", ErrUnsupportedWrite, i)
			}
			if seen[keyString(r.keys)] {
				continue
			}
			seen[keyString(r.keys)] = true
			r.assigned = w.ins.columns
			rows = append(rows, r)
		}
		if w.stored {
			if err := w.p.readBack(db, w.st, w.ConnPool, rows[len(rows)-len(keyless):]); err != nil {
				return nil, err
			}
		}
	}

	if w.hasAffected {
		n := int64(len(keyless))
		low, high := int64(created)+n, int64(created)+n
		if w.ins.modifier != modifierIgnore {
			low += 2 * int64(updated)
			high = low + int64(unchanged) + 2*int64(deleted+dups)
		}
		if w.affected < low || w.affected > high {
			w.p.tableInfos.forget(db.Dialector.Name(), stmt.Table)
			return nil, fmt.Errorf("%w: the upsert affected %d rows where the rows read around it account for %d to %d", ErrConcurrentChange, w.affected, low, high)
		}
	}
	return rows, nil
}

// key returns the key of a row read back, and its keyString. A model without a primary key is
// identified by all its columns, which may hold NULL: nil there, not the Go type's zero value.
func (w *write) key(r readRow) ([]any, string) {
	k, _ := keysOf(w.db.Statement.Context, w.st.fields, r.elem, false)
	if len(r.nulls) > 0 {
		for i, f := range w.st.fields {
			if contains(r.nulls, f.DBName) {
				k[i] = nil
			}
		}
	}
	return k, keyString(k)
}

// byKey indexes rows read back by their key.
func (w *write) byKey(rows []readRow) map[string]readRow {
	m := make(map[string]readRow, len(rows))
	for _, r := range rows {
		_, ks := w.key(r)
		m[ks] = r
	}
	return m
}

// sameValues compares raw column values read the same way twice.
func sameValues(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, xok := a[i].([]byte)
		y, yok := b[i].([]byte)
		if xok && yok {
			if !bytes.Equal(x, y) {
				return false
			}
			continue
		}
		if !reflect.DeepEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// writtenRows lists the rows an update or delete wrote.
func (p *Capturer) writtenRows(db *gorm.DB, st *statementState, w *write) (capturedRows, error) {
	if w != nil && !w.fired {
		return capturedRows{}, errBypassed
	}
	if w == nil || w.strategy == plainWrite {
		row := capturedRow{op: st.op, keys: st.singleKeys, held: db.Statement.ReflectValue}
		if w != nil {
			row.values, row.assigned = setValues(w.set), assignedColumns(w.set)
		}
		return listedRows([]capturedRow{row}), nil
	}
	var (
		rows []capturedRow
		err  error
	)
	switch w.strategy {
	case returningWrite:
		if w.compact {
			return w.keyedRows(nil, w.st.op == OpUpdate), nil
		}
		rows, err = w.returnedRows()
	case lockedWrite:
		if w.compact {
			return w.lockedKeyedRows()
		}
		rows, err = w.lockedRows()
	default:
		err = fmt.Errorf("outboxplugin: %s with write strategy %d", st.op, w.strategy)
	}
	return listedRows(rows), err
}

// keyedRows are the rows of a compact write (see write.compact): those at the indexes only lists, or
// all of them, made from their keys one at a time when their events are built, each paired with the
// model value GORM holds for it, if any. withValues gives each row the values of the SET clause.
func (w *write) keyedRows(only []int32, withValues bool) capturedRows {
	held := heldByKey(w.db, w.st)
	var values map[string]any
	if withValues {
		values = setValues(w.set)
	}
	assigned := w.assigned(w.st.op)
	n := w.keys.len()
	if only != nil {
		n = len(only)
	}
	return capturedRows{n: n, make: func(i int) capturedRow {
		if only != nil {
			i = int(only[i])
		}
		keys := w.keys.at(i)
		row := capturedRow{op: w.st.op, keys: keys, assigned: assigned, values: values}
		if len(held) > 0 {
			row.held = held[keyString(keys)]
		}
		if w.st.single && !row.held.IsValid() {
			row.held = w.db.Statement.ReflectValue
		}
		return row
	}}
}

// lockedKeyedRows is lockedRows for a compact write: every key it locked, except, for an UPDATE, the
// rows MySQL left as they were, found by reading the assigned columns again, a chunk of keys at a
// time, when the count says some were.
func (w *write) lockedKeyedRows() (capturedRows, error) {
	locked := w.keys.len()
	if locked == 0 {
		return capturedRows{}, nil
	}
	isUpdate := w.st.op == OpUpdate || w.soft
	var only []int32
	switch {
	case w.affected == int64(locked):
	case !isUpdate || w.affected > int64(locked):
		return capturedRows{}, fmt.Errorf("%w: %d rows locked, %d written", ErrConcurrentChange, locked, w.affected)
	default:
		db, stmt := w.db, w.db.Statement
		only = make([]int32, 0, w.affected)
		for start := 0; start < locked; start += maxKeysPerRead {
			end := min(start+maxKeysPerRead, locked)
			after, err := readByKeys(db, w.ConnPool, stmt, w.st.schema, w.st.fields, w.keys.chunk(start, end), w.st.fields, w.compareColumns(), true)
			if err != nil {
				return capturedRows{}, err
			}
			afterBy := make(map[string][]byte, len(after))
			for _, r := range after {
				_, ks := w.key(r)
				afterBy[ks] = encodeRawValues(r.extra)
			}
			for i := start; i < end; i++ {
				if a, ok := afterBy[keyString(w.keys.at(i))]; ok && !bytes.Equal(w.extras.at(i), a) {
					only = append(only, int32(i))
				}
			}
		}
		if int64(len(only)) != w.affected {
			return capturedRows{}, fmt.Errorf("%w: %d rows changed, %d found changed", ErrConcurrentChange, w.affected, len(only))
		}
	}
	return w.keyedRows(only, isUpdate), nil
}

// lockedRows are the rows a locked write changed: every key it locked, except, for an UPDATE, rows
// MySQL left as they were (it counts changed rows, not matched ones), found by reading the assigned
// columns again when the count says some were.
func (w *write) lockedRows() ([]capturedRow, error) {
	db, stmt := w.db, w.db.Statement
	if len(w.pre) == 0 {
		return nil, nil
	}
	keys := make([][]any, len(w.pre))
	for i, r := range w.pre {
		keys[i], _ = w.key(r)
	}
	isUpdate := w.st.op == OpUpdate || w.soft
	written := w.pre
	switch {
	case w.affected == int64(len(w.pre)):
	case !w.st.hasPK && isUpdate && w.affected < int64(len(w.pre)):
		// Rows without a key cannot be read again to tell which the update left as they were: each
		// row it matched gets its event.
	case !isUpdate || w.affected > int64(len(w.pre)):
		return nil, fmt.Errorf("%w: %d rows locked, %d written", ErrConcurrentChange, len(w.pre), w.affected)
	default:
		after, err := readByKeys(db, w.ConnPool, stmt, w.st.schema, w.st.fields, keys, w.st.fields, w.compareColumns(), true)
		if err != nil {
			return nil, err
		}
		afterBy := w.byKey(after)
		written = nil
		for i, r := range w.pre {
			if a, ok := afterBy[keyString(keys[i])]; ok && !sameValues(r.extra, a.extra) {
				written = append(written, r)
			}
		}
		if int64(len(written)) != w.affected {
			return nil, fmt.Errorf("%w: %d rows changed, %d found changed", ErrConcurrentChange, w.affected, len(written))
		}
	}
	held := heldByKey(db, w.st)
	values := setValues(w.set)
	rows := make([]capturedRow, len(written))
	for i, r := range written {
		k, ks := w.key(r)
		rows[i] = capturedRow{op: w.st.op, keys: k, held: held[ks], assigned: w.assigned(w.st.op)}
		if w.st.single && !rows[i].held.IsValid() {
			rows[i].held = stmt.ReflectValue
		}
		if isUpdate {
			rows[i].values = values
		} else if w.stored {
			rows[i].stored = r
		}
	}
	if isUpdate && !w.st.hasPK {
		// Rows without a key cannot be read back after the update: what it did not assign is as
		// the locked read found it, what it assigned is not known.
		unknown := assignedColumns(w.set)
		for i, r := range written {
			rows[i].unknown = unknown
			if w.stored {
				rows[i].stored = r
			}
		}
		return rows, nil
	}
	if w.stored && isUpdate {
		return rows, w.p.readBack(db, w.st, w.ConnPool, rows)
	}
	return rows, nil
}

// setValues keeps the assignments of an update whose values are known: columns set to an SQL
// expression are left out.
func setValues(set clause.Set) map[string]any {
	if set == nil {
		return nil
	}
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
