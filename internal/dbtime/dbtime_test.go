package dbtime

import (
	"testing"
	"time"
)

func TestFromColumn(t *testing.T) {
	want := time.Date(2026, 12, 3, 18, 22, 23, 123456000, time.UTC)
	paris := time.FixedZone("CET", 3600)
	for _, c := range []struct {
		name string
		in   any
		want time.Time
	}{
		{"time in UTC", want, want},
		{"time in another zone", want.In(paris), want},
		{"mattn text with zone", "2026-12-03 19:22:23.123456+01:00", want},
		{"text with T and zone", "2026-12-03T18:22:23.123456+00:00", want},
		{"text without zone is UTC", "2026-12-03 18:22:23.123456", want},
		{"text with T without zone", "2026-12-03T18:22:23.123456", want},
		{"RFC 3339", "2026-12-03T18:22:23.123456Z", want},
		{"bytes", []byte("2026-12-03 18:22:23.123456"), want},
		{"whole seconds", "2026-12-03 18:22:23", want.Truncate(time.Second)},
		{"nanoseconds", "2026-12-03 18:22:23.123456789", want.Add(789)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := FromColumn(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(c.want) || got.Location() != time.UTC {
				t.Errorf("got %v, want %v in UTC", got, c.want)
			}
		})
	}
}

func TestFromColumnRefuses(t *testing.T) {
	for _, in := range []any{nil, 42, int64(1), "yesterday", "2026-13-03 00:00:00", []byte{}} {
		if got, err := FromColumn(in); err == nil {
			t.Errorf("%#v: got %v, want an error", in, got)
		}
	}
}
