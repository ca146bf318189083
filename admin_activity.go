package outboxplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// DeadGroup is the dead events of one event type that failed with one error text.
type DeadGroup struct {
	EventType string
	// LastError is the error text the group's events died with ("" for events made dead without
	// one). EventFilter.LastError selects the group.
	LastError string
	Count     int64
	// FirstDead and LastDead bound when the group's events died.
	FirstDead, LastDead time.Time
}

// MaxDeadGroups bounds the groups DeadGroups returns.
const MaxDeadGroups = 1000

// DeadGroups returns the dead events grouped by event type and error text, largest groups first, at
// most limit of them (1..MaxDeadGroups, 0 for 100), and whether there were more. It reads every dead
// row, through the dead index (PostgreSQL, SQLite) or the claim index's leading columns
// (MySQL/MariaDB): dead events wait for a person, and a healthy outbox keeps few.
func (a *Admin) DeadGroups(ctx context.Context, limit int) ([]DeadGroup, bool, error) {
	switch {
	case limit == 0:
		limit = 100
	case limit < 0 || limit > MaxDeadGroups:
		return nil, false, fmt.Errorf("outboxplugin: DeadGroups: %w: limit %d: want 1..%d", ErrInvalidFilter, limit, MaxDeadGroups)
	}
	rows, err := a.query(ctx, `SELECT c.event_type, COALESCE(c.last_error, ''), COUNT(*), MIN(c.dead_at), MAX(c.dead_at) FROM `+
		a.q.table+` c WHERE `+deadGroup+` GROUP BY c.event_type, COALESCE(c.last_error, '')`+
		` ORDER BY COUNT(*) DESC, c.event_type, COALESCE(c.last_error, '') LIMIT `+strconv.Itoa(limit+1))
	if err != nil {
		return nil, false, fmt.Errorf("outboxplugin: DeadGroups of %s: %w", a.table, err)
	}
	var out []DeadGroup
	for rows.Next() {
		var (
			g           DeadGroup
			first, last any
		)
		if err := rows.Scan(&g.EventType, &g.LastError, &g.Count, &first, &last); err != nil {
			rows.Close()
			return nil, false, fmt.Errorf("outboxplugin: DeadGroups of %s: %w", a.table, err)
		}
		if g.FirstDead, err = asTime(first); err == nil {
			g.LastDead, err = asTime(last)
		}
		if err != nil {
			rows.Close()
			return nil, false, fmt.Errorf("outboxplugin: DeadGroups of %s: dead_at: %w", a.table, err)
		}
		out = append(out, g)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, false, fmt.Errorf("outboxplugin: DeadGroups of %s: %w", a.table, err)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

// Activity is what the relay has done lately, read from the table: how many of the events written in
// each of the last few intervals are published, and how long the latest published events waited.
type Activity struct {
	At time.Time
	// Start is the start of the first interval, Interval their length: Published[i] counts the
	// processed events written in [Start + i*Interval, Start + (i+1)*Interval).
	Start     time.Time
	Interval  time.Duration
	Published []int64
	// AtLeast[i] is true when interval i holds more than ActivityIntervalLimit processed events:
	// Published[i] is then that limit, a lower bound.
	AtLeast []bool
	// LagSample is the number of most recently written processed events (up to ActivityLagSample)
	// that LagP50, LagP90 and LagMax, the time from their write to their publish, are taken from.
	LagSample              int
	LagP50, LagP90, LagMax time.Duration
}

const (
	// ActivityIntervalLimit bounds how many processed rows Activity counts per interval.
	ActivityIntervalLimit = 10000
	// ActivityLagSample is how many of the latest processed events Activity's lag is taken from.
	ActivityLagSample    = 200
	maxActivityIntervals = 120
)

// Activity counts, for each of n intervals of length interval ending now, the processed events
// written in it (by their created_at, through the processed index: up to ActivityIntervalLimit per
// interval, so a page can draw it at any rate, saying "at least" above), and takes the commit→publish
// lag of the latest ActivityLagSample processed events (processed_at - created_at; the processed
// index, newest first). n is 1..120; interval at least a second. Events a worker deletes on publish
// (WithDeleteOnPublish) leave nothing to count.
func (a *Admin) Activity(ctx context.Context, n int, interval time.Duration) (Activity, error) {
	fail := func(err error) (Activity, error) {
		return Activity{}, fmt.Errorf("outboxplugin: Activity of %s: %w", a.table, err)
	}
	if n < 1 || n > maxActivityIntervals || interval < time.Second {
		return fail(fmt.Errorf("%w: %d intervals of %v: want 1..%d intervals of at least 1s", ErrInvalidFilter, n, interval, maxActivityIntervals))
	}
	at := a.q.d.clock(now())
	act := Activity{At: at, Interval: interval, Start: at.Truncate(interval).Add(-time.Duration(n-1) * interval),
		Published: make([]int64, n), AtLeast: make([]bool, n)}
	processed := processedGroup
	if a.dialect == "postgres" {
		processed += ` AND c.processed IS TRUE` // an index condition again (see selectEvents)
	}
	count := `SELECT COUNT(*) FROM (SELECT 1 FROM ` + a.q.table + ` c WHERE ` + processed +
		` AND c.created_at >= ? AND c.created_at < ? LIMIT ` + strconv.Itoa(ActivityIntervalLimit+1) + `) x`
	for i := range n {
		from := act.Start.Add(time.Duration(i) * interval)
		rows, err := a.query(ctx, count, from, from.Add(interval))
		if err != nil {
			return fail(err)
		}
		var c int64
		if rows.Next() {
			err = rows.Scan(&c)
		}
		if err := errors.Join(err, rows.Err(), rows.Close()); err != nil {
			return fail(err)
		}
		act.Published[i], act.AtLeast[i] = min(c, ActivityIntervalLimit), c > ActivityIntervalLimit
	}

	rows, err := a.query(ctx, `SELECT c.created_at, c.processed_at FROM `+a.q.table+` c WHERE `+processed+
		` ORDER BY c.created_at DESC LIMIT `+strconv.Itoa(ActivityLagSample))
	if err != nil {
		return fail(err)
	}
	var lags []time.Duration
	for rows.Next() {
		var created, published any
		if err := rows.Scan(&created, &published); err != nil {
			rows.Close()
			return fail(err)
		}
		if published == nil {
			continue
		}
		c, err := asTime(created)
		if err != nil {
			rows.Close()
			return fail(err)
		}
		p, err := asTime(published)
		if err != nil {
			rows.Close()
			return fail(err)
		}
		lags = append(lags, max(p.Sub(c), 0))
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fail(err)
	}
	if len(lags) > 0 {
		slices.Sort(lags)
		q := func(p float64) time.Duration { return lags[min(int(p*float64(len(lags))), len(lags)-1)] }
		act.LagSample, act.LagP50, act.LagP90, act.LagMax = len(lags), q(0.5), q(0.9), lags[len(lags)-1]
	}
	return act, nil
}
