package partition

import (
	"testing"
	"time"
)

func TestFloorAlignsOnTheEpochInUTC(t *testing.T) {
	at := time.Date(2026, 12, 7, 15, 4, 5, 6, time.FixedZone("x", 5*3600+1800))
	for _, c := range []struct {
		every time.Duration
		want  time.Time
	}{
		{24 * time.Hour, time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)},
		{time.Hour, time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)}, // 15:04 at +05:30 is 09:34 UTC
		{6 * time.Hour, time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)},
		{7 * 24 * time.Hour, time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)}, // the epoch was a Thursday
	} {
		if got := Floor(at, c.every); !got.Equal(c.want) || got.Location() != time.UTC {
			t.Errorf("Floor(%v, %v) = %v, want %v", at, c.every, got, c.want)
		}
	}
	before := time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC)
	if got := Floor(before, 24*time.Hour); !got.Equal(time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("before the epoch: %v", got)
	}
}

func TestCheckEvery(t *testing.T) {
	for _, ok := range []time.Duration{time.Hour, 6 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour} {
		if err := CheckEvery(ok); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
	for _, bad := range []time.Duration{0, -time.Hour, 30 * time.Minute, 90 * time.Minute, 24*time.Hour + time.Second} {
		if CheckEvery(bad) == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestParsePGBound(t *testing.T) {
	want := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	for _, s := range []string{"2026-12-07 00:00:00+00", "2026-12-07 05:30:00+05:30", "2026-12-06 19:00:00-05", "2026-12-07 00:00:00.000000+00"} {
		got, err := parsePGBound(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("%q: %v, %v", s, got, err)
		}
	}
	if got, err := parsePGBound(""); err != nil || !got.IsZero() {
		t.Errorf("MINVALUE: %v, %v", got, err)
	}
	if _, err := parsePGBound("tomorrow"); err == nil {
		t.Error("an unreadable bound is an error")
	}
}

func TestNames(t *testing.T) {
	at := time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)
	pg, my := NewTable(Postgres, "audit.events"), NewTable(MySQL, "events")
	for _, c := range []struct{ got, want string }{
		{pg.name(at, 24*time.Hour), "events_p20261207"},
		{pg.name(at, time.Hour), "events_p2026120714"},
		{my.name(at, 24*time.Hour), "p20261207"},
		{my.name(at, 48*time.Hour), "p20261207"},
		{my.name(at, 12*time.Hour), "p2026120714"},
		{pg.defaultName(), "events_default"},
		{my.defaultName(), "pmax"},
		{pg.qualify(pg.name(at, 24*time.Hour)), `"audit"."events_p20261207"`},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
	if NewTable(Postgres, "x23456789012345678901234567890123456789012345678901").Check() != nil {
		t.Error("51 bytes leave room for _p2026120714")
	}
	if NewTable(Postgres, "x234567890123456789012345678901234567890123456789012").Check() == nil {
		t.Error("52 bytes do not")
	}
	if NewTable(MySQL, "x234567890123456789012345678901234567890123456789012").Check() != nil {
		t.Error("MySQL's partitions are named apart from the table")
	}
}

func TestSplitPGBound(t *testing.T) {
	for _, c := range []struct {
		bound, from, to string
		def, ok         bool
	}{
		{"DEFAULT", "", "", true, true},
		{"FOR VALUES FROM ('2026-12-07 00:00:00+00') TO ('2026-12-08 00:00:00+00')", "2026-12-07 00:00:00+00", "2026-12-08 00:00:00+00", false, true},
		{"FOR VALUES FROM (MINVALUE) TO ('2026-12-07 00:00:00+00')", "", "2026-12-07 00:00:00+00", false, true},
		{"FOR VALUES FROM ('2026-12-07 00:00:00+00') TO (MAXVALUE)", "2026-12-07 00:00:00+00", "", false, true},
		{"FOR VALUES IN (1, 2)", "", "", false, false},
		{"", "", "", false, false},
	} {
		from, to, def, ok := splitPGBound(c.bound)
		if from != c.from || to != c.to || def != c.def || ok != c.ok {
			t.Errorf("%q: %q %q %v %v", c.bound, from, to, def, ok)
		}
	}
}
