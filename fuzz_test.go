package outboxplugin

// Fuzz targets for the code that turns user values into event payloads, headers and message keys.
// Their seed corpora (the f.Add calls and testdata/fuzz/) run in every go test; to fuzz one:
//
//	go test -run '^$' -fuzz FuzzRouteTokens -fuzztime 30s .
//
// Each target asserts properties rather than examples: what is written is valid JSON in UTF-8, it
// reads back as the value given (invalid UTF-8 replaced byte for byte with U+FFFD, as encoding/json
// does), routing tokens hold only the bytes every broker accepts, and nothing panics.

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
	"github.com/gorm-outbox/outboxplugin/internal/testjson"
)

// FuzzMessageKey checks the message key the relay gives brokers: "<aggregate type>:<aggregate id>",
// and empty exactly when the event has no aggregate.
func FuzzMessageKey(f *testing.F) {
	f.Add("a\x00b", "c")
	f.Add("", "")
	f.Add("", "x")
	for _, s := range testjson.Strings {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
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
	for _, s := range testjson.Strings {
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
	for i, s := range testjson.Strings {
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
	for _, s := range testjson.Strings {
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
		str := testjson.ReplaceInvalid(s)
		for _, m := range got {
			testjson.Require(t, m.EventType+" payload", m.Payload)
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
