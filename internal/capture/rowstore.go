package capture

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"time"

	"gorm.io/gorm/schema"
)

// Compact storage of the rows of a large statement. An update or delete by condition can change a
// million rows in one statement; its events are built only once the write has returned (the
// transaction's connection is busy reading the rows until then), so what the write learnt of each
// row is held until then. When that is the key alone — key payloads, where the event needs nothing
// else of the row — it is held here, a column per key field, instead of a model value per row: 8
// bytes a row for an integer key instead of several hundred.

// keyList holds the keys of a statement's rows, in the order the write reported them, one column
// per key field: an integer column as the integers' bits, 8 bytes a row, any other as its values.
type keyList struct {
	rows int
	cols []keyColumn
}

// keyColumn is one key field's values.
type keyColumn struct {
	typ  reflect.Type // the field's Go type, which the values are given back as
	ints []uint64     // integer kinds: the bits of each value (int64 or uint64)
	vals []any        // any other type, or an integer field that held something else (nil)
}

// newKeyList is an empty keyList for the identity fields.
func newKeyList(fields []*schema.Field) keyList {
	cols := make([]keyColumn, len(fields))
	for i, f := range fields {
		cols[i].typ = f.FieldType
	}
	return keyList{cols: cols}
}

// add appends one row's key.
func (k *keyList) add(key []any) {
	for i := range k.cols {
		c := &k.cols[i]
		if c.vals == nil {
			if bits, ok := intBits(key[i], c.typ); ok {
				c.ints = append(c.ints, bits)
				continue
			}
			// Not an integer of the field's type after all: keep every value of the column as it is.
			c.vals = make([]any, k.rows, max(k.rows+1, cap(c.ints)))
			for r, bits := range c.ints {
				c.vals[r] = fromBits(bits, c.typ)
			}
			c.ints = nil
		}
		c.vals = append(c.vals, key[i])
	}
	k.rows++
}

// len is the number of rows.
func (k *keyList) len() int { return k.rows }

// at is row i's key, as keysOf gave it.
func (k *keyList) at(i int) []any {
	key := make([]any, len(k.cols))
	for j := range k.cols {
		c := &k.cols[j]
		if c.vals != nil {
			key[j] = c.vals[i]
		} else {
			key[j] = fromBits(c.ints[i], c.typ)
		}
	}
	return key
}

// chunk is the keys of rows start to end.
func (k *keyList) chunk(start, end int) [][]any {
	out := make([][]any, 0, end-start)
	for i := start; i < end; i++ {
		out = append(out, k.at(i))
	}
	return out
}

// intBits returns the bits of v when it is a value of typ, an integer type.
func intBits(v any, typ reflect.Type) (uint64, bool) {
	if v == nil || typ == nil {
		return 0, false
	}
	rv := reflect.ValueOf(v)
	if rv.Type() != typ {
		return 0, false
	}
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return uint64(rv.Int()), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return rv.Uint(), true
	}
	return 0, false
}

// fromBits is the value of typ, an integer type, whose bits intBits returned.
func fromBits(bits uint64, typ reflect.Type) any {
	v := reflect.New(typ).Elem()
	switch typ.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(bits))
	default:
		v.SetUint(bits)
	}
	return v.Interface()
}

// valueList holds raw column values of a statement's rows (what a locked read read of the columns
// an update assigns, to tell the rows it changed from those it left as they were), each row's as one
// canonical encoding: two rows' values are equal exactly when their encodings are.
type valueList struct {
	data []byte
	ends []uint64
}

// add appends one row's values.
func (v *valueList) add(values []any) {
	for _, x := range values {
		v.data = appendRawValue(v.data, x)
	}
	v.ends = append(v.ends, uint64(len(v.data)))
}

// at is row i's encoding.
func (v *valueList) at(i int) []byte {
	var start uint64
	if i > 0 {
		start = v.ends[i-1]
	}
	return v.data[start:v.ends[i]]
}

// encodeRawValues is the encoding valueList keeps of values.
func encodeRawValues(values []any) []byte {
	var b []byte
	for _, x := range values {
		b = appendRawValue(b, x)
	}
	return b
}

// appendRawValue appends a self-delimiting encoding of a value database/sql scanned into an any: one
// of the driver.Value types (nil, int64, float64, bool, []byte, string, time.Time), or, from a driver
// that returns another, its type and Go syntax. Values of different types never encode alike, as
// reflect.DeepEqual never finds them equal.
func appendRawValue(b []byte, x any) []byte {
	switch v := x.(type) {
	case nil:
		return append(b, 'n')
	case int64:
		return binary.BigEndian.AppendUint64(append(b, 'i'), uint64(v))
	case float64:
		return binary.BigEndian.AppendUint64(append(b, 'f'), math.Float64bits(v))
	case bool:
		if v {
			return append(b, 'b', 1)
		}
		return append(b, 'b', 0)
	case []byte:
		return append(binary.AppendUvarint(append(b, 'x'), uint64(len(v))), v...)
	case string:
		return append(binary.AppendUvarint(append(b, 's'), uint64(len(v))), v...)
	case time.Time:
		t, err := v.MarshalBinary()
		if err == nil {
			return append(binary.AppendUvarint(append(b, 't'), uint64(len(t))), t...)
		}
	}
	s := fmt.Sprintf("%T:%#v", x, x)
	return append(binary.AppendUvarint(append(b, 'o'), uint64(len(s))), s...)
}
