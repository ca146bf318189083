package failure

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
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

func TestBound(t *testing.T) {
	cases := []struct {
		name, in string
		cut      bool
	}{
		{"short", "broker said no", false},
		{"exactly the bound", strings.Repeat("x", MaxErrorBytes), false},
		{"one byte over", strings.Repeat("x", MaxErrorBytes+1), true},
		{"quotes double when escaped", strings.Repeat(`"`, MaxErrorBytes/2+1), true},
		{"control characters take six", strings.Repeat("\x01", 200), true},
		{"multi-byte runes", strings.Repeat("€", 1<<20), true},
		{"invalid UTF-8", strings.Repeat("\xff", 100), false},
		{"NUL", "a\x00b", false},
		{"line separators", strings.Repeat("\u2028", 200), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Bound(c.in)
			if n := jsonStringLen(t, got); n > MaxErrorBytes {
				t.Errorf("escaped length %d > %d", n, MaxErrorBytes)
			}
			if !utf8.ValidString(got) || strings.Contains(got, "\x00") {
				t.Errorf("not storable text: %q", got)
			}
			marker := "[cut: " + strconv.Itoa(len(c.in)) + " bytes in all]"
			if c.cut != strings.HasSuffix(got, marker) {
				t.Errorf("cut = %v, want %v: %q", !c.cut, c.cut, got)
			}
			if c.cut && jsonStringLen(t, got) < MaxErrorBytes-8 {
				// The cut fills the bound, short of one escaped rune.
				t.Errorf("cut short: %d bytes escaped", jsonStringLen(t, got))
			}
			if !c.cut && got != Storable(c.in) {
				t.Errorf("changed a text within the bound: %q", got)
			}
		})
	}
}

func TestCutCutsOnARuneBoundary(t *testing.T) {
	s := "a" + strings.Repeat("é", 1500) // a cut at 2000 bytes falls inside a rune
	got := Cut(s, 2000)
	if !utf8.ValidString(got) || len(got) > 2000 || len(got) < 1999 {
		t.Errorf("Cut: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if got := Cut("bad\xff\x00", 2000); got != "bad\uFFFD\uFFFD" {
		t.Errorf("Cut of invalid text: %q", got)
	}
}

// last_error keeps at most 2000 bytes of storable text; no error is no text.
func TestLastError(t *testing.T) {
	if got := LastError(nil); got != "" {
		t.Errorf("LastError(nil) = %q", got)
	}
	if got := LastError(errors.New(strings.Repeat("é", 1500) + "\x00")); len(got) > 2000 || !utf8.ValidString(got) {
		t.Errorf("LastError: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if got := LastError(errors.New("bad\xff\x00")); got != "bad\uFFFD\uFFFD" {
		t.Errorf("LastError of invalid text: %q", got)
	}
}
