package capture

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"gorm.io/gorm/schema"
)

// The keys-and-values stage: which fields identify a row, how a key is read from a model value or a
// map and compared, how an aggregate id is formatted, and how a row the database returned is read
// into a model value with GORM's own field setters (serializers, scanners and pointer fields
// included), so that payloads encode stored values the way the model holds them.

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
		if !ok && len(fields) == 1 && hasPK {
			// Where GORM reads a generated key into a map it has no model for (db.Table(...)), it
			// stores it under "@id".
			v, ok = m["@id"]
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

// rowColumns reads every column of a model value, in the model's field order; the columns in nulls
// (those a stored row holds NULL in) read as nil.
func rowColumns(ctx context.Context, s *schema.Schema, elem reflect.Value, nulls []string) ([]string, []any) {
	names := make([]string, 0, len(s.DBNames))
	values := make([]any, 0, len(s.DBNames))
	for _, name := range s.DBNames {
		f := s.FieldsByDBName[name]
		if f == nil || !f.Readable {
			continue
		}
		names = append(names, name)
		values = append(values, columnValue(ctx, f, elem, nulls))
	}
	return names, values
}

// columnValue is the value of f in elem, or nil when the stored row holds NULL in f's column: a Go
// type without a NULL of its own (string, int, bool, time.Time) holds its zero value there, which is
// not what the row holds.
func columnValue(ctx context.Context, f *schema.Field, elem reflect.Value, nulls []string) any {
	if len(nulls) > 0 && contains(nulls, f.DBName) {
		return nil
	}
	v, _ := f.ValueOf(ctx, elem)
	return v
}

// modelColumns are the columns of the model that a stored row is read with: every readable field
// that has a column.
func modelColumns(s *schema.Schema) []*schema.Field {
	fields := make([]*schema.Field, 0, len(s.DBNames))
	for _, name := range s.DBNames {
		if f := s.FieldsByDBName[name]; f != nil && f.Readable {
			fields = append(fields, f)
		}
	}
	return fields
}

// scanModelRow reads the current row of rows into a new value of the model, with GORM's field
// setters, and notes which of the fields' columns hold NULL. The row's columns are, in order:
// len(before) columns read into before, one column per field, then len(after) columns read into
// after.
func scanModelRow(ctx context.Context, rows *sql.Rows, s *schema.Schema, fields []*schema.Field, before, after []any) (readRow, error) {
	dests := make([]any, 0, len(before)+len(fields)+len(after))
	dests = append(dests, before...)
	for _, f := range fields {
		v := f.NewValuePool.Get()
		if sc, ok := v.(sql.Scanner); ok {
			// A serializer: it keeps the column's value to itself.
			v = &nullProbe{Scanner: sc}
		}
		dests = append(dests, v)
	}
	dests = append(dests, after...)
	err := rows.Scan(dests...)
	r := readRow{elem: reflect.New(s.ModelType).Elem()}
	for i, f := range fields {
		v := dests[len(before)+i]
		if probe, ok := v.(*nullProbe); ok {
			v = probe.Scanner
			if probe.null {
				r.nulls = append(r.nulls, f.DBName)
			}
		} else if scannedNull(v) {
			r.nulls = append(r.nulls, f.DBName)
		}
		if err == nil {
			if err = f.Set(ctx, r.elem, v); err != nil {
				err = fmt.Errorf("column %s: %w", f.DBName, err)
			}
		}
		f.NewValuePool.Put(v)
	}
	return r, err
}

// nullProbe passes a column to a Scanner and notes whether it was NULL.
type nullProbe struct {
	sql.Scanner
	null bool
}

func (p *nullProbe) Scan(src any) error {
	p.null = src == nil
	return p.Scanner.Scan(src)
}

// scannedNull reports whether a GORM scan destination of a field without a serializer (a **T)
// received NULL: database/sql sets the *T to nil for NULL.
func scannedNull(dest any) bool {
	rv := reflect.ValueOf(dest)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return false
	}
	rv = rv.Elem()
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}
