package outboxplugin

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// Compact storage of the rows of a large statement. An update or delete by condition can change a
// million rows in one statement; its events are built only once the write has returned (the
// transaction's connection is busy reading the rows until then), so what the write learnt of each
// row is held until then. When that is the key alone — key payloads, where the event needs nothing
// else of the row — it is held here, one flat slice for all rows, instead of a model value per row:
// 24 bytes a row for an integer key instead of several hundred.

// keyList holds the keys of a statement's rows, n values a row, in the order the write reported them.
type keyList struct {
	n    int
	vals []any
}

// add appends one row's key.
func (k *keyList) add(key []any) { k.vals = append(k.vals, key...) }

// len is the number of rows.
func (k *keyList) len() int {
	if k.n == 0 {
		return 0
	}
	return len(k.vals) / k.n
}

// at is row i's key; it shares the list's storage and must not be appended to.
func (k *keyList) at(i int) []any { return k.vals[i*k.n : (i+1)*k.n : (i+1)*k.n] }

// chunk is the keys of rows start to end, as a slice of keys sharing the list's storage.
func (k *keyList) chunk(start, end int) [][]any {
	out := make([][]any, 0, end-start)
	for i := start; i < end; i++ {
		out = append(out, k.at(i))
	}
	return out
}

// valueList holds raw column values of a statement's rows (what a locked read read of the columns
// an update assigns, to tell the rows it changed from those it left as they were), each row's as one
// canonical encoding: two rows' values are equal exactly when their encodings are.
type valueList struct {
	data []byte
	ends []int
}

// add appends one row's values.
func (v *valueList) add(values []any) {
	for _, x := range values {
		v.data = appendRawValue(v.data, x)
	}
	v.ends = append(v.ends, len(v.data))
}

// at is row i's encoding.
func (v *valueList) at(i int) []byte {
	start := 0
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
