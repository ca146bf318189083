package capture

// Fuzz targets for the code that turns user values into event payloads, headers and keys. Their seed
// corpora (the f.Add calls) run in every go test; to fuzz one:
//
//	go test -run '^$' -fuzz FuzzAppendJSONObject -fuzztime 30s ./internal/capture
//
// Each target asserts properties rather than examples: what is written is valid JSON in UTF-8, it
// reads back as the value given (invalid UTF-8 replaced byte for byte with U+FFFD, as encoding/json
// does), and nothing panics.

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gorm-outbox/outboxplugin/internal/testjson"
)

// FuzzAppendJSONString checks the fast path of string encoding against encoding/json, byte for byte.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range testjson.Strings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := appendJSONString([]byte("prefix"), s)
		if !bytes.HasPrefix(got, []byte("prefix")) {
			t.Fatalf("appendJSONString dropped what it appended to: %q", got)
		}
		got = got[len("prefix"):]
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("appendJSONString(%q) = %s, encoding/json gives %s", s, got, want)
		}
		testjson.Require(t, "string", got)
		var back string
		if err := json.Unmarshal(got, &back); err != nil || back != testjson.ReplaceInvalid(s) {
			t.Fatalf("%q reads back as %q (%v)", s, back, err)
		}
	})
}

// FuzzAppendJSONObject encodes a row of the column types captured payloads carry and reads it back.
func FuzzAppendJSONObject(f *testing.F) {
	for i, s := range testjson.Strings {
		f.Add(s, s, int64(i)-7, uint64(i)<<60, float64(i)/3, i%2 == 0, []byte(s), int64(i)*1e17)
	}
	f.Add("n", "dup", int64(math.MinInt64), uint64(math.MaxUint64), math.MaxFloat64, true, []byte(nil), int64(0))
	f.Add("s", "", int64(math.MaxInt64), uint64(0), math.Inf(1), false, []byte{0, 0xff}, int64(-1))
	f.Add("f", "x", int64(0), uint64(1), math.NaN(), false, []byte{}, int64(math.MaxInt64))
	f.Add("f", "x", int64(0), uint64(1), 1e-320, false, []byte{}, int64(math.MinInt64))
	f.Fuzz(func(t *testing.T, name, s string, i int64, u uint64, fl float64, b bool, raw []byte, nanos int64) {
		ts := time.Unix(0, nanos).UTC()
		var nilString *string
		names := []string{name, "n", "u", "f", "b", "raw", "t", "ptr", "null", "valuer"}
		values := []any{s, i, u, fl, b, raw, ts, &s, nilString, sql.NullString{String: s, Valid: true}}
		out, err := appendJSONObject(nil, names, values)
		if math.IsNaN(fl) || math.IsInf(fl, 0) {
			if err == nil {
				t.Fatalf("%v encoded without error: %s", fl, out)
			}
			if !strings.Contains(err.Error(), "column f") {
				t.Fatalf("the error does not name the column: %v", err)
			}
			return
		}
		if err != nil {
			// encoding/json refuses years outside 0..9999; nothing else may fail.
			if ts.Year() >= 0 && ts.Year() <= 9999 {
				t.Fatalf("appendJSONObject: %v", err)
			}
			return
		}
		testjson.Require(t, "object", out)
		gotNames, got := testjson.Members(t, out)
		wantNames := make([]string, len(names))
		for k, n := range names {
			wantNames[k] = testjson.ReplaceInvalid(n)
		}
		if !slices.Equal(gotNames, wantNames) {
			t.Fatalf("members %q, want %q", gotNames, wantNames)
		}
		str := testjson.ReplaceInvalid(s)
		wantTime, _ := json.Marshal(ts)
		checks := []struct {
			got  any
			want any
		}{
			{got[0], str},
			{got[1], json.Number(strconv.FormatInt(i, 10))},
			{got[2], json.Number(strconv.FormatUint(u, 10))},
			{got[4], b},
			{got[6], strings.Trim(string(wantTime), `"`)},
			{got[7], str},
			{got[8], nil},
			{got[9], str},
		}
		for k, c := range checks {
			if c.got != c.want {
				t.Fatalf("check %d: read back %#v, want %#v (%s)", k, c.got, c.want, out)
			}
		}
		if back, err := got[3].(json.Number).Float64(); err != nil || back != fl {
			t.Fatalf("float %v reads back as %v (%v)", fl, got[3], err)
		}
		if raw == nil {
			if got[5] != nil {
				t.Fatalf("nil []byte reads back as %#v", got[5])
			}
		} else {
			var back []byte
			if err := json.Unmarshal([]byte(strconv.Quote(got[5].(string))), &back); err != nil || !bytes.Equal(back, raw) {
				t.Fatalf("[]byte %q reads back as %q (%v)", raw, back, err)
			}
		}
	})
}

// FuzzEncodePayload feeds raw documents and strings to the encoders of Emit and of customizers:
// raw JSON is kept as it is when it is valid UTF-8 JSON and refused otherwise, and anything encoded
// from Go values — headers included — reads back the way the relay reads it.
func FuzzEncodePayload(f *testing.F) {
	for _, s := range testjson.Strings {
		f.Add([]byte(s), s)
		f.Add([]byte(strconv.Quote(s)), s)
	}
	f.Add([]byte(`{"a":[1,2,{"b":null}]}`), "k")
	f.Add([]byte("{\"s\":\"a\xffb\"}"), "v")
	f.Add([]byte(`{"s":"a\u0000b"}`), "v")
	f.Add([]byte(`{"a":`), "")
	f.Add([]byte(" 1 "), "")
	f.Fuzz(func(t *testing.T, raw []byte, s string) {
		for _, p := range []any{json.RawMessage(raw), raw} {
			out, err := EncodePayload(p)
			switch {
			case raw == nil:
				if err != nil || out != "null" {
					t.Fatalf("nil raw payload %T: %q, %v", p, out, err)
				}
			case utf8.Valid(raw) && json.Valid(raw):
				if err != nil || out != string(raw) {
					t.Fatalf("valid raw payload %T %q changed to %q (%v)", p, raw, out, err)
				}
			default:
				if !errors.Is(err, ErrEncodePayload) || !errors.Is(err, ErrInvalidJSON) {
					t.Fatalf("invalid raw payload %T %q: err %v, want ErrEncodePayload and ErrInvalidJSON", p, raw, err)
				}
			}
		}

		out, err := EncodePayload(map[string]any{s: s, "nested": []string{s}})
		if err != nil {
			t.Fatalf("encodePayload: %v", err)
		}
		testjson.Require(t, "payload", []byte(out))
		var back map[string]any
		if err := json.Unmarshal([]byte(out), &back); err != nil || back[testjson.ReplaceInvalid(s)] != testjson.ReplaceInvalid(s) {
			t.Fatalf("payload %q reads back as %v (%v)", out, back, err)
		}

		hdr, err := EncodeHeaders(map[string]string{s: s, "other": string(raw)})
		if err != nil || hdr == nil {
			t.Fatalf("encodeHeaders: %v", err)
		}
		testjson.Require(t, "headers", []byte(*hdr))
		var headers map[string]string // as scanClaimed decodes them
		if err := json.Unmarshal([]byte(*hdr), &headers); err != nil {
			t.Fatalf("headers %q cannot be read by the relay: %v", *hdr, err)
		}
		if headers[testjson.ReplaceInvalid(s)] != testjson.ReplaceInvalid(s) && testjson.ReplaceInvalid(s) != "other" {
			t.Fatalf("header %q reads back as %q", s, headers[testjson.ReplaceInvalid(s)])
		}
	})
}

// FuzzKeys checks the identities built from primary keys: the aggregate id of a one-column key is its
// value, a composite key is a JSON array of its values, and keyString, which matches rows read back
// from the database with rows in memory, never gives two different keys the same string.
func FuzzKeys(f *testing.F) {
	f.Add("a\x00b", "c", "a", "b\x00c", int64(1))
	f.Add("a", "b", "a", "b", int64(-1))
	f.Add("1:a", "", "1", ":a", int64(0))
	f.Add("", "", "", "", int64(math.MaxInt64))
	for _, s := range testjson.Strings {
		f.Add(s, s, s+"x", s, int64(len(s)))
	}
	f.Fuzz(func(t *testing.T, a, b, c, d string, n int64) {
		if (a != c || b != d) && keyString([]any{a, b}) == keyString([]any{c, d}) {
			t.Fatalf("keys (%q, %q) and (%q, %q) share keyString %q", a, b, c, d, keyString([]any{a, b}))
		}
		if keyString([]any{a, b}) == keyString([]any{a + b}) {
			t.Fatalf("keys of different arity share keyString: (%q, %q)", a, b)
		}

		id, err := aggregateID([]any{a}, true)
		if err != nil || id != a {
			t.Fatalf("aggregateID(%q) = %q, %v", a, id, err)
		}
		if id, err := aggregateID([]any{&a}, true); err != nil || id != a {
			t.Fatalf("aggregateID(&%q) = %q, %v", a, id, err)
		}
		if id, err := aggregateID([]any{n}, true); err != nil || id != strconv.FormatInt(n, 10) {
			t.Fatalf("aggregateID(%d) = %q, %v", n, id, err)
		}
		if id, err := aggregateID([]any{a, n}, false); err != nil || id != "" {
			t.Fatalf("a model without a primary key has aggregate id %q, %v", id, err)
		}
		composite, err := aggregateID([]any{a, n, b}, true)
		if err != nil {
			t.Fatalf("aggregateID composite: %v", err)
		}
		testjson.Require(t, "composite aggregate id", []byte(composite))
		dec := json.NewDecoder(strings.NewReader(composite))
		dec.UseNumber()
		var parts []any
		if err := dec.Decode(&parts); err != nil {
			t.Fatal(err)
		}
		want := []any{testjson.ReplaceInvalid(a), json.Number(strconv.FormatInt(n, 10)), testjson.ReplaceInvalid(b)}
		if !slices.Equal(parts, want) {
			t.Fatalf("composite %q reads back as %#v, want %#v", composite, parts, want)
		}

	})
}
