package outboxplugin

// Fuzz targets for the code that turns user values into event payloads, headers and message keys.
// Their seed corpora (the f.Add calls and testdata/fuzz/) run in every go test; to fuzz one:
//
//	go test -run '^$' -fuzz FuzzAppendJSONObject -fuzztime 30s .
//
// Each target asserts properties rather than examples: what is written is valid JSON in UTF-8, it
// reads back as the value given (invalid UTF-8 replaced byte for byte with U+FFFD, as encoding/json
// does), routing tokens hold only the bytes every broker accepts, and nothing panics.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// fuzzStrings are seeds for every string argument: escapes, HTML characters (escaped by
// encoding/json), line and paragraph separators, NUL, invalid and truncated UTF-8, a surrogate half
// encoded as UTF-8, and long text.
var fuzzStrings = []string{
	"",
	"plain",
	`quote" back\ slash`,
	"<script>&amp;</script>",
	"line\u2028para\u2029",
	"nul\x00byte",
	"ctl\x01\x1f\t\n\r",
	"invalid\xffutf8",
	"truncated\xe2\x82",
	"surrogate\xed\xa0\x80",
	"ünïcödé 日本語 🎉",
	"\ufffd",
	"a:b",
	"x; DROP TABLE users --",
	strings.Repeat("long ", 200),
}

// replaceInvalid is s as encoding/json encodes it: every byte that is not part of a valid UTF-8
// sequence becomes U+FFFD.
func replaceInvalid(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// requireJSON fails unless b is one JSON document in UTF-8.
func requireJSON(t *testing.T, what string, b []byte) {
	t.Helper()
	if !utf8.Valid(b) || !json.Valid(b) {
		t.Fatalf("%s is not valid UTF-8 JSON: %q", what, b)
	}
}

// jsonMembers decodes a JSON object into its members in order, duplicates kept, numbers as
// json.Number.
func jsonMembers(t *testing.T, b []byte) (names []string, values []any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%q: not an object: %v %v", b, tok, err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		names = append(names, tok.(string))
		values = append(values, v)
	}
	return names, values
}

// FuzzAppendJSONString checks the fast path of string encoding against encoding/json, byte for byte.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range fuzzStrings {
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
		requireJSON(t, "string", got)
		var back string
		if err := json.Unmarshal(got, &back); err != nil || back != replaceInvalid(s) {
			t.Fatalf("%q reads back as %q (%v)", s, back, err)
		}
	})
}

// FuzzAppendJSONObject encodes a row of the column types captured payloads carry and reads it back.
func FuzzAppendJSONObject(f *testing.F) {
	for i, s := range fuzzStrings {
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
		requireJSON(t, "object", out)
		gotNames, got := jsonMembers(t, out)
		wantNames := make([]string, len(names))
		for k, n := range names {
			wantNames[k] = replaceInvalid(n)
		}
		if !slices.Equal(gotNames, wantNames) {
			t.Fatalf("members %q, want %q", gotNames, wantNames)
		}
		str := replaceInvalid(s)
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
	for _, s := range fuzzStrings {
		f.Add([]byte(s), s)
		f.Add([]byte(strconv.Quote(s)), s)
	}
	f.Add([]byte(`{"a":[1,2,{"b":null}]}`), "k")
	f.Add([]byte("{\"s\":\"a\xffb\"}"), "v")
	f.Add([]byte(`{"s":"a\u0000b"}`), "v")
	f.Add([]byte(`{"a":`), "")
	f.Add([]byte(" 1 "), "")
	f.Fuzz(func(t *testing.T, raw []byte, s string) {
		for _, p := range []any{json.RawMessage(raw), JSON(raw), raw} {
			out, err := encodePayload(p)
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

		out, err := encodePayload(map[string]any{s: s, "nested": []string{s}})
		if err != nil {
			t.Fatalf("encodePayload: %v", err)
		}
		requireJSON(t, "payload", []byte(out))
		var back map[string]any
		if err := json.Unmarshal([]byte(out), &back); err != nil || back[replaceInvalid(s)] != replaceInvalid(s) {
			t.Fatalf("payload %q reads back as %v (%v)", out, back, err)
		}

		hdr, err := encodeHeaders(map[string]string{s: s, "other": string(raw)})
		if err != nil || hdr == nil {
			t.Fatalf("encodeHeaders: %v", err)
		}
		requireJSON(t, "headers", []byte(*hdr))
		var headers map[string]string // as scanClaimed decodes them
		if err := json.Unmarshal([]byte(*hdr), &headers); err != nil {
			t.Fatalf("headers %q cannot be read by the relay: %v", *hdr, err)
		}
		if headers[replaceInvalid(s)] != replaceInvalid(s) && replaceInvalid(s) != "other" {
			t.Fatalf("header %q reads back as %q", s, headers[replaceInvalid(s)])
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
	for _, s := range fuzzStrings {
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
		requireJSON(t, "composite aggregate id", []byte(composite))
		dec := json.NewDecoder(strings.NewReader(composite))
		dec.UseNumber()
		var parts []any
		if err := dec.Decode(&parts); err != nil {
			t.Fatal(err)
		}
		want := []any{replaceInvalid(a), json.Number(strconv.FormatInt(n, 10)), replaceInvalid(b)}
		if !slices.Equal(parts, want) {
			t.Fatalf("composite %q reads back as %#v, want %#v", composite, parts, want)
		}

		key := store.MessageKey(a, b)
		if (a == "" && b == "") != (key == "") {
			t.Fatalf("store.MessageKey(%q, %q) = %q: empty exactly when the aggregate is", a, b, key)
		}
		if key != "" && key != a+":"+b {
			t.Fatalf("store.MessageKey(%q, %q) = %q", a, b, key)
		}
	})
}

// FuzzRouteTokens checks that routing tokens hold only ASCII letters, digits, '_' and '-', keep their
// length, leave clean names alone and never come out empty.
func FuzzRouteTokens(f *testing.F) {
	for _, s := range fuzzStrings {
		f.Add(s, s)
	}
	f.Add("User", "User_create")
	f.Add("orders.v1", "placed>*")
	f.Fuzz(func(t *testing.T, aggregateType, eventType string) {
		agg, ev := RouteTokens(Message{AggregateType: aggregateType, EventType: eventType})
		for _, c := range []struct{ in, out string }{{aggregateType, agg}, {eventType, ev}} {
			if c.out == "" {
				t.Fatalf("empty token for %q", c.in)
			}
			if c.in == "" && c.out != "_" {
				t.Fatalf("empty name gives %q, want _", c.out)
			}
			if c.in != "" && len(c.out) != len(c.in) {
				t.Fatalf("token %q of %q changed length", c.out, c.in)
			}
			for i := 0; i < len(c.out); i++ {
				if !isRouteByte(c.out[i]) {
					t.Fatalf("token %q of %q holds byte %q", c.out, c.in, c.out[i])
				}
				if c.in != "" && isRouteByte(c.in[i]) && c.in[i] != c.out[i] {
					t.Fatalf("token %q of %q changed a clean byte", c.out, c.in)
				}
			}
			if again := routeToken(c.out); again != c.out {
				t.Fatalf("routeToken is not idempotent: %q then %q", c.out, again)
			}
		}
	})
}

// FuzzHeaderList checks the headers publishers send: one value per name, the event's own headers
// sorted first, then the outbox's fields with the message's values, which an event header of the
// same name cannot replace.
func FuzzHeaderList(f *testing.F) {
	f.Add("traceparent", "00-abc", HeaderID, "forged", "id-1", "User_create", "User", "42", 3, int64(0))
	f.Add(HeaderKey, "forged", "b", "", "", "", "", "", 0, int64(-1))
	for i, s := range fuzzStrings {
		f.Add(s, s, s+"2", s, s, s, s, s, i, int64(i)*1e15)
	}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, id, eventType, aggType, aggID string, attempt int, nanos int64) {
		m := Message{
			ID: id, EventType: eventType, AggregateType: aggType, AggregateID: aggID,
			Key: store.MessageKey(aggType, aggID), Headers: map[string]string{k1: v1, k2: v2},
			CreatedAt: time.Unix(0, nanos), Attempt: attempt,
		}
		list := m.HeaderList()
		seen := map[string]bool{}
		firstOutbox := len(list)
		for i, h := range list {
			if seen[h.Key] {
				t.Fatalf("header %q twice in %v", h.Key, list)
			}
			seen[h.Key] = true
			if isOutboxHeader(h.Key) {
				firstOutbox = min(firstOutbox, i)
			} else if i > firstOutbox {
				t.Fatalf("event header %q after the outbox's in %v", h.Key, list)
			} else if h.Value != m.Headers[h.Key] {
				t.Fatalf("event header %q = %q, want %q", h.Key, h.Value, m.Headers[h.Key])
			}
		}
		for _, k := range []string{k1, k2} {
			if !isOutboxHeader(k) && !seen[k] {
				t.Fatalf("event header %q missing from %v", k, list)
			}
		}
		if !slices.IsSortedFunc(list[:firstOutbox], func(a, b Header) int { return strings.Compare(a.Key, b.Key) }) {
			t.Fatalf("event headers not sorted: %v", list[:firstOutbox])
		}
		want := map[string]string{
			HeaderID: id, HeaderEventType: eventType,
			HeaderCreatedAt: m.CreatedAt.UTC().Format(time.RFC3339Nano), HeaderAttempt: strconv.Itoa(attempt),
		}
		if m.Key != "" {
			want[HeaderKey] = m.Key
		}
		if aggType != "" {
			want[HeaderAggregateType] = aggType
		}
		if aggID != "" {
			want[HeaderAggregateID] = aggID
		}
		outbox := map[string]string{}
		for _, h := range list[firstOutbox:] {
			outbox[h.Key] = h.Value
		}
		if len(outbox) != len(want) {
			t.Fatalf("outbox headers %v, want %v", outbox, want)
		}
		for k, v := range want {
			if outbox[k] != v {
				t.Fatalf("outbox header %s = %q, want %q", k, outbox[k], v)
			}
		}
	})
}

// fuzzDoc is the model of FuzzCaptureAndRelay.
type fuzzDoc struct {
	ID   int64
	Body string
	Blob []byte
}

// FuzzCaptureAndRelay runs user strings through the whole path on SQLite: a captured row (payload
// mode row) and an Emit with the string as payload, header and aggregate id, then the relay. SQLite
// stores any bytes, so this is where invalid UTF-8 and NUL reach the relay: what it publishes must be
// valid JSON in UTF-8 that reads back as the value written (invalid bytes replaced), with the header
// and key intact.
func FuzzCaptureAndRelay(f *testing.F) {
	for _, s := range fuzzStrings {
		f.Add(s, []byte(s))
	}
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(f.TempDir(), "fuzz.db")+"?_busy_timeout=5000&_journal_mode=WAL"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		f.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		f.Fatal(err)
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(1) // one connection: the writes and the relay never wait for each other's locks
	if err := db.AutoMigrate(&OutboxEvent{}, &fuzzDoc{}); err != nil {
		f.Fatal(err)
	}
	if err := db.Use(New(WithPayloadMode(PayloadRow))); err != nil {
		f.Fatal(err)
	}
	var got []Message
	worker, err := NewWorker(db, PublisherFunc(func(_ context.Context, msgs []Message) error {
		got = append(got, msgs...)
		return nil
	}), WithDeleteOnPublish(), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, s string, blob []byte) {
		got = got[:0]
		doc := fuzzDoc{Body: s, Blob: blob}
		err := db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&doc).Error; err != nil {
				return err
			}
			return Emit(tx, "Fuzzed", map[string]string{"body": s}, WithAggregate("Doc", s), WithHeaders(map[string]string{"h": s}))
		})
		if err != nil {
			t.Fatalf("write %q: %v", s, err)
		}
		n, err := worker.ProcessOnce(context.Background())
		if err != nil || n != 2 || len(got) != 2 {
			t.Fatalf("relay: published %d (%d messages), %v", n, len(got), err)
		}
		str := replaceInvalid(s)
		for _, m := range got {
			requireJSON(t, m.EventType+" payload", m.Payload)
		}
		var row struct {
			ID   int64  `json:"id"`
			Body string `json:"body"`
			Blob []byte `json:"blob"`
		}
		if err := json.Unmarshal(got[0].Payload, &row); err != nil || row.ID != doc.ID || row.Body != str || !bytes.Equal(row.Blob, blob) {
			t.Fatalf("captured payload %s reads back as %+v (%v)", got[0].Payload, row, err)
		}
		if got[0].Key != "fuzzDoc:"+strconv.FormatInt(doc.ID, 10) {
			t.Fatalf("captured key %q", got[0].Key)
		}
		var emitted map[string]string
		if err := json.Unmarshal(got[1].Payload, &emitted); err != nil || emitted["body"] != str {
			t.Fatalf("emitted payload %s reads back as %v (%v)", got[1].Payload, emitted, err)
		}
		if got[1].Headers["h"] != str {
			t.Fatalf("header %q published as %q", s, got[1].Headers["h"])
		}
		if got[1].AggregateID != s || got[1].Key != "Doc:"+s {
			t.Fatalf("aggregate id %q published as %q (key %q)", s, got[1].AggregateID, got[1].Key)
		}
	})
}
