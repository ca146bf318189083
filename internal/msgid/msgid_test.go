package msgid

import (
	"regexp"
	"sync"
	"testing"
	"time"
)

// The text form of a UUIDv7: version 7, variant 10xx.
var layout = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestNewHasTheLayoutOfRFC9562(t *testing.T) {
	for range 1000 {
		if id := New(); !layout.MatchString(id) {
			t.Fatalf("%q is not a UUIDv7", id)
		}
	}
}

// Ids of one process increase, also many within one millisecond (the counter), across a counter
// overflow (the timestamp moves forward) and when the clock steps back.
func TestNewIncreases(t *testing.T) {
	now := time.Now().UnixMilli()
	for _, tc := range []struct {
		name  string
		ticks []int64 // the clock at each id
	}{
		{"one millisecond", repeat(now+1000, 5000)}, // more than the 4096 the counter holds
		{"clock steps back", []int64{now + 3000, now + 3000, now + 2000, now + 1000, now + 3001}},
		{"clock moves on", []int64{now + 4000, now + 4001, now + 4005, now + 5000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prev := ""
			for i, ms := range tc.ticks {
				id := newAt(ms)
				if id <= prev {
					t.Fatalf("id %d, %s, is not after %s", i, id, prev)
				}
				prev = id
			}
		})
	}
}

func repeat(ms int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = ms
	}
	return out
}

// Goroutines making ids at once never get the same one.
func TestNewIsUniqueAcrossGoroutines(t *testing.T) {
	const goroutines, each = 8, 2000
	var mu sync.Mutex
	seen := make(map[string]bool, goroutines*each)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			ids := make([]string, each)
			for i := range ids {
				ids[i] = New()
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				if seen[id] {
					t.Errorf("%s made twice", id)
				}
				seen[id] = true
			}
		})
	}
	wg.Wait()
}

func TestTime(t *testing.T) {
	// An hour ahead of the clock and of every other test's ticks (a few seconds ahead at most), so
	// that the id keeps its own timestamp: a fixed date became the past, and the process's clock won.
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	made := newAt(at.UnixMilli())
	for _, tc := range []struct {
		id   string
		want time.Time
		ok   bool
	}{
		{made, at, true},
		{"017f22e2-79b0-7cc3-98c4-dc0c0c07398f", time.UnixMilli(0x017f22e279b0).UTC(), true}, // RFC 9562, appendix A.6
		{"017f22e2-79b0-4cc3-98c4-dc0c0c07398f", time.Time{}, false},                         // version 4
		{"017f22e2-79b0-7cc3-98c4-dc0c0c07398", time.Time{}, false},                          // short
		{"017f22e2x79b0-7cc3-98c4-dc0c0c07398f", time.Time{}, false},                         // no dash
		{"017f22g2-79b0-7cc3-98c4-dc0c0c07398f", time.Time{}, false},                         // not hex
		{"017f22e2-79z0-7cc3-98c4-dc0c0c07398f", time.Time{}, false},                         // not hex
		{"", time.Time{}, false},
	} {
		got, ok := Time(tc.id)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("Time(%q) = %v, %v; want %v, %v", tc.id, got, ok, tc.want, tc.ok)
		}
	}
}
