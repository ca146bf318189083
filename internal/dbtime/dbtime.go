// Package dbtime reads the time columns of the outbox table as the three databases' drivers hand them
// over: a time.Time from PostgreSQL's and MySQL's drivers, and on SQLite, where a time is stored as
// text, that text (RETURNING, and expressions that are not a declared column, give it as it is stored).
// The relay's claim and the Admin read times through it; every time it returns is in UTC.
package dbtime

import (
	"fmt"
	"time"
)

// FromColumn reads a scanned time column: a time.Time, or the text a SQLite driver stored (string or
// []byte). Any other value is an error naming its type.
func FromColumn(v any) (time.Time, error) {
	switch t := v.(type) {
	case time.Time:
		return t.UTC(), nil
	case string:
		return Parse(t)
	case []byte:
		return Parse(string(t))
	}
	return time.Time{}, fmt.Errorf("unexpected %T", v)
}

// storedLayouts are the text forms SQLite drivers write times in, with and without a zone, and RFC
// 3339, as the attempt history's JSON holds them.
var storedLayouts = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	time.RFC3339Nano,
}

// Parse reads a time stored as text in one of the drivers' forms; a time without a zone is UTC.
func Parse(s string) (time.Time, error) {
	for _, layout := range storedLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("cannot parse %q", s)
}
