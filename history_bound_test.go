package outboxplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// jsonStringLen is how many bytes s takes inside a JSON string, as the databases write it (no HTML
// escaping).
func jsonStringLen(t *testing.T, s string) int {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		t.Fatal(err)
	}
	return b.Len() - len("\"\"\n")
}

func TestBoundAttemptError(t *testing.T) {
	cases := []struct {
		name, in string
		cut      bool
	}{
		{"short", "broker said no", false},
		{"exactly the bound", strings.Repeat("x", MaxAttemptErrorBytes), false},
		{"one byte over", strings.Repeat("x", MaxAttemptErrorBytes+1), true},
		{"quotes double when escaped", strings.Repeat(`"`, MaxAttemptErrorBytes/2+1), true},
		{"control characters take six", strings.Repeat("\x01", 200), true},
		{"multi-byte runes", strings.Repeat("€", 1<<20), true},
		{"invalid UTF-8", strings.Repeat("\xff", 100), false},
		{"NUL", "a\x00b", false},
		{"line separators", strings.Repeat("\u2028", 200), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := boundAttemptError(c.in)
			if n := jsonStringLen(t, got); n > MaxAttemptErrorBytes {
				t.Errorf("escaped length %d > %d", n, MaxAttemptErrorBytes)
			}
			if !utf8.ValidString(got) || strings.Contains(got, "\x00") {
				t.Errorf("not storable text: %q", got)
			}
			marker := "[cut: " + strconv.Itoa(len(c.in)) + " bytes in all]"
			if c.cut != strings.HasSuffix(got, marker) {
				t.Errorf("cut = %v, want %v: %q", !c.cut, c.cut, got)
			}
			if c.cut && jsonStringLen(t, got) < MaxAttemptErrorBytes-8 {
				// The cut fills the bound, short of one escaped rune.
				t.Errorf("cut short: %d bytes escaped", jsonStringLen(t, got))
			}
			if !c.cut && got != storableText(c.in) {
				t.Errorf("changed a text within the bound: %q", got)
			}
		})
	}
}

func TestCutTextCutsOnARuneBoundary(t *testing.T) {
	s := "a" + strings.Repeat("é", 1500) // a cut at 2000 bytes falls inside a rune
	got := cutText(s, 2000)
	if !utf8.ValidString(got) || len(got) > 2000 || len(got) < 1999 {
		t.Errorf("cutText: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if got := cutText("bad\xff\x00", 2000); got != "bad\uFFFD\uFFFD" {
		t.Errorf("cutText of invalid text: %q", got)
	}
}

// The entry a failure statement appends decodes to the Attempt it recorded.
func TestAttemptRecordRoundTrips(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.UTC)
	rec := failedAttempt(at, 3, errors.New(`refused: <"x"> & more`), 12345*time.Microsecond)
	h := AttemptHistory("[" + rec.Entry("relay-1") + "]")
	got, err := h.Attempts()
	if err != nil {
		t.Fatal(err)
	}
	want := []Attempt{{At: at, Number: 3, Worker: "relay-1", Error: `refused: <"x"> & more`, Duration: 12345 * time.Microsecond}}
	if len(got) != 1 || got[0] != want[0] {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if none, err := AttemptHistory(nil).Attempts(); none != nil || err != nil {
		t.Errorf("nil history: %v, %v", none, err)
	}
	if _, err := AttemptHistory(`{"not":"an array"}`).Attempts(); err == nil {
		t.Error("a document that is not an array decodes")
	}
}
