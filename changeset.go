package outboxplugin

import (
	"context"
	"database/sql/driver"
	"encoding"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"time"
	"unicode/utf8"

	"gorm.io/gorm/schema"
)

// ChangesetType is the kind of change a captured row went through.
type ChangesetType string

// The three kinds of change. Their strings end the default event type: User_create.
const (
	ChangesetCreate ChangesetType = "create"
	ChangesetUpdate ChangesetType = "update"
	ChangesetDelete ChangesetType = "delete"
)

func (t ChangesetType) String() string { return string(t) }

// Changeset is what the capture callbacks see of one changed row: one per row, built after the write
// and before the transaction commits.
type Changeset struct {
	Type ChangesetType
	// Model is the name of the model's Go type (User); Table the table written.
	Model string
	Table string
	// Schema is GORM's parsed model.
	Schema *schema.Schema
	// Keys holds the primary key by column name. A model without a primary key is identified by
	// all its columns, so Keys then holds the whole row.
	Keys map[string]any
	// Row is the model value GORM holds for this row after the write (a pointer to the struct), or
	// nil when the statement had none: updates and deletes by condition, and creates from maps.
	Row any
	// Changes holds the columns the statement wrote, by column name: every inserted column for a
	// create, the SET columns for an update, nothing for a delete.
	Changes map[string]any
	// Context is the context of the GORM call.
	Context context.Context
}

// Event is the outbox event a captured row becomes, as an EventCustomizer sees and may change it.
type Event struct {
	// Type defaults to "<Model>_<create|update|delete>" (or what WithEventType returns) and must
	// not be empty.
	Type string
	// AggregateType and AggregateID identify the aggregate the event belongs to; together they are
	// the message key that keeps one aggregate's events in order. They default to the model name and
	// the primary key (its value for a one-column key, a JSON array of the values for a composite
	// key, empty for a model without a primary key).
	AggregateType string
	AggregateID   string
	// Payload is encoded as JSON. It starts as the payload of the configured PayloadMode, as
	// json.RawMessage. A json.RawMessage, JSON or []byte value is used as it is (it must be valid
	// JSON); anything else is marshalled.
	Payload any
	// Headers start as the headers of WithContextHeaders; the map is never nil.
	Headers map[string]string
	// Skip set to true drops the event: the row is written without one.
	Skip bool
}

// EventCustomizer is implemented by models that shape or drop their own events. The plugin calls
// CustomizeOutboxEvent once per captured row, on the row's value when GORM holds one and on a zero
// value of the model otherwise, with the event already filled with its defaults. A returned error
// fails the write and rolls its transaction back.
type EventCustomizer interface {
	CustomizeOutboxEvent(c *Changeset, e *Event) error
}

// capturedRow is one changed row as the callbacks found it. The public Changeset is built from it only
// when an option or a customizer needs one, so the default path allocates little per row.
type capturedRow struct {
	op   ChangesetType
	elem reflect.Value // the struct value GORM holds for the row; invalid when there is none
	keys []any         // values of the identity fields, in order
	// changes is the map of a map create (nil otherwise); set is the SET of an update.
	changes map[string]any
}

// identityFields are the fields that identify a row: the primary key, or every column of a model
// that has none.
func identityFields(s *schema.Schema) []*schema.Field {
	if len(s.PrimaryFields) > 0 {
		return s.PrimaryFields
	}
	fields := make([]*schema.Field, 0, len(s.DBNames))
	for _, name := range s.DBNames {
		if f := s.FieldsByDBName[name]; f != nil && f.Readable {
			fields = append(fields, f)
		}
	}
	return fields
}

// keysOf reads the identity of a struct value; complete is false when a primary key field is zero.
func keysOf(ctx context.Context, fields []*schema.Field, rv reflect.Value, hasPK bool) (keys []any, complete bool) {
	keys = make([]any, len(fields))
	complete = true
	for i, f := range fields {
		v, zero := f.ValueOf(ctx, rv)
		keys[i] = v
		if zero && hasPK {
			complete = false
		}
	}
	return keys, complete
}

// keysFromMap reads the identity of a map create, keyed by column or field name.
func keysFromMap(fields []*schema.Field, m map[string]any, hasPK bool) (keys []any, complete bool) {
	keys = make([]any, len(fields))
	complete = true
	for i, f := range fields {
		v, ok := m[f.DBName]
		if !ok {
			v, ok = m[f.Name]
		}
		keys[i] = v
		if hasPK && (!ok || isZeroValue(v)) {
			complete = false
		}
	}
	return keys, complete
}

func isZeroValue(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.IsZero()
}

// keyString is the identity of a row as one comparable string, used to match keys found in the
// database with keys held in memory. Each part is preceded by its length, so that two different keys
// never give the same string, whatever bytes their parts hold (a separator byte could occur in a
// string key).
func keyString(keys []any) string {
	b := make([]byte, 0, 16*len(keys))
	for _, k := range keys {
		part := aggregateIDPart(k)
		b = strconv.AppendInt(b, int64(len(part)), 10)
		b = append(b, ':')
		b = append(b, part...)
	}
	return string(b)
}

// aggregateID formats the default aggregate id: the key value for a one-column primary key, a JSON
// array of the values for a composite key, empty for a model without a primary key.
func aggregateID(keys []any, hasPK bool) (string, error) {
	if !hasPK {
		return "", nil
	}
	if len(keys) == 1 {
		return aggregateIDPart(keys[0]), nil
	}
	b := []byte{'['}
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendJSONValue(b, k); err != nil {
			return "", err
		}
	}
	return string(append(b, ']')), nil
}

func aggregateIDPart(v any) string {
	v = plainValue(v)
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case []byte:
		return string(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case fmt.Stringer:
		return x.String()
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(rv.Int(), 10)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(rv.Uint(), 10)
	case reflect.String:
		return rv.String()
	}
	return fmt.Sprint(v)
}

// plainValue dereferences pointers and resolves driver.Valuer values that have no text or JSON form
// of their own (sql.NullString, gorm.DeletedAt), so that payloads carry what the database stores.
func plainValue(v any) any {
	for {
		switch x := v.(type) {
		case nil, string, int, int64, int32, uint, uint64, uint32, bool, float64, []byte, time.Time:
			return v
		case json.Marshaler, encoding.TextMarshaler:
			return v
		case driver.Valuer:
			rv := reflect.ValueOf(x)
			if rv.Kind() == reflect.Pointer && rv.IsNil() {
				return nil
			}
			dv, err := x.Value()
			if err != nil {
				return valuerError{err}
			}
			return dv
		}
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Pointer {
			return v
		}
		if rv.IsNil() {
			return nil
		}
		v = rv.Elem().Interface()
	}
}

type valuerError struct{ err error }

// appendJSONObject appends {"name":value,...}.
func appendJSONObject(b []byte, names []string, values []any) ([]byte, error) {
	b = append(b, '{')
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, name)
		b = append(b, ':')
		var err error
		if b, err = appendJSONValue(b, values[i]); err != nil {
			return nil, fmt.Errorf("column %s: %w", name, err)
		}
	}
	return append(b, '}'), nil
}

// appendJSONValue encodes the common column types directly and hands the rest to encoding/json.
func appendJSONValue(b []byte, v any) ([]byte, error) {
	v = plainValue(v)
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case valuerError:
		return nil, x.err
	case string:
		return appendJSONString(b, x), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(x), 10), nil
	case uint:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint64:
		return strconv.AppendUint(b, x, 10), nil
	case uint32:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case bool:
		return strconv.AppendBool(b, x), nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("unsupported value %v", x)
		}
	}
	enc, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, enc...), nil
}

// appendJSONString writes s as a JSON string. Plain ASCII is copied; anything that needs escaping or
// is not valid UTF-8 goes through encoding/json, which replaces invalid bytes with U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf || c == '<' || c == '>' || c == '&' {
			enc, _ := json.Marshal(s)
			return append(b, enc...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// encodePayload turns a customizer's payload into JSON text.
func encodePayload(p any) (string, error) {
	switch x := p.(type) {
	case json.RawMessage:
		return validJSON(x)
	case JSON:
		return validJSON(x)
	case []byte:
		return validJSON(x)
	}
	enc, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrEncodePayload, err)
	}
	return string(enc), nil
}

func validJSON(b []byte) (string, error) {
	if b == nil {
		return "null", nil
	}
	if !isJSON(b) {
		return "", fmt.Errorf("%w: %w", ErrEncodePayload, ErrInvalidJSON)
	}
	return string(b), nil
}

// isJSON reports whether b is a JSON document in UTF-8. json.Valid alone accepts invalid UTF-8
// inside strings (the decoder would replace it), which PostgreSQL's jsonb and MySQL's json refuse and
// SQLite would store and the relay publish as it is; JSON exchanged between systems must be UTF-8
// (RFC 8259, section 8.1).
func isJSON(b []byte) bool {
	return utf8.Valid(b) && json.Valid(b)
}

// encodeHeaders encodes headers as a JSON object; no headers is SQL NULL (nil).
func encodeHeaders(h map[string]string) (*string, error) {
	if len(h) == 0 {
		return nil, nil
	}
	enc, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode headers: %w", err)
	}
	s := string(enc)
	return &s, nil
}
