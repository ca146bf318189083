package outboxplugin

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// pendingEvent is one outbox row about to be inserted.
type pendingEvent struct {
	messageID     string
	eventType     string
	aggregateType string
	aggregateID   string
	payload       string
	headers       *string // nil: SQL NULL
	createdAt     time.Time
}

var customizerType = reflect.TypeFor[EventCustomizer]()

// customizes reports whether the model implements EventCustomizer (on its value or its pointer).
func (p *Plugin) customizes(t reflect.Type) bool {
	if v, ok := p.customizers.Load(t); ok {
		return v.(bool)
	}
	ok := reflect.PointerTo(t).Implements(customizerType)
	p.customizers.Store(t, ok)
	return ok
}

// wantsChangeset reports whether events of the model are shaped by user code, which sees Changesets.
func (p *Plugin) wantsChangeset(s *schema.Schema) bool {
	return p.cfg.eventType != nil || p.customizes(s.ModelType)
}

// writeEvents turns the captured rows of one statement into events and inserts them, on the
// statement's connection, in one multi-row INSERT. Any failure is added to db, which fails the GORM
// call and rolls its transaction back.
func (p *Plugin) writeEvents(db *gorm.DB, st *statementState, rows []capturedRow) {
	if len(rows) == 0 {
		return
	}
	events, err := p.buildEvents(db, st, rows)
	if err == nil && len(events) > 0 {
		err = p.insertEvents(db, db.Statement.ConnPool, events)
	}
	if err != nil {
		db.AddError(fmt.Errorf("outboxplugin: %s %s: %w", st.op, db.Statement.Schema.Name, err))
	}
}

func (p *Plugin) buildEvents(db *gorm.DB, st *statementState, rows []capturedRow) ([]pendingEvent, error) {
	stmt := db.Statement
	s := stmt.Schema
	ctx := stmt.Context

	var headerMap map[string]string
	if p.cfg.headers != nil {
		headerMap = p.cfg.headers(ctx)
	}
	headers, err := encodeHeaders(headerMap)
	if err != nil {
		return nil, err
	}

	customize := p.customizes(s.ModelType)
	createdAt := now()
	keyNames := make([]string, len(st.fields))
	for i, f := range st.fields {
		keyNames[i] = f.DBName
	}

	events := make([]pendingEvent, 0, len(rows))
	for i := range rows {
		row := &rows[i]
		payload, err := p.defaultPayload(db, st, keyNames, row)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrEncodePayload, err)
		}
		aggID, err := aggregateID(row.keys, st.hasPK)
		if err != nil {
			return nil, fmt.Errorf("%w: key: %w", ErrEncodePayload, err)
		}
		ev := pendingEvent{
			eventType:     s.Name + "_" + string(row.op),
			aggregateType: s.Name,
			aggregateID:   aggID,
			payload:       payload,
			headers:       headers,
			createdAt:     createdAt,
		}
		if p.cfg.eventType != nil || customize {
			cs := p.changeset(db, st, keyNames, row)
			if p.cfg.eventType != nil {
				ev.eventType = p.cfg.eventType(cs)
			}
			if customize {
				skip, err := p.customize(s, row, &cs, &ev, headerMap)
				if err != nil {
					return nil, err
				}
				if skip {
					continue
				}
			}
		}
		if ev.eventType == "" {
			return nil, ErrEmptyEventType
		}
		ev.messageID = newMessageID()
		events = append(events, ev)
	}
	return events, nil
}

// customize hands the event to the model's CustomizeOutboxEvent and applies what it changed.
func (p *Plugin) customize(s *schema.Schema, row *capturedRow, cs *Changeset, ev *pendingEvent, headers map[string]string) (skip bool, err error) {
	var target reflect.Value
	if row.elem.IsValid() && row.elem.CanAddr() {
		target = row.elem.Addr()
	} else {
		target = reflect.New(s.ModelType)
		if row.elem.IsValid() {
			target.Elem().Set(row.elem)
		}
	}
	e := Event{
		Type:          ev.eventType,
		AggregateType: ev.aggregateType,
		AggregateID:   ev.aggregateID,
		Payload:       json.RawMessage(ev.payload),
		Headers:       make(map[string]string, len(headers)),
	}
	maps.Copy(e.Headers, headers)
	if err := target.Interface().(EventCustomizer).CustomizeOutboxEvent(cs, &e); err != nil {
		return false, fmt.Errorf("CustomizeOutboxEvent: %w", err)
	}
	if e.Skip {
		return true, nil
	}
	payload, err := encodePayload(e.Payload)
	if err != nil {
		return false, err
	}
	hdr, err := encodeHeaders(e.Headers)
	if err != nil {
		return false, err
	}
	ev.eventType, ev.aggregateType, ev.aggregateID = e.Type, e.AggregateType, e.AggregateID
	ev.payload, ev.headers = payload, hdr
	return false, nil
}

// changeset builds the public view of a captured row.
func (p *Plugin) changeset(db *gorm.DB, st *statementState, keyNames []string, row *capturedRow) Changeset {
	stmt := db.Statement
	cs := Changeset{
		Type:    row.op,
		Model:   stmt.Schema.Name,
		Table:   stmt.Table,
		Schema:  stmt.Schema,
		Keys:    make(map[string]any, len(keyNames)),
		Context: stmt.Context,
	}
	for i, name := range keyNames {
		cs.Keys[name] = row.keys[i]
	}
	if row.elem.IsValid() {
		if row.elem.CanAddr() {
			cs.Row = row.elem.Addr().Interface()
		} else {
			cs.Row = row.elem.Interface()
		}
	}
	switch {
	case row.op == ChangesetDelete:
	case row.changes != nil:
		cs.Changes = row.changes
	case row.elem.IsValid():
		names, values := rowColumns(stmt, row.elem)
		cs.Changes = make(map[string]any, len(names))
		for i, n := range names {
			cs.Changes[n] = values[i]
		}
	}
	return cs
}

// defaultPayload encodes the payload of the configured mode.
func (p *Plugin) defaultPayload(db *gorm.DB, st *statementState, keyNames []string, row *capturedRow) (string, error) {
	mode := p.cfg.payload
	if mode == PayloadKey || (row.op == ChangesetDelete && (mode == PayloadChanges || !row.elem.IsValid())) {
		b, err := appendJSONObject(make([]byte, 0, 32), keyNames, row.keys)
		return string(b), err
	}
	if row.elem.IsValid() && (mode == PayloadRow || row.op == ChangesetCreate) {
		names, values := rowColumns(db.Statement, row.elem)
		b, err := appendJSONObject(make([]byte, 0, 256), names, values)
		return string(b), err
	}
	// No row in memory (a map create, an update by condition): the key and the columns written.
	names := append([]string(nil), keyNames...)
	values := append([]any(nil), row.keys...)
	for _, name := range slices.Sorted(maps.Keys(row.changes)) {
		col := name
		if f := db.Statement.Schema.LookUpField(name); f != nil && f.DBName != "" {
			col = f.DBName
		}
		if slices.Contains(names, col) {
			continue
		}
		names = append(names, col)
		values = append(values, row.changes[name])
	}
	b, err := appendJSONObject(make([]byte, 0, 128), names, values)
	return string(b), err
}

// rowColumns reads every column of a model value, in the model's field order.
func rowColumns(stmt *gorm.Statement, elem reflect.Value) ([]string, []any) {
	s := stmt.Schema
	names := make([]string, 0, len(s.DBNames))
	values := make([]any, 0, len(s.DBNames))
	for _, name := range s.DBNames {
		f := s.FieldsByDBName[name]
		if f == nil || !f.Readable {
			continue
		}
		v, _ := f.ValueOf(stmt.Context, elem)
		names = append(names, name)
		values = append(values, v)
	}
	return names, values
}
