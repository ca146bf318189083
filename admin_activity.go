package outboxplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/dbtime"
)

// DeadGroup is the dead events that failed with one error text: of one event type (DeadGroups), or of
// any event type (DeadCauses, where EventType is ""). EventFilter{EventType: g.EventType, LastError:
// g.LastError} selects the group's events, for ListEvents, RequeueWhere and DiscardWhere.
//
// Its JSON form is the one of outbox dead groups --json: snake_case names, times in RFC 3339.
type DeadGroup struct {
	// EventType is the group's event type; "" in a group of DeadCauses, which spans every type.
	EventType string `json:"event_type,omitempty"`
	// LastError is the error text the group's events died with ("" for events made dead without
	// one, which EventFilter.LastError cannot select). EventFilter.LastError selects the group.
	LastError string `json:"last_error"`
	Count     int64  `json:"count"`
	// EventTypes is how many event types the group's events have: 1 in a group of DeadGroups.
	EventTypes int64 `json:"event_types"`
	// FirstDead and LastDead bound when the group's events died.
	FirstDead time.Time `json:"first_dead"`
	LastDead  time.Time `json:"last_dead"`
}

// MaxDeadGroups bounds the groups DeadGroups and DeadCauses return.
const MaxDeadGroups = 1000

// DeadGroups returns the dead events grouped by event type and error text, largest groups first, at
// most limit of them (1..MaxDeadGroups, 0 for 100), and whether there were more. It reads every dead
// row, through the dead index (PostgreSQL, SQLite) or the claim index's leading columns
// (MySQL/MariaDB): dead events wait for a person, and a healthy outbox keeps few.
func (a *Admin) DeadGroups(ctx context.Context, limit int) ([]DeadGroup, bool, error) {
	groups, more, err := a.deadGroups(ctx, true, limit)
	if err != nil {
		return nil, false, fmt.Errorf("outboxplugin: DeadGroups of %s: %w", a.table, err)
	}
	return groups, more, nil
}

// DeadCauses returns the dead events grouped by error text alone, whatever their event type, largest
// first, at most limit of them (1..MaxDeadGroups, 0 for 100), and whether there were more: one cause
// (a stream that does not exist, a broker that refused a credential) is one group however many event
// types it stopped, and RequeueWhere(EventFilter{State: StateDead, LastError: g.LastError}) requeues
// all of it at once. Each group's EventType is "", and EventTypes says how many types it spans. It
// reads what DeadGroups reads.
func (a *Admin) DeadCauses(ctx context.Context, limit int) ([]DeadGroup, bool, error) {
	groups, more, err := a.deadGroups(ctx, false, limit)
	if err != nil {
		return nil, false, fmt.Errorf("outboxplugin: DeadCauses of %s: %w", a.table, err)
	}
	return groups, more, nil
}

// deadGroups groups the dead rows by error text, and by event type too when byType.
func (a *Admin) deadGroups(ctx context.Context, byType bool, limit int) ([]DeadGroup, bool, error) {
	switch {
	case limit == 0:
		limit = 100
	case limit < 0 || limit > MaxDeadGroups:
		return nil, false, fmt.Errorf("%w: limit %d: want 1..%d", ErrInvalidFilter, limit, MaxDeadGroups)
	}
	// The same columns either way: a group of one type spans one type, and a cause has no type.
	eventType, types, key := `c.event_type`, `1`, `c.event_type, COALESCE(c.last_error, '')`
	if !byType {
		eventType, types, key = `''`, `COUNT(DISTINCT c.event_type)`, `COALESCE(c.last_error, '')`
	}
	rows, err := a.query(ctx, `SELECT `+eventType+`, COALESCE(c.last_error, ''), COUNT(*), `+types+`, MIN(c.dead_at), MAX(c.dead_at) FROM `+
		a.q.Table()+` c WHERE `+deadGroup+` GROUP BY `+key+` ORDER BY COUNT(*) DESC, `+key+` LIMIT `+strconv.Itoa(limit+1))
	if err != nil {
		return nil, false, err
	}
	var out []DeadGroup
	for rows.Next() {
		var (
			g           DeadGroup
			first, last any
		)
		if err := rows.Scan(&g.EventType, &g.LastError, &g.Count, &g.EventTypes, &first, &last); err != nil {
			rows.Close()
			return nil, false, err
		}
		if g.FirstDead, err = dbtime.FromColumn(first); err == nil {
			g.LastDead, err = dbtime.FromColumn(last)
		}
		if err != nil {
			rows.Close()
			return nil, false, fmt.Errorf("dead_at: %w", err)
		}
		out = append(out, g)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, false, err
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

// Activity is what the relay has done lately, read from the table: how many of the events written in
// each of the last few intervals are published, and how long the latest published events waited.
//
// Its JSON form names its fields in snake_case, as Stats's does, with the durations in seconds
// (interval_seconds, lag_p50_seconds, lag_p90_seconds, lag_max_seconds; floats).
type Activity struct {
	At time.Time `json:"at"`
	// Start is the start of the first interval, Interval their length: Published[i] counts the
	// processed events written in [Start + i*Interval, Start + (i+1)*Interval).
	Start     time.Time     `json:"start"`
	Interval  time.Duration `json:"-"`
	Published []int64       `json:"published"`
	// AtLeast[i] is true when interval i holds more than ActivityIntervalLimit processed events:
	// Published[i] is then that limit, a lower bound.
	AtLeast []bool `json:"at_least"`
	// LagSample is the number of most recently written processed events (up to ActivityLagSample)
	// that LagP50, LagP90 and LagMax, the time from their write to their publish, are taken from.
	LagSample              int           `json:"lag_sample"`
	LagP50, LagP90, LagMax time.Duration `json:"-"`
}

// activityFields is Activity without its methods; activityJSON its JSON form.
type (
	activityFields Activity
	activityJSON   struct {
		activityFields
		IntervalSeconds float64 `json:"interval_seconds"`
		LagP50Seconds   float64 `json:"lag_p50_seconds"`
		LagP90Seconds   float64 `json:"lag_p90_seconds"`
		LagMaxSeconds   float64 `json:"lag_max_seconds"`
	}
)

// MarshalJSON writes a with its durations in seconds (see Activity).
func (a Activity) MarshalJSON() ([]byte, error) {
	return json.Marshal(activityJSON{activityFields(a), a.Interval.Seconds(), a.LagP50.Seconds(), a.LagP90.Seconds(), a.LagMax.Seconds()})
}

// UnmarshalJSON reads the JSON that MarshalJSON writes.
func (a *Activity) UnmarshalJSON(b []byte) error {
	var in activityJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*a = Activity(in.activityFields)
	seconds := func(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }
	a.Interval, a.LagP50, a.LagP90, a.LagMax = seconds(in.IntervalSeconds), seconds(in.LagP50Seconds), seconds(in.LagP90Seconds), seconds(in.LagMaxSeconds)
	return nil
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
	at := a.q.Clock(now())
	act := Activity{At: at, Interval: interval, Start: at.Truncate(interval).Add(-time.Duration(n-1) * interval),
		Published: make([]int64, n), AtLeast: make([]bool, n)}
	processed := a.processedGroup()
	if a.dialect == "postgres" {
		processed += ` AND c.processed IS TRUE` // an index condition again (see selectEvents)
	}
	count := `SELECT COUNT(*) FROM (SELECT 1 FROM ` + a.q.Table() + ` c WHERE ` + processed +
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

	rows, err := a.query(ctx, `SELECT c.created_at, c.processed_at FROM `+a.q.Table()+` c WHERE `+processed+
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
		c, err := dbtime.FromColumn(created)
		if err != nil {
			rows.Close()
			return fail(err)
		}
		p, err := dbtime.FromColumn(published)
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
