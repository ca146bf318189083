package outboxplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/gorm-outbox/outboxplugin/internal/relay"
)

// The outcome of a publish, as the engine reads this package's publisher errors, needs no database:
// relay.SplitPublish is pure apart from the publisher it calls.

// splitPublish publishes msgs with call the way the engine does, reading the errors through
// publisherAnswers.
func splitPublish(ctx context.Context, msgs []Message, call func(context.Context, []Message) error) ([]relay.Delivery, []string) {
	return relay.SplitPublish(ctx, len(msgs), func(i int) string { return msgs[i].ID },
		func(ctx context.Context, lo, hi int) error { return call(ctx, msgs[lo:hi]) }, publisherAnswers)
}

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

func kinds(out []relay.Delivery) map[relay.DeliveryKind]int {
	m := map[relay.DeliveryKind]int{}
	for _, d := range out {
		m[d.Kind]++
	}
	return m
}

func TestSplitPublish(t *testing.T) {
	down := errors.New("connection relay.Refused")
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
		want      map[relay.DeliveryKind]int
		refused   []string // ids that must be refused
		maxCalls  int
		unknownID []string
	}{
		{name: "all taken", n: 100, answer: func([]Message) error { return nil },
			want: map[relay.DeliveryKind]int{relay.Delivered: 100}, maxCalls: 1},
		{name: "broker down: no attempt, a few calls", n: 100, answer: func([]Message) error { return down },
			want: map[relay.DeliveryKind]int{relay.Unsent: 100}, maxCalls: relay.SplitBudget},
		{name: "broker down, said so: one call", n: 100,
			answer: func([]Message) error { return fmt.Errorf("dial: %w", ErrBrokerUnavailable) },
			want:   map[relay.DeliveryKind]int{relay.Unsent: 100}, maxCalls: 1},
		{name: "one poison message failing its whole batch", n: 100, answer: poison("m037"),
			want: map[relay.DeliveryKind]int{relay.Delivered: 99, relay.Refused: 1}, refused: []string{"m037"}, maxCalls: 20},
		{name: "three poison messages", n: 100, answer: poison("m000", "m050", "m099"),
			want: map[relay.DeliveryKind]int{relay.Delivered: 97, relay.Refused: 3}, refused: []string{"m000", "m050", "m099"}, maxCalls: 60},
		{name: "a lone message failing: no attempt", n: 1, answer: func([]Message) error { return down },
			want: map[relay.DeliveryKind]int{relay.Unsent: 1}, maxCalls: 1},
		{name: "an empty PublishError fails the whole batch", n: 10,
			answer: func([]Message) error { return fmt.Errorf("down: %w", &PublishError{}) },
			want:   map[relay.DeliveryKind]int{relay.Unsent: 10}, maxCalls: relay.SplitBudget},
		{name: "a PublishError naming only strangers fails the whole batch", n: 10,
			answer: func([]Message) error { return &PublishError{Failed: map[string]error{"stranger": down}} },
			want:   map[relay.DeliveryKind]int{relay.Unsent: 10}, maxCalls: relay.SplitBudget, unknownID: []string{"stranger"}},
		{name: "named refusals, strangers ignored", n: 10,
			answer: func([]Message) error {
				return &PublishError{Failed: map[string]error{"m002": errors.New("nack"), "stranger": down}}
			},
			want: map[relay.DeliveryKind]int{relay.Delivered: 9, relay.Refused: 1}, refused: []string{"m002"}, maxCalls: 1, unknownID: []string{"stranger"}},
		{name: "named as not relay.Delivered", n: 10,
			answer: func([]Message) error {
				return FailedMessages(map[string]error{"m004": fmt.Errorf("ack timeout: %w", ErrBrokerUnavailable)})
			},
			want: map[relay.DeliveryKind]int{relay.Delivered: 9, relay.Unsent: 1}, maxCalls: 1},
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
				if slices.Contains(c.refused, msgs[i].ID) != (d.Kind == relay.Refused) {
					t.Errorf("%s: %v", msgs[i].ID, d.Kind)
				}
				if d.Kind != relay.Delivered && d.Err == nil {
					t.Errorf("%s: not relay.Delivered without an error", msgs[i].ID)
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

// A publish timeout cuts the batch short: what was not confirmed is not relay.Delivered, without an attempt.
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
	if got := kinds(out); got[relay.Unsent] != 8 {
		t.Errorf("outcomes %v, want 8 relay.Unsent", got)
	}
	if calls != 1 {
		t.Errorf("%d calls after the timeout, want 1", calls)
	}
}

func mapsEqual(a, b map[relay.DeliveryKind]int) bool {
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
