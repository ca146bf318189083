package capture

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/gorm-outbox/outboxplugin/internal/msgid"
)

// Changeset is what user code sees of one captured row (outboxplugin.Changeset documents each field;
// the root makes its public Changeset of it, field by field).
type Changeset struct {
	Type    Op
	Model   string
	Table   string
	Schema  *schema.Schema
	Keys    map[string]any
	Row     any
	Changes map[string]any
	Context context.Context
}

// Shape is the event of a captured row as a customizer sees and may change it. Its fields are those of
// outboxplugin.Event, in the same order and of the same types, so that the root converts a *Shape to
// an *Event as it is.
type Shape struct {
	Type          string
	AggregateType string
	AggregateID   string
	Payload       any
	Headers       map[string]string
	Skip          bool
	DeliverAt     time.Time
}

// customizes reports whether the model implements EventCustomizer (on its value or its pointer).
func (p *Capturer) customizes(t reflect.Type) bool {
	if v, ok := p.customizers.Load(t); ok {
		return v.(bool)
	}
	ok := p.cfg.Customizer != nil && reflect.PointerTo(t).Implements(p.cfg.Customizer)
	p.customizers.Store(t, ok)
	return ok
}

// wantsChangeset reports whether events of the model are shaped by user code, which sees Changesets.
func (p *Capturer) wantsChangeset(s *schema.Schema) bool {
	return p.cfg.EventType != nil || p.customizes(s.ModelType)
}

// capturedRows are the rows a statement wrote: listed, or — for an update or delete by condition,
// whose rows the write learnt as their keys alone — made one at a time from those keys when their
// events are built, so that a statement of a million rows never holds a million captured rows.
type capturedRows struct {
	n    int
	list []capturedRow
	make func(i int) capturedRow // row i, when list is nil
}

func listedRows(rows []capturedRow) capturedRows { return capturedRows{n: len(rows), list: rows} }

// eventChunk is how many rows' events are built at a time: one INSERT's worth, which the transaction
// writes as soon as it holds it (txwatch.go).
const eventChunk = MaxRowsPerInsert

// writeEvents turns the captured rows of one statement into events and hands them to the statement's
// transaction, which writes them with the rest of its events (insertEvents), a chunk at a time: the
// events of a large statement are written as they are built, not held all at once. Any failure is
// added to db, which fails the GORM call and rolls its transaction back.
func (p *Capturer) writeEvents(db *gorm.DB, st *statementState, rows capturedRows) error {
	if rows.n == 0 {
		return nil
	}
	origin := string(st.op) + " " + st.schema.Name
	b, err := p.newEventBuilder(db, st)
	var buf []capturedRow
	for start := 0; err == nil && start < rows.n; start += eventChunk {
		end := min(start+eventChunk, rows.n)
		chunk := rows.list
		if chunk != nil {
			chunk = chunk[start:end]
		} else {
			buf = buf[:0]
			for i := start; i < end; i++ {
				buf = append(buf, rows.make(i))
			}
			chunk = buf
		}
		var events []Event
		if events, err = b.build(chunk); err == nil && len(events) > 0 {
			err = p.Insert(db, db.Statement.ConnPool, events, origin)
		}
	}
	if err != nil {
		return fmt.Errorf("outboxplugin: %s: %w", origin, err)
	}
	return nil
}

// eventBuilder makes the events of one statement's rows: what they share (creation time, headers)
// is worked out once.
type eventBuilder struct {
	p         *Capturer
	db        *gorm.DB
	st        *statementState
	headerMap map[string]string
	headers   *string
	customize bool
	createdAt time.Time
	keyNames  []string
}

func (p *Capturer) newEventBuilder(db *gorm.DB, st *statementState) (*eventBuilder, error) {
	b := &eventBuilder{p: p, db: db, st: st, customize: p.customizes(st.schema.ModelType), createdAt: now(),
		keyNames: fieldNames(st.fields)}
	if p.cfg.Headers != nil {
		b.headerMap = p.cfg.Headers(db.Statement.Context)
	}
	var err error
	b.headers, err = EncodeHeaders(b.headerMap)
	return b, err
}

func (b *eventBuilder) build(rows []capturedRow) ([]Event, error) {
	p, db, st, s := b.p, b.db, b.st, b.st.schema
	ctx := db.Statement.Context
	events := make([]Event, 0, len(rows))
	for i := range rows {
		row := &rows[i]
		payload, err := p.defaultPayload(ctx, st, b.keyNames, row)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrEncodePayload, err)
		}
		aggID, err := aggregateID(row.keys, st.hasPK)
		if err != nil {
			return nil, fmt.Errorf("%w: key: %w", ErrEncodePayload, err)
		}
		ev := Event{
			Type:          s.Name + "_" + string(row.op),
			AggregateType: s.Name,
			AggregateID:   aggID,
			Payload:       payload,
			Headers:       b.headers,
			CreatedAt:     b.createdAt,
		}
		if p.cfg.EventType != nil || b.customize {
			cs := p.changeset(db, st, b.keyNames, row)
			if p.cfg.EventType != nil {
				ev.Type = p.cfg.EventType(&cs)
			}
			if b.customize {
				skip, err := p.customize(s, row, &cs, &ev, b.headerMap)
				if err != nil {
					return nil, err
				}
				if skip {
					continue
				}
			}
		}
		if ev.Type == "" {
			return nil, ErrEmptyEventType
		}
		ev.MessageID = msgid.New()
		events = append(events, ev)
	}
	return events, nil
}

// modelValue is the model value the public view of a row points to: the one GORM holds, else the row
// as read back; invalid when there is neither.
func (r *capturedRow) modelValue() reflect.Value {
	if r.held.IsValid() {
		return r.held
	}
	return r.stored.elem
}

// customize hands the event to the model's CustomizeOutboxEvent and applies what it changed.
func (p *Capturer) customize(s *schema.Schema, row *capturedRow, cs *Changeset, ev *Event, headers map[string]string) (skip bool, err error) {
	var target reflect.Value
	if v := row.modelValue(); v.IsValid() && v.CanAddr() {
		target = v.Addr()
	} else {
		target = reflect.New(s.ModelType)
		if v.IsValid() {
			target.Elem().Set(v)
		}
	}
	e := Shape{
		Type:          ev.Type,
		AggregateType: ev.AggregateType,
		AggregateID:   ev.AggregateID,
		Payload:       json.RawMessage(ev.Payload),
		Headers:       make(map[string]string, len(headers)),
	}
	maps.Copy(e.Headers, headers)
	if err := p.cfg.Customize(target.Interface(), cs, &e); err != nil {
		return false, fmt.Errorf("CustomizeOutboxEvent: %w", err)
	}
	if e.Skip {
		return true, nil
	}
	payload, err := EncodePayload(e.Payload)
	if err != nil {
		return false, err
	}
	hdr, err := EncodeHeaders(e.Headers)
	if err != nil {
		return false, err
	}
	ev.Type, ev.AggregateType, ev.AggregateID = e.Type, e.AggregateType, e.AggregateID
	ev.Payload, ev.Headers = payload, hdr
	ev.DeliverAt = Due(e.DeliverAt, ev.CreatedAt)
	return false, nil
}

// changeset builds the public view of a captured row.
func (p *Capturer) changeset(db *gorm.DB, st *statementState, keyNames []string, row *capturedRow) Changeset {
	stmt := db.Statement
	cs := Changeset{
		Type:    row.op,
		Model:   st.schema.Name,
		Table:   stmt.Table,
		Schema:  st.schema,
		Keys:    make(map[string]any, len(keyNames)),
		Context: stmt.Context,
	}
	for i, name := range keyNames {
		if !contains(row.unknown, name) {
			cs.Keys[name] = row.keys[i]
		}
	}
	if v := row.modelValue(); v.IsValid() {
		if v.CanAddr() {
			cs.Row = v.Addr().Interface()
		} else {
			cs.Row = v.Interface()
		}
	}
	switch {
	case row.op == OpDelete && row.assigned == nil:
	case row.stored.elem.IsValid():
		names, values := assignedValues(stmt.Context, st.schema, row.stored, row.assigned)
		names, values = known(names, values, row.unknown)
		cs.Changes = make(map[string]any, len(names))
		for i, n := range names {
			cs.Changes[n] = values[i]
		}
	case row.values != nil:
		cs.Changes = row.values
	case row.held.IsValid() && row.op == OpCreate:
		// The values sent: the model value's, for the columns the INSERT wrote.
		names, values := assignedValues(stmt.Context, st.schema, readRow{elem: row.held}, row.assigned)
		cs.Changes = make(map[string]any, len(names))
		for i, n := range names {
			cs.Changes[n] = values[i]
		}
	}
	return cs
}

// defaultPayload encodes the payload of the configured mode. PayloadRow and PayloadChanges take the
// values from the row as stored, which the write read back; a row without one (possible only for a
// model GORM cannot read) falls back to its key.
func (p *Capturer) defaultPayload(ctx context.Context, st *statementState, keyNames []string, row *capturedRow) (string, error) {
	mode := p.cfg.Payload
	if mode == PayloadKey || !row.stored.elem.IsValid() || (mode == PayloadChanges && row.op == OpDelete && row.assigned == nil) {
		names, values := known(keyNames, row.keys, row.unknown)
		b, err := appendJSONObject(make([]byte, 0, 32), names, values)
		return string(b), err
	}
	var names []string
	var values []any
	if mode == PayloadRow {
		names, values = rowColumns(ctx, st.schema, row.stored.elem, row.stored.nulls)
	} else {
		// The key first, then the assigned columns.
		assignedNames, assignedVals := assignedValues(ctx, st.schema, row.stored, row.assigned)
		names = append(make([]string, 0, len(keyNames)+len(assignedNames)), keyNames...)
		values = make([]any, len(keyNames), len(names)+len(assignedNames))
		for i, name := range keyNames {
			if f := st.schema.LookUpField(name); f != nil {
				values[i] = columnValue(ctx, f, row.stored.elem, row.stored.nulls) // a row without a key: NULLs too
			}
		}
		for i, n := range assignedNames {
			if !contains(keyNames, n) {
				names = append(names, n)
				values = append(values, assignedVals[i])
			}
		}
	}
	names, values = known(names, values, row.unknown)
	b, err := appendJSONObject(make([]byte, 0, 256), names, values)
	return string(b), err
}

// known leaves the unknown columns out of names and values (copies, when there are any).
func known(names []string, values []any, unknown []string) ([]string, []any) {
	if len(unknown) == 0 {
		return names, values
	}
	outNames := make([]string, 0, len(names))
	outValues := make([]any, 0, len(values))
	for i, n := range names {
		if !contains(unknown, n) {
			outNames = append(outNames, n)
			outValues = append(outValues, values[i])
		}
	}
	return outNames, outValues
}

// assignedValues reads the assigned columns that are model fields from a stored row, in the model's
// field order.
func assignedValues(ctx context.Context, s *schema.Schema, stored readRow, assigned []string) ([]string, []any) {
	names := make([]string, 0, len(assigned))
	values := make([]any, 0, len(assigned))
	for _, name := range s.DBNames {
		f := s.FieldsByDBName[name]
		if f == nil || !f.Readable || !contains(assigned, name) {
			continue
		}
		names = append(names, name)
		values = append(values, columnValue(ctx, f, stored.elem, stored.nulls))
	}
	return names, values
}
