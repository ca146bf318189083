// Package testjson is for tests only: fuzz seeds for string arguments, and checks of the JSON text
// the capture writes and the relay reads, shared by the fuzz targets of the root package and of
// internal/capture.
package testjson

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// Strings are fuzz seeds for every string argument: escapes, HTML characters (escaped by
// encoding/json), line and paragraph separators, NUL, invalid and truncated UTF-8, a surrogate half
// encoded as UTF-8, and long text.
var Strings = []string{
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

// ReplaceInvalid is s as encoding/json encodes it: every byte that is not part of a valid UTF-8
// sequence becomes U+FFFD.
func ReplaceInvalid(s string) string {
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

// Require fails unless b is one JSON document in UTF-8.
func Require(t *testing.T, what string, b []byte) {
	t.Helper()
	if !utf8.Valid(b) || !json.Valid(b) {
		t.Fatalf("%s is not valid UTF-8 JSON: %q", what, b)
	}
}

// Members decodes a JSON object into its members in order, duplicates kept, numbers as
// json.Number.
func Members(t *testing.T, b []byte) (names []string, values []any) {
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
