package outboxplugin_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
)

// BenchmarkRetention is ten million events a day, relayed and kept for a day, in compressed time: the
// plain table with its periodic cleanup beside the partitioned table (WithPartitions, daily) with its
// partition drops, one simulated day of each after the other, alternating which goes first.
//
// The scale: a simulated day has OUTBOX_BENCH_DAY_EVENTS events (default 100 000: 1:100 of ten
// million), written in ten bursts over the day's created_at (a backlog of a tenth of a day at most,
// relayed by one worker after each burst, as a relay that keeps up sees it), each burst followed by the
// relay's periodic cleanup at the burst's end time (exclusive: the lock, and on the plain table the
// pauses between chunks), with a retention of one day; the day's last cleanup, at its end, runs while
// four writers insert events through the plugin and the worker goes on relaying.
// OUTBOX_BENCH_PARTITION_HOURS (default 24) sets the partitions' width. The plain table's autovacuum is given the real day it would
// have: a VACUUM of the table after its cleanup, its time reported apart (with the cleanup, it is the
// plain table's cost of retention). OUTBOX_BENCH_DAYS (default 5) sets the days.
//
// Reported per day and layout: the on-disk size (table, indexes and TOAST, all partitions) at the day's
// end before and after the cleanup, over the size of one day of processed events (the partitioned
// table's partition of the day, when it is full: one retention window of live data); the cleanup's
// time (and the plain table's VACUUM); the claim's mean time in the day's relaying; and the writes of
// the four writers during the cleanup: failures, their p99 and longest latency, beside the same
// writers' p99 and longest in the 300 ms just before it.
//
//	go test -run '^$' -bench BenchmarkRetention -benchtime 1x -timeout 60m .
func BenchmarkRetention(b *testing.B) {
	perDay := envInt(b, "OUTBOX_BENCH_DAY_EVENTS", 100000)
	width := time.Duration(envInt(b, "OUTBOX_BENCH_PARTITION_HOURS", 24)) * time.Hour
	days := envInt(b, "OUTBOX_BENCH_DAYS", 5)
	for _, d := range relayDialects() {
		if d.name == "sqlite" {
			continue
		}
		b.Run(d.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				runRetention(b, d, perDay, days, width)
			}
		})
	}
}

func envInt(tb testing.TB, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			tb.Fatalf("%s=%q: want a positive number", name, v)
		}
		return n
	}
	return def
}

// retentionLayout is one side of the comparison: its table, the plugin that writes to it, the worker
// that relays it, and what was measured of it.
type retentionLayout struct {
	name, table string
	db          *gorm.DB // with the plugin writing to table
	worker      *outboxplugin.Worker
	published   atomic.Int64
	writers     atomic.Int64 // events the writers wrote through the plugin
	claimMu     sync.Mutex
	claims      []time.Duration // claim durations of the current day
	rows        []retentionDay
	stop        func()
}

type retentionDay struct {
	before, after  int64         // bytes at the day's end, before and after the cleanup
	dayBytes       int64         // one full day of processed events (the partitioned table's day)
	cleanup        time.Duration // the day's cleanups
	last           time.Duration // the day's last, at its end
	drop           time.Duration // the partitioned table: the drops alone
	vacuum         time.Duration
	claim          time.Duration // mean
	writes, failed int
	p99, longest   time.Duration // during the cleanup
	p99Base, base  time.Duration // in as long a window before it
	deleted        int64
	notes          string
}

func runRetention(b *testing.B, d dialect, perDay, days int, width time.Duration) {
	ctx := context.Background()
	admin := openDB(b, d, &gorm.Config{Logger: logger.Discard})
	resetTables(b, admin, &BenchUser{})
	now := time.Now().UTC()
	day0 := now.Truncate(24 * time.Hour).Add(-time.Duration(days) * 24 * time.Hour) // the last simulated day ends today
	layouts := []*retentionLayout{{name: "plain", table: "retention_plain"}, {name: "partitioned", table: "retention_parts"}}
	for _, l := range layouts {
		plain := admin.Session(&gorm.Session{NewDB: true})
		if err := plain.Migrator().DropTable(l.table); err != nil {
			b.Fatal(err)
		}
		var opts []outboxplugin.MigrateOption
		if l.name == "partitioned" {
			opts = append(opts, outboxplugin.WithPartitions(width), outboxplugin.WithMigrateNow(day0))
		}
		if err := outboxplugin.AutoMigrate(plain.Table(l.table), opts...); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := admin.Session(&gorm.Session{NewDB: true}).Migrator().DropTable(l.table); err != nil {
				b.Error(err)
			}
		})
		l.db = openDB(b, d, &gorm.Config{Logger: logger.Discard})
		if err := l.db.Use(outboxplugin.New(outboxplugin.WithTableName(l.table))); err != nil {
			b.Fatal(err)
		}
		l := l
		obs := &batchObserver{onBatch: func(r outboxplugin.BatchResult) {
			l.published.Add(int64(len(r.Published)))
			l.claimMu.Lock()
			l.claims = append(l.claims, r.ClaimDuration)
			l.claimMu.Unlock()
		}}
		w, err := outboxplugin.NewWorker(l.db, noopPublisher, outboxplugin.WithTable(l.table), outboxplugin.WithLogger(relayErrorLogger),
			outboxplugin.WithoutListen(), outboxplugin.WithObserver(obs), outboxplugin.WithPollInterval(5*time.Millisecond))
		if err != nil {
			b.Fatal(err)
		}
		l.worker = w
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := w.Run(runCtx); err != nil {
				b.Error(err)
			}
		}()
		l.stop = func() { cancel(); <-done }
		b.Cleanup(l.stop)
	}
	// The partitions the writers' events (written now) land in: the partitioned table is made as of
	// day 0, and the writers write today.
	if _, err := outboxplugin.PartitionTurn(ctx, layouts[1].worker, now, 24*time.Hour, false); err != nil {
		b.Fatal(err)
	}

	expected := map[string]int64{}
	for day := 0; day < days; day++ {
		order := []*retentionLayout{layouts[0], layouts[1]}
		if day%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, l := range order {
			start := day0.Add(time.Duration(day) * 24 * time.Hour)
			var row retentionDay
			l.claimMu.Lock()
			l.claims = l.claims[:0]
			l.claimMu.Unlock()
			end := start.Add(24 * time.Hour)
			var deleted int64
			var notes string
			cleanupAt := func(at time.Time) func() error {
				return func() error {
					n, parts, err := outboxplugin.CleanupAt(ctx, l.worker, at, 24*time.Hour, true)
					deleted += n
					if parts != nil {
						notes = fmt.Sprintf("make %s drop %s; dropped %v kept %d busy %v", parts.MakeTook.Round(100*time.Microsecond),
							parts.DropTook.Round(100*time.Microsecond), parts.Dropped, len(parts.Kept), parts.Busy)
						row.drop += parts.DropTook
					}
					return err
				}
			}
			for burst := 0; burst < 10; burst++ {
				from := start.Add(time.Duration(burst) * 24 * time.Hour / 10)
				fillDay(b, admin, d, l.table, perDay/10, from, 24*time.Hour/10)
				expected[l.name] += int64(perDay / 10)
				waitPublished(b, l, expected[l.name]+l.writers.Load())
				if burst == 9 {
					break
				}
				// The periodic cleanup, as a relay with WithCleanup runs it, at the burst's end.
				t0 := time.Now()
				if err := cleanupAt(from.Add(24 * time.Hour / 10))(); err != nil {
					b.Fatal(err)
				}
				row.cleanup += time.Since(t0)
			}
			l.claimMu.Lock()
			var sum time.Duration
			for _, c := range l.claims {
				sum += c
			}
			if len(l.claims) > 0 {
				row.claim = sum / time.Duration(len(l.claims))
			}
			l.claimMu.Unlock()
			row.before = tableBytes(b, admin, d, l.table)
			if l.name == "partitioned" {
				row.dayBytes = partitionBytes(b, admin, d, l.table, start)
			}

			// The day's last cleanup, at its end, beside four writers.
			w := measureWrites(b, l, cleanupAt(end))
			if w.err != nil {
				b.Fatal(w.err)
			}
			row.cleanup += w.took
			row.last, row.writes, row.failed, row.p99, row.longest, row.p99Base, row.base = w.took, w.writes, w.failed, w.p99, w.longest, w.p99Base, w.base
			l.writers.Add(int64(w.writes - w.failed + w.baseWrites))
			row.deleted, row.notes = deleted, notes
			if l.name == "plain" && d.server() == "postgres" {
				t0 := time.Now()
				if err := admin.Exec("VACUUM " + l.table).Error; err != nil {
					b.Fatal(err)
				}
				row.vacuum = time.Since(t0)
			}
			row.after = tableBytes(b, admin, d, l.table)
			l.rows = append(l.rows, row)
		}
	}
	for _, l := range layouts {
		waitPublished(b, l, expected[l.name]+l.writers.Load())
		l.stop()
	}
	// One retention window of live data: a full day's partition, the mean of the days measured.
	var window int64
	for _, r := range layouts[1].rows {
		window += r.dayBytes
	}
	window /= int64(len(layouts[1].rows))
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s, %d events a simulated day (1:%d of 10 M), retention 1 day, partitions %v wide; one day of processed events = %.1f MiB\n",
		d.name, perDay, 10_000_000/perDay, width, float64(window)/(1<<20))
	fmt.Fprintf(&sb, "%-5s %-12s %9s %9s %10s %10s %10s %10s %9s %8s %-34s %s\n", "day", "layout", "size/day", "after", "cleanups", "last", "drops", "vacuum", "claim", "deleted", "writes during last: n fail p99 max", "before: p99 max")
	for day := 0; day < days; day++ {
		for _, l := range layouts {
			r := l.rows[day]
			fmt.Fprintf(&sb, "%-5d %-12s %9.2f %9.2f %10s %10s %10s %10s %9s %8d %5d %4d %9s %9s %12s %9s  %s\n", day+1, l.name,
				float64(r.before)/float64(window), float64(r.after)/float64(window), r.cleanup.Round(time.Microsecond*100),
				r.last.Round(time.Microsecond*100), r.drop.Round(time.Microsecond*100), r.vacuum.Round(time.Millisecond),
				r.claim.Round(time.Microsecond), r.deleted, r.writes, r.failed, r.p99.Round(time.Microsecond*100), r.longest.Round(time.Microsecond*100),
				r.p99Base.Round(time.Microsecond*100), r.base.Round(time.Microsecond*100), r.notes)
		}
	}
	for _, l := range layouts {
		first, last := l.rows[0].claim, l.rows[days-1].claim
		fmt.Fprintf(&sb, "%s: claim on the last day / the first = %.2f\n", l.name, float64(last)/float64(first))
		b.ReportMetric(float64(last)/float64(first), l.name+"-claim-last/first")
		b.ReportMetric(float64(l.rows[days-1].before)/float64(window), l.name+"-size/day")
		b.ReportMetric(float64(l.rows[days-1].cleanup.Microseconds())/1000, l.name+"-cleanups-ms/day")
	}
	fmt.Print(sb.String()) // not b.Log, which cuts a benchmark's log short
}

// fillDay writes n pending events created from from over span, with payloads of about 250 bytes.
func fillDay(b *testing.B, db *gorm.DB, d dialect, table string, n int, from time.Time, span time.Duration) {
	b.Helper()
	step := span / time.Duration(n)
	var q string
	var args []any
	if d.server() == "postgres" {
		q = `INSERT INTO ` + table + ` (message_id, event_type, aggregate_type, aggregate_id, payload, created_at)
			SELECT md5(g::text || clock_timestamp()::text)::uuid::text, 'OrderPlaced', 'Order', g::text,
			       jsonb_build_object('id', g, 'customer', md5(g::text), 'lines', repeat('x', 180)),
			       ?::timestamptz + g * (? * interval '1 microsecond')
			FROM generate_series(0, ? - 1) g`
		args = []any{from, step.Microseconds(), n}
	} else {
		q = `INSERT INTO ` + table + ` (message_id, event_type, aggregate_type, aggregate_id, payload, created_at)
			WITH d(x) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
			              UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9),
			     g(n) AS (SELECT a.x + 10*b.x + 100*c.x + 1000*e.x + 10000*f.x + 100000*h.x FROM d a, d b, d c, d e, d f, d h)
			SELECT uuid(), 'OrderPlaced', 'Order', n, JSON_OBJECT('id', n, 'customer', md5(n), 'lines', REPEAT('x', 180)),
			       ? + INTERVAL (n * ?) MICROSECOND
			FROM g WHERE n < ? ORDER BY n`
		args = []any{from.Format("2006-01-02 15:04:05.999999"), step.Microseconds(), n}
	}
	if err := db.Exec(q, args...).Error; err != nil {
		b.Fatal(err)
	}
}

func waitPublished(b *testing.B, l *retentionLayout, want int64) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for l.published.Load() < want {
		if time.Now().After(deadline) {
			b.Fatalf("%s: %d of %d published", l.name, l.published.Load(), want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// tableBytes is the table's size on disk: heap, indexes and TOAST of every partition (PostgreSQL), or
// data, indexes and the free space InnoDB keeps in its files (MySQL, MariaDB).
func tableBytes(b *testing.B, db *gorm.DB, d dialect, table string) int64 {
	b.Helper()
	var n int64
	var err error
	if d.server() == "postgres" {
		// pg_partition_tree lists nothing for a table that is not partitioned.
		err = db.Raw(`SELECT COALESCE((SELECT SUM(pg_total_relation_size(relid)) FROM pg_partition_tree(?::regclass)), pg_total_relation_size(?::regclass))`, table, table).Scan(&n).Error
	} else {
		if err = db.Exec("ANALYZE TABLE " + table).Error; err == nil {
			err = db.Raw(`SELECT data_length + index_length + data_free FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`, table).Scan(&n).Error
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// partitionBytes is the size of the partitioned table's partitions of the day that starts at day
// (one, or those of a width shorter than a day, named after the day and their hour).
func partitionBytes(b *testing.B, db *gorm.DB, d dialect, table string, day time.Time) int64 {
	b.Helper()
	var n int64
	var err error
	if d.server() == "postgres" {
		err = db.Raw(`SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid`+
			` WHERE i.inhparent = ?::regclass AND c.relname LIKE ?`, table, table+"_p"+day.Format("20060102")+"%").Scan(&n).Error
	} else {
		err = db.Raw(`SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.partitions WHERE table_schema = DATABASE() AND table_name = ? AND partition_name LIKE ?`,
			table, "p"+day.Format("20060102")+"%").Scan(&n).Error
	}
	if err != nil {
		b.Fatal(err)
	}
	return n
}

type writeStats struct {
	err                         error
	took                        time.Duration
	writes, failed, baseWrites  int
	p99, longest, p99Base, base time.Duration
}

// measureWrites runs four writers that each insert a row through the plugin, one after the other,
// first for a baseline window of 300 ms, then while fn runs. A write that spans the switch counts as
// one during fn.
func measureWrites(b *testing.B, l *retentionLayout, fn func() error) writeStats {
	b.Helper()
	var (
		mu       sync.Mutex
		phase    int // 0: baseline, 1: during fn, 2: stop
		lat      [2][]time.Duration
		failures [2]int
		wg       sync.WaitGroup
	)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				p := phase
				mu.Unlock()
				if p == 2 {
					return
				}
				t0 := time.Now()
				err := l.db.Create(&BenchUser{Name: "writer", Email: "w@example.com"}).Error
				took := time.Since(t0)
				mu.Lock()
				idx := p
				if phase != p {
					idx = 1 // it ran across a switch: it ran while fn did
				}
				if err != nil {
					failures[idx]++
				} else {
					lat[idx] = append(lat[idx], took)
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	phase = 1
	mu.Unlock()
	t0 := time.Now()
	err := fn()
	took := time.Since(t0)
	mu.Lock()
	phase = 2
	mu.Unlock()
	wg.Wait()
	pct := func(xs []time.Duration, q float64) time.Duration {
		if len(xs) == 0 {
			return 0
		}
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[min(len(s)-1, int(q*float64(len(s))))]
	}
	return writeStats{err: err, took: took, writes: len(lat[1]) + failures[1], failed: failures[1], baseWrites: len(lat[0]) + failures[0],
		p99: pct(lat[1], 0.99), longest: pct(lat[1], 1), p99Base: pct(lat[0], 0.99), base: pct(lat[0], 1)}
}
