package outboxotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/gorm-outbox/outboxplugin"
	outboxotel "github.com/gorm-outbox/outboxplugin/otel"
)

// A worker whose observer is the Observer reads the table's health and the Observer records it: the
// table's size on every database, its indexes' size and dead rows on PostgreSQL, the free pages on
// SQLite, no partitions; a figure the database does not have is not recorded at all.
func TestObserverTableHealth(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := openDB(t, d)
			for i := 0; i < 20; i++ {
				require.NoError(t, db.Create(&Order{Total: i}).Error)
			}
			reader := sdkmetric.NewManualReader()
			obs, err := outboxotel.NewObserver(outboxotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
			require.NoError(t, err)
			published := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error { return nil })
			stop := runWorker(t, db, published, outboxplugin.WithObserver(obs), outboxplugin.WithTableHealthInterval(20*time.Millisecond))
			var m metrics
			require.Eventually(t, func() bool {
				var n int64
				require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("processed = ?", true).Count(&n).Error)
				m = collect(t, reader)
				_, ok := gauge[int64](m, "outbox.table.size")
				return n == 20 && ok
			}, 20*time.Second, 20*time.Millisecond, "the table's health is recorded")
			stop()
			m = collect(t, reader)
			size, _ := gauge[int64](m, "outbox.table.size")
			assert.Greater(t, size, int64(0))
			partitions, ok := gauge[int64](m, "outbox.partitions")
			assert.True(t, ok)
			assert.Zero(t, partitions, "not partitioned")
			for _, name := range []string{"outbox.partition.default.rows", "outbox.table.purge_lag"} {
				_, ok := gauge[int64](m, name)
				assert.False(t, ok, "%s is not recorded: the database has no such figure", name)
			}
			_, ok = gauge[float64](m, "outbox.partition.oldest_age")
			assert.False(t, ok, "no partition, no age")
			if d.name == "postgres" {
				index, _ := gauge[int64](m, "outbox.table.index_size")
				assert.Greater(t, index, int64(0))
				// How many the claims and marks leave depends on when pages were pruned: the core's
				// tests count them; here, that PostgreSQL's figure is recorded.
				_, ok = gauge[int64](m, "outbox.table.dead_rows")
				assert.True(t, ok, "PostgreSQL's dead rows")
				_, ok = gauge[int64](m, "outbox.table.free_size")
				assert.False(t, ok, "PostgreSQL has no cheap figure of free space")
			} else {
				_, ok = gauge[int64](m, "outbox.table.free_size")
				assert.True(t, ok, "SQLite's free pages")
				_, ok = gauge[int64](m, "outbox.table.dead_rows")
				assert.False(t, ok, "SQLite keeps no dead rows")
			}
		})
	}
}

// A partitioned table's partitions: their number, the default partition's rows and the oldest
// partition's age.
func TestObserverTablePartitions(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := outboxotel.NewObserver(outboxotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	require.NoError(t, err)
	n := func(v int64) *int64 { return &v }
	d := func(v time.Duration) *time.Duration { return &v }
	vacuumed := time.Now().Add(-2 * time.Hour)
	obs.TableHealth(context.Background(), outboxplugin.TableHealth{
		TotalBytes: n(3 << 20), IndexBytes: n(1 << 20), FreeBytes: n(7), DeadRows: n(40), PurgeLag: n(12), LastVacuum: &vacuumed,
		Partitions: []outboxplugin.PartitionHealth{
			{Name: "p1", Age: d(50 * time.Hour)}, {Name: "p2", Age: d(26 * time.Hour)}, {Name: "p3", Age: d(-22 * time.Hour)},
			{Name: "pmax", Default: true, Rows: n(5)},
		},
	})
	m := collect(t, reader)
	for name, want := range map[string]int64{"outbox.table.size": 3 << 20, "outbox.table.index_size": 1 << 20, "outbox.table.free_size": 7,
		"outbox.table.dead_rows": 40, "outbox.table.purge_lag": 12, "outbox.partitions": 4, "outbox.partition.default.rows": 5} {
		got, ok := gauge[int64](m, name)
		assert.True(t, ok, name)
		assert.Equal(t, want, got, name)
	}
	age, _ := gauge[float64](m, "outbox.partition.oldest_age")
	assert.Equal(t, (50 * time.Hour).Seconds(), age)
	vacuumAge, _ := gauge[float64](m, "outbox.table.vacuum_age")
	assert.GreaterOrEqual(t, vacuumAge, (2 * time.Hour).Seconds())
}
