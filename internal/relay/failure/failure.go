// Package failure is what the relay stores of a failed delivery: the last error (last_error) and the
// entry the failure statement appends to the event's attempt history (attempt_history), both as text
// the databases accept whatever a broker put in the error, and both bounded. The root package's
// AttemptHistory decodes the entries (Entry is their JSON form).
package failure

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxErrorBytes bounds the error text of an entry, as it is stored (JSON-escaped):
// outboxplugin.MaxAttemptErrorBytes, which documents it (a test of that package holds the two equal).
const MaxErrorBytes = 1024

// lastErrorBytes bounds last_error.
const lastErrorBytes = 2000

// Entry is an entry of the attempt_history column.
type Entry struct {
	At         string   `json:"at"`
	Attempt    int      `json:"attempt"`
	Worker     string   `json:"worker"`
	Error      string   `json:"error"`
	DurationMS *float64 `json:"duration_ms,omitempty"`
}

// Record is the failed attempt a failure statement appends to its rows' histories (with the
// worker's owner id): the rows of one statement failed alike, in one publish, at the same attempt.
type Record struct {
	at     time.Time
	number int
	err    string // bounded (Bound)
	took   time.Duration
}

// Attempt is the record of a refused delivery of a message at attempt number, whose publish took
// took: err, cut to MaxErrorBytes.
func Attempt(at time.Time, number int, err error, took time.Duration) Record {
	text := ""
	if err != nil {
		text = err.Error()
	}
	return Record{at: at, number: number, err: Bound(text), took: took}
}

// Entry is the record as the JSON object the column keeps.
func (r Record) Entry(worker string) string {
	ms := float64(r.took.Microseconds()) / 1000
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	// <, > and & as they are: Bound counts them as one byte each.
	enc.SetEscapeHTML(false)
	// A struct of strings and numbers always encodes.
	_ = enc.Encode(Entry{At: r.at.UTC().Format(time.RFC3339Nano), Attempt: r.number, Worker: worker, Error: r.err, DurationMS: &ms})
	return strings.TrimSuffix(b.String(), "\n")
}

// Bound returns s as Storable makes it, cut so that its JSON-escaped form takes at
// most MaxErrorBytes, on a rune boundary, with a marker saying how long s was. The escaped
// length is counted as encoding/json (and, after it, the databases) write a string: a quote or a
// backslash takes 2 bytes, a control character up to 6, U+2028 and U+2029 6; so the bound holds for
// the entry as stored, whatever s holds — a megabyte of text, or of control characters.
func Bound(s string) string {
	valid := Storable(s)
	if escapedLen(valid, MaxErrorBytes+1) <= MaxErrorBytes {
		return valid
	}
	marker := " … [cut: " + strconv.Itoa(len(s)) + " bytes in all]"
	budget := MaxErrorBytes - len(marker) // the marker needs no escaping
	n, cut := 0, 0
	for i, r := range valid {
		c := escapedRuneLen(r)
		if n+c > budget {
			break
		}
		n += c
		cut = i + utf8.RuneLen(r)
	}
	return valid[:cut] + marker
}

// Storable returns s with what the databases refuse in a text (and PostgreSQL in a jsonb string)
// replaced by U+FFFD: invalid UTF-8, and NUL. An error text holds whatever a broker or a client library
// put in it, and a statement that fails on it would leave the failure unrecorded.
func Storable(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	return s
}

// Cut returns Storable(s) cut to at most max bytes, on a rune boundary.
func Cut(s string, max int) string {
	s = Storable(s)
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// escapedLen is the JSON-escaped length of s, counted up to limit.
func escapedLen(s string, limit int) int {
	n := 0
	for _, r := range s {
		if n += escapedRuneLen(r); n >= limit {
			return n
		}
	}
	return n
}

// escapedRuneLen is the most bytes a JSON encoder writes for r inside a string.
func escapedRuneLen(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '\u2028' || r == '\u2029':
		return 6
	}
	return utf8.RuneLen(r)
}

// LastError is err's text as last_error keeps it: at most 2000 bytes, cut on a rune boundary, with
// what the databases refuse in a text replaced (see Cut): a cut in the middle of a character, or a
// NUL, made the statement recording the failure fail. A nil err is "".
func LastError(err error) string {
	if err == nil {
		return ""
	}
	return Cut(err.Error(), lastErrorBytes)
}
