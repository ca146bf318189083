package capture

import (
	"reflect"
	"testing"
	"time"

	"gorm.io/gorm/schema"
)

// A keyList gives back every key exactly as it was added — same values, same Go types — whether its
// columns hold integers (kept as bits) or anything else, and when a column turns out to hold something
// other than its field's integer type part way.
func TestKeyListGivesKeysBack(t *testing.T) {
	type ID int16
	fields := []*schema.Field{
		{FieldType: reflect.TypeFor[int64]()},
		{FieldType: reflect.TypeFor[uint]()},
		{FieldType: reflect.TypeFor[ID]()},
		{FieldType: reflect.TypeFor[string]()},
		{FieldType: reflect.TypeFor[int]()},
	}
	rows := [][]any{
		{int64(-1 << 62), uint(0), ID(-7), "a", 1},
		{int64(42), ^uint(0), ID(32767), "", -1},
		{int64(0), uint(7), ID(0), "ü", "not an int"},
		{int64(9), uint(8), ID(1), "z", 3},
	}
	k := newKeyList(fields)
	for _, r := range rows {
		k.add(r)
	}
	if k.len() != len(rows) {
		t.Fatalf("len = %d, want %d", k.len(), len(rows))
	}
	for i, want := range rows {
		if got := k.at(i); !reflect.DeepEqual(got, want) {
			t.Errorf("row %d: got %#v, want %#v", i, got, want)
		}
	}
	if k.cols[0].vals != nil || k.cols[4].vals == nil {
		t.Errorf("an integer column is kept as bits until it meets another value: %v, %v", k.cols[0].vals == nil, k.cols[4].vals != nil)
	}
	if got := k.chunk(1, 3); !reflect.DeepEqual(got, [][]any{rows[1], rows[2]}) {
		t.Errorf("chunk(1, 3) = %#v", got)
	}
}

// Two rows' raw values encode alike exactly when reflect.DeepEqual finds them equal.
func TestRawValueEncoding(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 123456000, time.UTC)
	values := []any{nil, int64(1), int64(-1), float64(1), true, false, []byte("1"), "1", []byte(""), "", at,
		at.In(time.FixedZone("x", 3600)), []byte{0}, struct{ A int }{1}}
	for _, a := range values {
		for _, b := range values {
			same := string(encodeRawValues([]any{a})) == string(encodeRawValues([]any{b}))
			if same != reflect.DeepEqual(a, b) {
				t.Errorf("%#v against %#v: encodings equal %v, DeepEqual %v", a, b, same, reflect.DeepEqual(a, b))
			}
		}
	}
	var v valueList
	v.add([]any{int64(1), "a"})
	v.add(nil)
	v.add([]any{[]byte("xyz")})
	if string(v.at(0)) != string(encodeRawValues([]any{int64(1), "a"})) || len(v.at(1)) != 0 ||
		string(v.at(2)) != string(encodeRawValues([]any{[]byte("xyz")})) {
		t.Error("valueList gives back each row's encoding")
	}
}
