package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// What the worker writes for a batch needs no database: Decide is a pure function of the rows, what
// the publish did with each, and the time.

func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	rows := func(attempts ...int) []store.Row {
		out := make([]store.Row, len(attempts))
		for i, a := range attempts {
			out[i] = store.Row{ID: int64(i + 1), Msg: store.Message{ID: fmt.Sprint("m", i+1), Attempt: a}}
		}
		return out
	}
	refusal := errors.New("nack")
	down := errors.New("connection lost")
	backoff := func(attempt int) time.Duration { return time.Duration(attempt) * time.Second }

	t.Run("published, refused, dead and not delivered", func(t *testing.T) {
		o := Decide(rows(1, 1, 3, 1, 2), []Delivery{
			{Kind: Delivered}, {Kind: Refused, Err: refusal}, {Kind: Refused, Err: refusal}, {Kind: Unsent, Err: down}, {Kind: Refused, Err: refusal},
		}, false, 3, backoff, now)
		if len(o.Done) != 1 || o.Done[0].ID != 1 {
			t.Errorf("done %v", o.Done)
		}
		if len(o.Dead) != 1 || o.Dead[0].ID != 3 || o.Dead[0].Err != "nack" {
			t.Errorf("dead %v: the refusal at the last attempt", o.Dead)
		}
		if len(o.Retries) != 2 {
			t.Fatalf("retries %v: one group per attempt number", o.Retries)
		}
		if o.Retries[0].Next != now.Add(time.Second) || !slices.Equal(o.Retries[0].IDs, []int64{2}) {
			t.Errorf("first retry group %+v", o.Retries[0])
		}
		if o.Retries[1].Next != now.Add(2*time.Second) || !slices.Equal(o.Retries[1].IDs, []int64{5}) {
			t.Errorf("second retry group %+v", o.Retries[1])
		}
		if len(o.Released) != 1 || o.Released[0].ID != 4 || o.Released[0].Err != "connection lost" {
			t.Errorf("released %v: not delivered, handed back with its error", o.Released)
		}
		if len(o.Unsent) != 1 || o.Stopped != 0 || o.Outage {
			t.Errorf("unsent %d stopped %d outage %v", len(o.Unsent), o.Stopped, o.Outage)
		}
		if len(o.Failed) != 3 {
			t.Errorf("failed %d, want the 3 refusals", len(o.Failed))
		}
	})
	t.Run("an outage makes nothing dead, even at the last attempt", func(t *testing.T) {
		o := Decide(rows(10, 10), []Delivery{{Kind: Unsent, Err: down}, {Kind: Unsent, Err: down}}, false, 10, backoff, now)
		if len(o.Dead) != 0 || len(o.Released) != 2 || !o.Outage {
			t.Errorf("dead %d released %d outage %v", len(o.Dead), len(o.Released), o.Outage)
		}
	})
	t.Run("stopping hands back all but what was delivered", func(t *testing.T) {
		o := Decide(rows(1, 1, 1), []Delivery{{Kind: Delivered}, {Kind: Refused, Err: refusal}, {Kind: Unsent, Err: context.Canceled}}, true, 3, backoff, now)
		if len(o.Done) != 1 || len(o.Released) != 2 || o.Stopped != 2 || len(o.Unsent) != 0 || o.Outage {
			t.Errorf("done %d released %d stopped %d unsent %d outage %v", len(o.Done), len(o.Released), o.Stopped, len(o.Unsent), o.Outage)
		}
		for _, r := range o.Released {
			if r.Err != "" {
				t.Errorf("a shutdown records no error: %q", r.Err)
			}
		}
	})
	t.Run("a refusal is no outage", func(t *testing.T) {
		o := Decide(rows(1, 1), []Delivery{{Kind: Refused, Err: refusal}, {Kind: Unsent, Err: down}}, false, 3, backoff, now)
		if o.Outage {
			t.Error("the broker answered")
		}
	})
}
