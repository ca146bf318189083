package outboxplugin

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/gorm-outbox/outboxplugin/internal/dbtime"
	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// An event's failure history: the last few attempts that failed, kept with the event in its
// attempt_history column, so that an operator looking at a dead event sees what each delivery met, not
// only the last error.
//
// The column is a JSON array, oldest entry first, NULL until the first failure:
//
//	[{"at":"2025-01-02T03:04:05.123456Z","attempt":1,"worker":"relay-1-1234-a1b2c3d4e5f6","error":"broker said no","duration_ms":12.5}, …]
//
// An entry is written for each attempt that spent one: a refusal that is retried, one that makes the
// event dead, and a delivery that never recorded an outcome (its relay died, or stalled past its lease:
// the claim that takes the row over appends it, with the old lease's owner and expiry). An outage does
// not: it spends no attempt, and a long one would push the refusals that matter out of the history
// (last_error still says what the broker answered). Successes are not recorded; processed_at says it.
//
// Each entry is appended by the statement that records the failure anyway (and, for an unfinished
// delivery, by the claim), in SQL: no extra round trip, and the claim reads nothing more back — a
// history computed in Go would need every claim to return it. The statement keeps the last N entries
// (WithAttemptHistory): a row's history is at most N entries of at most about 1.2 KiB each, whatever the
// error texts, since each error is cut to MaxAttemptErrorBytes. Requeueing keeps it: it is the record
// of what happened, and the attempt numbers, which start again at 1, show where the requeue was.

// Bounds of the failure history.
const (
	// DefaultAttemptHistory is how many failed attempts an event keeps unless WithAttemptHistory says
	// otherwise: as many as DefaultMaxAttempts, so a dead event shows every delivery it had.
	DefaultAttemptHistory = 10
	// MaxAttemptHistory is the most WithAttemptHistory accepts.
	MaxAttemptHistory = 100
	// MaxAttemptErrorBytes bounds the error text of an entry, as it is stored (JSON-escaped): a longer
	// one is cut on a UTF-8 boundary and ends with a marker saying how long it was.
	MaxAttemptErrorBytes = 1024
)

// Attempt is one failed delivery of an event, as its history keeps it.
type Attempt struct {
	// At is when the attempt's failure was recorded; for a delivery that did not finish, when its
	// lease ran out.
	At time.Time
	// Number is the attempt's number, as Message.Attempt had it (1 for the first delivery). It starts
	// again at 1 after a requeue.
	Number int
	// Worker is the owner id of the worker that made the attempt (Worker.Owner).
	Worker string
	// Error is what the publisher said, at most MaxAttemptErrorBytes of it, or, for a delivery that
	// did not finish, that it did not.
	Error string
	// Duration is how long the attempt's publish took, from its start to its outcome (the whole
	// publish, splitting included: see docs/relay.md); 0 for a delivery that did not finish, whose
	// end nobody saw.
	Duration time.Duration
}

// Unfinished reports whether the attempt is a delivery that never recorded an outcome: its relay
// died, or stalled past its lease, and another relay took the event over.
func (a Attempt) Unfinished() bool { return a.Error == store.UnfinishedDelivery }

// storedAttempt is an entry of the attempt_history column.
type storedAttempt struct {
	At         string   `json:"at"`
	Attempt    int      `json:"attempt"`
	Worker     string   `json:"worker"`
	Error      string   `json:"error"`
	DurationMS *float64 `json:"duration_ms,omitempty"`
}

// AttemptHistory is the attempt_history column of the outbox table: a JSON array of the event's last
// failed attempts, oldest first, or nil (SQL NULL) while it has none. It is stored as jsonb on
// PostgreSQL (the relay appends to it with jsonb's functions), json on MySQL and MariaDB, and text on
// SQLite. Attempts decodes it; the Admin's EventInfo.History is the same, decoded.
type AttemptHistory []byte

// Attempts decodes the history, oldest first.
func (h AttemptHistory) Attempts() ([]Attempt, error) {
	if len(bytes.TrimSpace(h)) == 0 || string(h) == "null" {
		return nil, nil
	}
	var stored []storedAttempt
	if err := json.Unmarshal(h, &stored); err != nil {
		return nil, fmt.Errorf("outboxplugin: attempt history: %w", err)
	}
	out := make([]Attempt, len(stored))
	for i, s := range stored {
		a := Attempt{Number: s.Attempt, Worker: s.Worker, Error: s.Error}
		if s.At != "" {
			// Written by Go (RFC 3339) or, for an unfinished delivery, from the lease expiry in the
			// database's own text for a time.
			t, err := dbtime.Parse(s.At)
			if err != nil {
				return nil, fmt.Errorf("outboxplugin: attempt history: entry %d: %w", i, err)
			}
			a.At = t
		}
		if s.DurationMS != nil {
			a.Duration = time.Duration(*s.DurationMS * float64(time.Millisecond)).Round(time.Microsecond)
		}
		out[i] = a
	}
	return out, nil
}

// Value sends the history as text; a nil history is NULL.
func (h AttemptHistory) Value() (driver.Value, error) {
	if h == nil {
		return nil, nil
	}
	return string(h), nil
}

// Scan reads the history from a JSON, text or blob column.
func (h *AttemptHistory) Scan(src any) error {
	var j JSON
	if err := j.Scan(src); err != nil {
		return err
	}
	*h = AttemptHistory(j)
	return nil
}

// MarshalJSON embeds the history as it is; a nil history is null.
func (h AttemptHistory) MarshalJSON() ([]byte, error) { return JSON(h).MarshalJSON() }

// UnmarshalJSON keeps a copy of the document.
func (h *AttemptHistory) UnmarshalJSON(b []byte) error {
	if h == nil {
		return errors.New("outboxplugin: AttemptHistory: UnmarshalJSON on nil pointer")
	}
	*h = append((*h)[:0], b...)
	return nil
}

// GormDataType is the generic type GORM reports for the column.
func (AttemptHistory) GormDataType() string { return "json" }

// GormDBDataType picks the column type per database: jsonb on PostgreSQL, whose || and jsonpath
// functions append and trim it in place (the relay's own document: unlike a payload, its text need not
// stay as written); json on MySQL and MariaDB; text on SQLite. The column is nullable without a default,
// so that AutoMigrate adds it to a table of an earlier version at no cost: PostgreSQL and MariaDB record
// such a column in the catalog without rewriting the table, and SQLite's ADD COLUMN never rewrites.
func (AttemptHistory) GormDBDataType(db *gorm.DB, _ *schema.Field) string {
	switch db.Dialector.Name() {
	case "postgres":
		return "jsonb"
	case "mysql":
		return "json"
	default:
		return "text"
	}
}

// attemptRecord is the failed attempt a failure statement appends to its rows' histories (with the
// worker's owner id): the rows of one statement failed alike, in one publish, at the same attempt.
type attemptRecord struct {
	at     time.Time
	number int
	err    string // bounded (boundAttemptError)
	took   time.Duration
}

// failedAttempt is the record of a refused delivery of a message at attempt number, whose publish took
// took: err, cut to MaxAttemptErrorBytes.
func failedAttempt(at time.Time, number int, err error, took time.Duration) attemptRecord {
	text := ""
	if err != nil {
		text = err.Error()
	}
	return attemptRecord{at: at, number: number, err: boundAttemptError(text), took: took}
}

// Entry is the record as the JSON object the column keeps.
func (r attemptRecord) Entry(worker string) string {
	ms := float64(r.took.Microseconds()) / 1000
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	// <, > and & as they are: boundAttemptError counts them as one byte each.
	enc.SetEscapeHTML(false)
	// A struct of strings and numbers always encodes.
	_ = enc.Encode(storedAttempt{At: r.at.UTC().Format(time.RFC3339Nano), Attempt: r.number, Worker: worker, Error: r.err, DurationMS: &ms})
	return strings.TrimSuffix(b.String(), "\n")
}

// boundAttemptError returns s as storableText makes it, cut so that its JSON-escaped form takes at
// most MaxAttemptErrorBytes, on a rune boundary, with a marker saying how long s was. The escaped
// length is counted as encoding/json (and, after it, the databases) write a string: a quote or a
// backslash takes 2 bytes, a control character up to 6, U+2028 and U+2029 6; so the bound holds for
// the entry as stored, whatever s holds — a megabyte of text, or of control characters.
func boundAttemptError(s string) string {
	valid := storableText(s)
	if escapedLen(valid, MaxAttemptErrorBytes+1) <= MaxAttemptErrorBytes {
		return valid
	}
	marker := " … [cut: " + strconv.Itoa(len(s)) + " bytes in all]"
	budget := MaxAttemptErrorBytes - len(marker) // the marker needs no escaping
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

// storableText returns s with what the databases refuse in a text (and PostgreSQL in a jsonb string)
// replaced by U+FFFD: invalid UTF-8, and NUL. An error text holds whatever a broker or a client library
// put in it, and a statement that fails on it would leave the failure unrecorded.
func storableText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	return s
}

// cutText returns storableText(s) cut to at most max bytes, on a rune boundary.
func cutText(s string, max int) string {
	s = storableText(s)
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
