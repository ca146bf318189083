package outboxplugin

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The alerts are a pure function of the figures: each threshold of docs/operations.md, on either
// side, and no alert from a figure that is unknown.
func TestHealthAlerts(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	n := func(v int64) *int64 { return &v }
	ago := func(d time.Duration) *time.Time { t := at.Add(-d); return &t }
	for _, c := range []struct {
		name string
		h    TableHealth
		want []HealthAlertCode
	}{
		{"nothing known", TableHealth{}, nil},
		{"dead rows below 20 % of live plus 10 000", TableHealth{LiveRows: n(100000), DeadRows: n(30000)}, nil},
		{"dead rows above, never vacuumed", TableHealth{LiveRows: n(100000), DeadRows: n(30001)}, []HealthAlertCode{HealthAlertDeadRows}},
		{"dead rows above, vacuumed within the hour", TableHealth{LiveRows: n(100000), DeadRows: n(40000), LastVacuum: ago(59 * time.Minute)}, nil},
		{"dead rows above, vacuumed over an hour ago", TableHealth{LiveRows: n(100000), DeadRows: n(40000), LastVacuum: ago(61 * time.Minute)},
			[]HealthAlertCode{HealthAlertDeadRows}},
		{"dead rows unknown", TableHealth{LiveRows: n(0)}, nil},
		{"dead rows of one partition", TableHealth{LiveRows: n(100000), DeadRows: n(40000), Partitions: []PartitionHealth{
			{Name: "a", Rows: n(90000), DeadRows: n(1000)}, {Name: "b", Rows: n(10000), DeadRows: n(39000), LastVacuum: ago(2 * time.Hour)}}},
			[]HealthAlertCode{HealthAlertDeadRows}},
		{"free space under what is used", TableHealth{TableBytes: n(200 << 20), IndexBytes: n(100 << 20), FreeBytes: n(250 << 20)}, nil},
		{"free space over what is used", TableHealth{TableBytes: n(200 << 20), IndexBytes: n(100 << 20), FreeBytes: n(301 << 20)},
			[]HealthAlertCode{HealthAlertFreeSpace}},
		{"free space over what is used, but small", TableHealth{TableBytes: n(1 << 20), IndexBytes: n(1 << 20), FreeBytes: n(60 << 20)}, nil},
		{"SQLite: over half the file free", TableHealth{TotalBytes: n(300 << 20), FreeBytes: n(200 << 20)}, []HealthAlertCode{HealthAlertFreeSpace}},
		{"SQLite: under half the file free", TableHealth{TotalBytes: n(300 << 20), FreeBytes: n(100 << 20)}, nil},
		{"history list at the threshold", TableHealth{PurgeLag: n(1000000)}, nil},
		{"history list over it", TableHealth{PurgeLag: n(1000001)}, []HealthAlertCode{HealthAlertPurgeLag}},
		{"empty default partition", TableHealth{Partitions: []PartitionHealth{{Name: "d", Default: true, Rows: n(0)}}}, nil},
		{"default partition with rows", TableHealth{Partitions: []PartitionHealth{{Name: "d", Default: true, Rows: n(3)}}},
			[]HealthAlertCode{HealthAlertDefaultPartition}},
		{"rows in a partition that is not the default", TableHealth{Partitions: []PartitionHealth{{Name: "p", Rows: n(3)}}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []HealthAlertCode
			for _, a := range healthAlerts(c.h, at) {
				got = append(got, a.Code)
				assert.NotEmpty(t, a.Text)
			}
			assert.Equal(t, c.want, got)
		})
	}
}

// The vacuum a partitioned table's dead rows wait on is the oldest among the partitions that hold
// some, unknown when one of those was never vacuumed, and the latest of all when none holds any.
func TestAwaitedVacuum(t *testing.T) {
	t1, t2, t3 := time.Unix(100, 0), time.Unix(200, 0), time.Unix(300, 0)
	assert.Equal(t, &t2, awaitedVacuum([]pgVacuum{{&t1, 0}, {&t3, 5}, {&t2, 1}}))
	assert.Nil(t, awaitedVacuum([]pgVacuum{{&t1, 1}, {nil, 5}}))
	assert.Equal(t, &t3, awaitedVacuum([]pgVacuum{{&t1, 0}, {&t3, 0}, {nil, 0}}))
	assert.Nil(t, awaitedVacuum(nil))
}

// Partition bounds as the catalogs write them.
func TestPartitionBounds(t *testing.T) {
	day := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	from, to := pgRangeBound("FOR VALUES FROM ('2026-12-07 01:00:00+01') TO ('2026-12-08 05:30:00+05:30')")
	assert.Equal(t, day, *from)
	assert.Equal(t, day.Add(24*time.Hour), *to)
	from, to = pgRangeBound("FOR VALUES FROM (MINVALUE) TO ('2026-12-07 00:00:00.5+00')")
	assert.Nil(t, from)
	assert.Equal(t, day.Add(500*time.Millisecond), *to)
	from, to = pgRangeBound("FOR VALUES FROM ('2026-12-07 00:00:00+00', 1) TO ('2026-12-08 00:00:00+00', 5)")
	assert.Equal(t, day, *from, "the first column of the key")
	assert.Equal(t, day.Add(24*time.Hour), *to)
	for _, b := range []string{"DEFAULT", "FOR VALUES IN ('a')", "FOR VALUES WITH (modulus 4, remainder 0)", "FOR VALUES FROM (1) TO (2)"} {
		from, to = pgRangeBound(b)
		assert.Nil(t, from, b)
		assert.Nil(t, to, b)
	}
	assert.Equal(t, day, *parseBoundTime("'2026-12-07 00:00:00'"), "MySQL's DATETIME, as UTC")
	assert.Nil(t, parseBoundTime("MAXVALUE"))
	assert.Nil(t, parseBoundTime("738000"), "RANGE (TO_DAYS(created_at)) is not read")
}
