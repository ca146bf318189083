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

// SplitPublish reads a publisher's errors only through Answers: named failures are refusals unless
// NotTaken says otherwise, ids not in the batch are reported once each, and a batch whose calls fail
// whole is given up on after SplitBudget calls while the broker has taken none of it.
func TestSplitPublishThroughAnswers(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	id := func(i int) string { return ids[i] }
	named := errors.New("named")
	down := errors.New("down")
	answers := Answers{
		Named: func(err error) (map[string]error, bool) {
			if err == named {
				return map[string]error{"b": errors.New("refused"), "c": down, "zz": nil}, true
			}
			return nil, false
		},
		NotTaken: func(err error) bool { return err == down },
	}
	calls := 0
	out, unknown := SplitPublish(context.Background(), len(ids), id, func(_ context.Context, lo, hi int) error {
		calls++
		if lo == 0 && hi == 4 {
			return named
		}
		return nil
	}, answers)
	kinds := []DeliveryKind{out[0].Kind, out[1].Kind, out[2].Kind, out[3].Kind}
	if !slices.Equal(kinds, []DeliveryKind{Delivered, Refused, Unsent, Delivered}) || calls != 1 {
		t.Errorf("kinds %v after %d calls", kinds, calls)
	}
	if !slices.Equal(unknown, []string{"zz"}) {
		t.Errorf("unknown ids %v", unknown)
	}

	calls = 0
	out, _ = SplitPublish(context.Background(), 64, func(i int) string { return fmt.Sprint(i) }, func(context.Context, int, int) error {
		calls++
		return errors.New("timeout")
	}, answers)
	if calls != SplitBudget {
		t.Errorf("%d calls while the broker took nothing, want %d", calls, SplitBudget)
	}
	for i, d := range out {
		if d.Kind != Unsent {
			t.Fatalf("message %d: %v, want unsent: nothing says it was the message's fault", i, d.Kind)
		}
	}
}
