package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gorm-outbox/outboxplugin"
)

// filterFlags are the flags that select events, shared by events list and the dead commands.
type filterFlags struct {
	eventType, aggregateType, aggregateID, messageID string
	lastError                                        string
	since, until                                     string
}

func (f *filterFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.eventType, "type", "", "only events of this event type")
	fs.StringVar(&f.aggregateType, "aggregate-type", "", "only events of this aggregate type (give --aggregate-id too)")
	fs.StringVar(&f.aggregateID, "aggregate-id", "", "only events of this aggregate id (give --aggregate-type too)")
	fs.StringVar(&f.messageID, "message-id", "", "only the event with this message id")
	fs.StringVar(&f.lastError, "error", "", "only events whose last error is exactly this text (dead and waiting events have one): a cause of outbox dead groups")
	fs.StringVar(&f.since, "since", "", "only events created at or after this time: RFC 3339 (2026-01-02T15:04:05Z) or a duration ago (90m, 2h, 7d)")
	fs.StringVar(&f.until, "until", "", "only events created before this time: RFC 3339 or a duration ago")
}

// set reports whether any of the filter flags was given.
func (f *filterFlags) set() bool {
	return f.eventType != "" || f.aggregateType != "" || f.aggregateID != "" || f.messageID != "" || f.lastError != "" ||
		f.since != "" || f.until != ""
}

// filter returns the EventFilter of the flags, as of now.
func (f *filterFlags) filter(now time.Time) (outboxplugin.EventFilter, error) {
	ef := outboxplugin.EventFilter{
		EventType:     f.eventType,
		AggregateType: f.aggregateType,
		AggregateID:   f.aggregateID,
		MessageID:     f.messageID,
		LastError:     f.lastError,
	}
	// The Admin matches an aggregate by both parts: one alone would match the events with the other empty.
	if (f.aggregateType == "") != (f.aggregateID == "") {
		return ef, usagef("--aggregate-type and --aggregate-id go together: an aggregate is both")
	}
	var err error
	if ef.Since, err = parseTimeFlag("--since", f.since, now); err != nil {
		return ef, err
	}
	if ef.Until, err = parseTimeFlag("--until", f.until, now); err != nil {
		return ef, err
	}
	if !ef.Since.IsZero() && !ef.Until.IsZero() && !ef.Since.Before(ef.Until) {
		return ef, usagef("--since %s is not before --until %s", f.since, f.until)
	}
	return ef, nil
}

// parseTimeFlag reads an RFC 3339 time, or a duration ago (see parseAge); "" is the zero time.
func parseTimeFlag(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := parseAge(v)
	if err != nil {
		return time.Time{}, usagef("%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago (2h, 7d)", flag, v)
	}
	return now.Add(-d), nil
}

// parseAge reads a non-negative Go duration (90m, 2h30m) that may start with a number of days (7d,
// 1d12h, 1.5d).
func parseAge(v string) (time.Duration, error) {
	s := strings.TrimSpace(v)
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("negative duration %q", v)
	}
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseFloat(s[:i], 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("duration %q: bad number of days", v)
		}
		days = time.Duration(n * float64(24*time.Hour))
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want a Go duration (90m, 2h) or days (7d)", v)
	}
	if d < 0 {
		return 0, fmt.Errorf("negative duration %q", v)
	}
	return days + d, nil
}
