package outboxplugin

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/gorm-outbox/outboxplugin/internal/dbtime"
	"github.com/gorm-outbox/outboxplugin/internal/relay/failure"
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
	var stored []failure.Entry
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
