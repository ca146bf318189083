package outboxplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/relay/store"
)

// The outcome of a publish, and what the worker writes for it, need no database: splitPublish and
// decide are pure apart from the publisher they call.

func testMessages(n int) []Message {
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{ID: fmt.Sprintf("m%03d", i), Attempt: 1}
	}
	return msgs
}

// scripted is a publisher whose answer is a function of the messages of each call; it counts calls.
type scripted struct {
	calls  int
	answer func(msgs []Message) error
}

func (s *scripted) call(_ context.Context, msgs []Message) error {
	s.calls++
	return s.answer(msgs)
}

func kinds(out []delivery) map[deliveryKind]int {
	m := map[deliveryKind]int{}
	for _, d := range out {
		m[d.kind]++
	}
	return m
}

func TestSplitPublish(t *testing.T) {
	down := errors.New("connection refused")
	poison := func(ids ...string) func([]Message) error {
		return func(msgs []Message) error {
			for _, m := range msgs {
				if slices.Contains(ids, m.ID) {
					return errors.New("message too large") // the whole batch fails, naming none
				}
			}
			return nil
		}
	}
	cases := []struct {
		name      string
		n         int
		answer    func([]Message) error
		want      map[deliveryKind]int
		refused   []string // ids that must be refused
		maxCalls  int
		unknownID []string
	}{
		{name: "all taken", n: 100, answer: func([]Message) error { return nil },
			want: map[deliveryKind]int{delivered: 100}, maxCalls: 1},
		{name: "broker down: no attempt, a few calls", n: 100, answer: func([]Message) error { return down },
			want: map[deliveryKind]int{unsent: 100}, maxCalls: splitBudget},
		{name: "broker down, said so: one call", n: 100,
			answer: func([]Message) error { return fmt.Errorf("dial: %w", ErrBrokerUnavailable) },
			want:   map[deliveryKind]int{unsent: 100}, maxCalls: 1},
		{name: "one poison message failing its whole batch", n: 100, answer: poison("m037"),
			want: map[deliveryKind]int{delivered: 99, refused: 1}, refused: []string{"m037"}, maxCalls: 20},
		{name: "three poison messages", n: 100, answer: poison("m000", "m050", "m099"),
			want: map[deliveryKind]int{delivered: 97, refused: 3}, refused: []string{"m000", "m050", "m099"}, maxCalls: 60},
		{name: "a lone message failing: no attempt", n: 1, answer: func([]Message) error { return down },
			want: map[deliveryKind]int{unsent: 1}, maxCalls: 1},
		{name: "an empty PublishError fails the whole batch", n: 10,
			answer: func([]Message) error { return fmt.Errorf("down: %w", &PublishError{}) },
			want:   map[deliveryKind]int{unsent: 10}, maxCalls: splitBudget},
		{name: "a PublishError naming only strangers fails the whole batch", n: 10,
			answer: func([]Message) error { return &PublishError{Failed: map[string]error{"stranger": down}} },
			want:   map[deliveryKind]int{unsent: 10}, maxCalls: splitBudget, unknownID: []string{"stranger"}},
		{name: "named refusals, strangers ignored", n: 10,
			answer: func([]Message) error {
				return &PublishError{Failed: map[string]error{"m002": errors.New("nack"), "stranger": down}}
			},
			want: map[deliveryKind]int{delivered: 9, refused: 1}, refused: []string{"m002"}, maxCalls: 1, unknownID: []string{"stranger"}},
		{name: "named as not delivered", n: 10,
			answer: func([]Message) error {
				return FailedMessages(map[string]error{"m004": fmt.Errorf("ack timeout: %w", ErrBrokerUnavailable)})
			},
			want: map[deliveryKind]int{delivered: 9, unsent: 1}, maxCalls: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &scripted{answer: c.answer}
			msgs := testMessages(c.n)
			out, unknown := splitPublish(context.Background(), msgs, s.call)
			if got := kinds(out); !mapsEqual(got, c.want) {
				t.Errorf("outcomes %v, want %v", got, c.want)
			}
			for i, d := range out {
				if slices.Contains(c.refused, msgs[i].ID) != (d.kind == refused) {
					t.Errorf("%s: %v", msgs[i].ID, d.kind)
				}
				if d.kind != delivered && d.err == nil {
					t.Errorf("%s: not delivered without an error", msgs[i].ID)
				}
			}
			if s.calls > c.maxCalls {
				t.Errorf("%d calls, want at most %d", s.calls, c.maxCalls)
			}
			if !slices.Equal(unknown, c.unknownID) {
				t.Errorf("unknown ids %v, want %v", unknown, c.unknownID)
			}
		})
	}
}

// A publish timeout cuts the batch short: what was not confirmed is not delivered, without an attempt.
func TestSplitPublishTimeout(t *testing.T) {
	// The publish timeout ends during the first call (cancelled there, so that no load on the machine
	// can end it before the call begins).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	out, _ := splitPublish(ctx, testMessages(8), func(ctx context.Context, _ []Message) error {
		calls++
		cancel()
		<-ctx.Done()
		return context.DeadlineExceeded
	})
	if got := kinds(out); got[unsent] != 8 {
		t.Errorf("outcomes %v, want 8 unsent", got)
	}
	if calls != 1 {
		t.Errorf("%d calls after the timeout, want 1", calls)
	}
}

func mapsEqual(a, b map[deliveryKind]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

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
	policy := ExponentialBackoff{Base: time.Second, Max: time.Minute}

	t.Run("published, refused, dead and not delivered", func(t *testing.T) {
		o := decide(rows(1, 1, 3, 1, 2), []delivery{
			{kind: delivered}, {kind: refused, err: refusal}, {kind: refused, err: refusal}, {kind: unsent, err: down}, {kind: refused, err: refusal},
		}, false, 3, policy, now)
		if len(o.done) != 1 || o.done[0].ID != 1 {
			t.Errorf("done %v", o.done)
		}
		if len(o.dead) != 1 || o.dead[0].id != 3 || o.dead[0].err != "nack" {
			t.Errorf("dead %v: the refusal at the last attempt", o.dead)
		}
		if len(o.retries) != 2 {
			t.Fatalf("retries %v: one group per attempt number", o.retries)
		}
		if o.retries[0].next != now.Add(time.Second) || !slices.Equal(o.retries[0].ids, []int64{2}) {
			t.Errorf("first retry group %+v", o.retries[0])
		}
		if o.retries[1].next != now.Add(2*time.Second) || !slices.Equal(o.retries[1].ids, []int64{5}) {
			t.Errorf("second retry group %+v", o.retries[1])
		}
		if len(o.released) != 1 || o.released[0].id != 4 || o.released[0].err != "connection lost" {
			t.Errorf("released %v: not delivered, handed back with its error", o.released)
		}
		if len(o.unsent) != 1 || o.stopped != 0 || o.outage {
			t.Errorf("unsent %d stopped %d outage %v", len(o.unsent), o.stopped, o.outage)
		}
		if len(o.failed) != 3 {
			t.Errorf("failed %d, want the 3 refusals", len(o.failed))
		}
	})
	t.Run("an outage makes nothing dead, even at the last attempt", func(t *testing.T) {
		o := decide(rows(10, 10), []delivery{{kind: unsent, err: down}, {kind: unsent, err: down}}, false, 10, policy, now)
		if len(o.dead) != 0 || len(o.released) != 2 || !o.outage {
			t.Errorf("dead %d released %d outage %v", len(o.dead), len(o.released), o.outage)
		}
	})
	t.Run("stopping hands back all but what was delivered", func(t *testing.T) {
		o := decide(rows(1, 1, 1), []delivery{{kind: delivered}, {kind: refused, err: refusal}, {kind: unsent, err: context.Canceled}}, true, 3, policy, now)
		if len(o.done) != 1 || len(o.released) != 2 || o.stopped != 2 || len(o.unsent) != 0 || o.outage {
			t.Errorf("done %d released %d stopped %d unsent %d outage %v", len(o.done), len(o.released), o.stopped, len(o.unsent), o.outage)
		}
		for _, r := range o.released {
			if r.err != "" {
				t.Errorf("a shutdown records no error: %q", r.err)
			}
		}
	})
	t.Run("a refusal is no outage", func(t *testing.T) {
		o := decide(rows(1, 1), []delivery{{kind: refused, err: refusal}, {kind: unsent, err: down}}, false, 3, policy, now)
		if o.outage {
			t.Error("the broker answered")
		}
	})
}
