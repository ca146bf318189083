package outboxplugin_test

import (
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// BenchmarkBulkWrites measures what a bulk write costs with the plugin against the same write without
// it, side by side in one run, the two alternating in each round: an update by condition of every row
// of a table of OUTBOX_BENCH_BULK_ROWS rows (default 1 000 000), and a CreateInBatches of as many rows
// (batches of 1000) in one transaction. Each is reported as its time and its heap: the peak of the live
// heap (as of each garbage collection) and of the heap's objects over the write, above what was live
// before it (the application's own rows, for a create, are live before it). The plugin's figure is the
// heap it adds to the plain write's.
//
//	OUTBOX_BENCH_BULK_ROWS=1000000 go test -run '^$' -bench BenchmarkBulkWrites -benchtime 2x -timeout 60m
func BenchmarkBulkWrites(b *testing.B) {
	rows := 1_000_000
	if s := os.Getenv("OUTBOX_BENCH_BULK_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1000 {
			b.Fatalf("OUTBOX_BENCH_BULK_ROWS=%q: a number of rows, at least 1000", s)
		}
		rows = n
	}
	for _, d := range relayDialects() {
		b.Run(d.name, func(b *testing.B) {
			plain := openDB(b, d, nil)
			resetTables(b, plain, &outboxplugin.OutboxEvent{}, &BenchUser{}, &BenchTally{})
			with := openDB(b, d, nil)
			if d.name == "sqlite" {
				// Another connection to the same file.
				var err error
				if with, err = gorm.Open(plain.Dialector, &gorm.Config{Logger: logger.Discard}); err != nil {
					b.Fatal(err)
				}
			}
			if err := with.Use(outboxplugin.New()); err != nil {
				b.Fatal(err)
			}
			fillTallies(b, plain, d, rows)
			variants := []struct {
				name string
				db   *gorm.DB
			}{{"plain", plain}, {"plugin", with}}

			b.Run("update by condition", func(b *testing.B) {
				benchBulk(b, variants, func(db *gorm.DB) error {
					return db.Model(&BenchTally{}).Where("tag = ?", "hot").Update("count", gorm.Expr("count + 1")).Error
				}, func() { clearTable(b, plain, "outbox_events") })
			})
			b.Run("CreateInBatches", func(b *testing.B) {
				var users []BenchUser
				benchBulkPrepared(b, variants, func() {
					users = make([]BenchUser, rows)
					for i := range users {
						users[i] = BenchUser{Name: fmt.Sprint("bulk", i), Email: fmt.Sprintf("bulk%d@example.com", i), Age: i % 90}
					}
				}, func(db *gorm.DB) error {
					return db.CreateInBatches(&users, 1000).Error
				}, func() {
					users = nil
					clearTable(b, plain, "outbox_events")
					clearTable(b, plain, "bench_users")
				})
			})
		})
	}
}

// fillTallies fills bench_tallies with n rows tagged "hot", in one statement of the database's own.
func fillTallies(b *testing.B, db *gorm.DB, d dialect, n int) {
	b.Helper()
	var q string
	switch d.server() {
	case "postgres":
		q = `INSERT INTO bench_tallies (tag, count) SELECT 'hot', 0 FROM generate_series(1, ` + strconv.Itoa(n) + `)`
	case "mysql":
		q = `INSERT INTO bench_tallies (tag, count) SELECT 'hot', 0 FROM seq_1_to_` + strconv.Itoa(n)
	default:
		q = `INSERT INTO bench_tallies (tag, count) WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < ` +
			strconv.Itoa(n) + `) SELECT 'hot', 0 FROM s`
	}
	if err := db.Exec(q).Error; err != nil {
		b.Fatalf("fill bench_tallies: %v", err)
	}
}

// clearTable empties a table between rounds.
func clearTable(b *testing.B, db *gorm.DB, table string) {
	b.Helper()
	q := `TRUNCATE TABLE ` + table
	if db.Dialector.Name() == "sqlite" {
		q = `DELETE FROM ` + table
	}
	if err := db.Session(&gorm.Session{NewDB: true}).Exec(q).Error; err != nil {
		b.Fatalf("clear %s: %v", table, err)
	}
}

// benchBulk runs write on each variant once per round, alternating which goes first, with reset after
// each write, and reports each variant's mean time and peak heap growth and the plugin's ratios.
func benchBulk(b *testing.B, variants []struct {
	name string
	db   *gorm.DB
}, write func(*gorm.DB) error, reset func()) {
	benchBulkPrepared(b, variants, func() {}, write, reset)
}

// benchBulkPrepared is benchBulk with prepare run before each write, outside what is measured.
func benchBulkPrepared(b *testing.B, variants []struct {
	name string
	db   *gorm.DB
}, prepare func(), write func(*gorm.DB) error, reset func()) {
	times := make([]time.Duration, len(variants))
	live := make([]uint64, len(variants))
	objects := make([]uint64, len(variants))
	b.ResetTimer()
	b.StopTimer()
	for round := 0; round < b.N; round++ {
		for k := range variants {
			i := (k + round) % len(variants)
			prepare()
			peak := startHeapPeak()
			start := time.Now()
			if err := write(variants[i].db); err != nil {
				b.Fatalf("%s: %v", variants[i].name, err)
			}
			times[i] += time.Since(start)
			l, o := peak.stop()
			live[i] = max(live[i], l)
			objects[i] = max(objects[i], o)
			reset()
		}
	}
	const mib = 1 << 20
	for i, v := range variants {
		b.ReportMetric(times[i].Seconds()/float64(b.N), v.name+"-s")
		b.ReportMetric(float64(live[i])/mib, v.name+"-live-MiB")
		b.ReportMetric(float64(objects[i])/mib, v.name+"-heap-MiB")
	}
	b.ReportMetric(float64(times[1])/float64(times[0]), "time-ratio")
	b.ReportMetric((float64(live[1])-float64(live[0]))/mib, "plugin-extra-live-MiB")
	b.ReportMetric(0, "ns/op")
}

// heapPeak samples the heap while a write runs: the live heap as of each garbage collection, and the
// bytes of heap objects, above what they were when it started (after a collection).
type heapPeak struct {
	done               chan struct{}
	wg                 sync.WaitGroup
	baseLive, baseObjs uint64
	live, objs         uint64
}

var heapMetrics = []string{"/gc/heap/live:bytes", "/memory/classes/heap/objects:bytes"}

func startHeapPeak() *heapPeak {
	runtime.GC()
	runtime.GC()
	p := &heapPeak{done: make(chan struct{})}
	samples := make([]metrics.Sample, len(heapMetrics))
	for i, name := range heapMetrics {
		samples[i].Name = name
	}
	metrics.Read(samples)
	p.baseLive, p.baseObjs = samples[0].Value.Uint64(), samples[1].Value.Uint64()
	p.live, p.objs = p.baseLive, p.baseObjs
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(samples)
			p.live = max(p.live, samples[0].Value.Uint64())
			p.objs = max(p.objs, samples[1].Value.Uint64())
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// stop ends the sampling and returns the peaks above the start: live heap and heap objects. A last
// collection makes the live heap of the write's end count.
func (p *heapPeak) stop() (live, objs uint64) {
	runtime.GC()
	close(p.done)
	p.wg.Wait()
	return p.live - p.baseLive, p.objs - p.baseObjs
}
