package inbox_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/inbox"
)

// BenchmarkConvertInexactTable measures what AutoMigrate's conversion of a MySQL/MariaDB inbox table
// made before ids were compared exactly (by GORM's migrator from Record: varchar in the database's
// collation) costs the deliveries that go on meanwhile: the table holds 1 000 000 records
// (OUTBOX_BENCH_INBOX_RECORDS sets another number), and one delivery of a new message starts every
// 2 ms through another pool (of 8 connections). Reported: the conversion's time (migrate-s), the deliveries that began
// during it (deliveries), and their p50, p99 and maximum latency (p50-ms, p99-ms, max-ms). Each
// iteration fills the table anew, so run it once:
//
//	OUTBOX_REQUIRE_DBS=1 go test -run '^$' -bench BenchmarkConvertInexactTable -benchtime 1x ./inbox
func BenchmarkConvertInexactTable(b *testing.B) {
	records := 1_000_000
	if s := os.Getenv("OUTBOX_BENCH_INBOX_RECORDS"); s != "" {
		var err error
		if records, err = strconv.Atoi(s); err != nil {
			b.Fatalf("OUTBOX_BENCH_INBOX_RECORDS=%q: %v", s, err)
		}
	}
	tg := targets[2] // MariaDB; the conversion is MySQL's only
	dsn := tg.newDatabase(b)
	db, deliveries := tg.openDB(b, dsn), tg.openDB(b, dsn)
	pool, err := deliveries.DB()
	if err != nil {
		b.Fatal(err)
	}
	pool.SetMaxOpenConns(8) // a consumer's pool: the deliveries that wait hold no more connections than that
	if err := deliveries.AutoMigrate(&Invoice{}); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		b.StopTimer()
		createInexactTable(b, db, records)
		in, err := inbox.New(db)
		if err != nil {
			b.Fatal(err)
		}
		consumer, err := inbox.New(deliveries)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		ctx, stop := context.WithCancel(context.Background())
		var (
			mu        sync.Mutex
			latencies []time.Duration
			wg        sync.WaitGroup
		)
		wg.Go(func() {
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ctx.Err() == nil; i++ {
				id := fmt.Sprint("new-", i)
				wg.Go(func() {
					start := time.Now()
					if _, err := consumer.Handle(context.Background(), "billing", id, createInvoice(id)); err != nil {
						b.Error(err)
					}
					mu.Lock()
					latencies = append(latencies, time.Since(start))
					mu.Unlock()
				})
				select {
				case <-ctx.Done():
				case <-tick.C:
				}
			}
		})
		start := time.Now()
		err = in.AutoMigrate(context.Background())
		took := time.Since(start)
		stop()
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		slices.Sort(latencies)
		at := func(q float64) float64 {
			if len(latencies) == 0 {
				return 0
			}
			return float64(latencies[int(q*float64(len(latencies)-1))]) / float64(time.Millisecond)
		}
		b.ReportMetric(took.Seconds(), "migrate-s")
		b.ReportMetric(float64(len(latencies)), "deliveries")
		b.ReportMetric(at(0.5), "p50-ms")
		b.ReportMetric(at(0.99), "p99-ms")
		b.ReportMetric(at(1), "max-ms")
		b.StartTimer()
	}
}

// createInexactTable replaces the inbox table with one as the inbox made it before (GORM's migrator
// from Record) holding records records.
func createInexactTable(b *testing.B, db *gorm.DB, records int) {
	b.Helper()
	if err := db.Migrator().DropTable(inbox.DefaultTableName); err != nil {
		b.Fatal(err)
	}
	if err := db.Table(inbox.DefaultTableName).AutoMigrate(&inbox.Record{}); err != nil {
		b.Fatal(err)
	}
	// Digits crossed with themselves: a million rows without a sequence table, on MySQL 8 and MariaDB.
	digits := `(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)`
	n, from := "0", ""
	for i, scale := 0, 1; scale < records; i, scale = i+1, scale*10 {
		n += fmt.Sprintf(" + %d*d%d.d", scale, i)
		from += fmt.Sprintf(", %s d%d", digits, i)
	}
	if err := db.Exec(`INSERT INTO `+inbox.DefaultTableName+` (consumer, message_id, handled_at)
		SELECT 'billing', CONCAT('0193a1b2-c3d4-7e5f-8a9b-', LPAD(n, 12, '0')), NOW(6)
		FROM (SELECT `+n+` AS n FROM `+from[2:]+`) s WHERE n < ?`, records).Error; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkHandle measures one delivery through Handle on each database: of a new message (the
// handler writes one row) and of a message handled before (a redelivery, skipped).
//
//	OUTBOX_REQUIRE_DBS=1 go test -run '^$' -bench BenchmarkHandle -benchtime 2000x ./inbox
func BenchmarkHandle(b *testing.B) {
	for _, tg := range targets {
		if tg.name == "mysql_noreturning" {
			continue // the same statements as mysql
		}
		b.Run(tg.name, func(b *testing.B) {
			db := tg.openDB(b, tg.newDatabase(b))
			in, err := inbox.New(db)
			if err != nil {
				b.Fatal(err)
			}
			if err := in.AutoMigrate(context.Background()); err != nil {
				b.Fatal(err)
			}
			if err := db.AutoMigrate(&Invoice{}); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.Run("new", func(b *testing.B) {
				run := randomHex() // the benchmark function runs more than once
				for i := range b.N {
					id := fmt.Sprint("new-", run, "-", i)
					if ran, err := in.Handle(ctx, "billing", id, createInvoice(id)); err != nil || !ran {
						b.Fatal(ran, err)
					}
				}
			})
			b.Run("redelivery", func(b *testing.B) {
				if _, err := in.Handle(ctx, "billing", "handled", createInvoice("handled")); err != nil {
					b.Fatal(err)
				}
				for range b.N {
					if ran, err := in.Handle(ctx, "billing", "handled", createInvoice("handled")); err != nil || ran {
						b.Fatal(ran, err)
					}
				}
			})
		})
	}
}
