package outboxplugin_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// BenchmarkMigrateUnderWrites measures what an upgrade costs the application's writes: a table of
// the first version (the repository's migration file of version 1: no claim index, the pending
// index, no attempt_history, no storage settings, no dead index) holding 1 000 000 events is
// upgraded by AutoMigrate while an application inserts one event after another (first-version); the
// same table, once upgraded, is migrated again, as at the application's next start (up-to-date). The
// latency of each insert that began during the migration is recorded. Reported: the migration's
// time (migrate-s), the inserts it saw (inserts), and their p50, p99 and maximum latency (p50-ms,
// p99-ms, max-ms). Each iteration fills the table anew, which takes a while, so run it once:
//
//	OUTBOX_REQUIRE_DBS=1 go test -run '^$' -bench BenchmarkMigrateUnderWrites -benchtime 1x .
//
// OUTBOX_BENCH_MIGRATE_ROWS sets another number of events. The benchmark uses only AutoMigrate and
// the migration file, so that it runs the same on an earlier version of the package, for a before
// and after (docs/schema.md has both).
func BenchmarkMigrateUnderWrites(b *testing.B) {
	rows := 1_000_000
	if s := os.Getenv("OUTBOX_BENCH_MIGRATE_ROWS"); s != "" {
		var err error
		if rows, err = strconv.Atoi(s); err != nil {
			b.Fatalf("OUTBOX_BENCH_MIGRATE_ROWS=%q: %v", s, err)
		}
	}
	for _, d := range relayDialects() {
		if d.name == "sqlite" {
			continue // one writer at a time: the migration holds every write up, by design
		}
		for _, upToDate := range []bool{false, true} {
			name := d.name + "/first-version"
			if upToDate {
				name = d.name + "/up-to-date"
			}
			b.Run(name, func(b *testing.B) {
				db := openDB(b, d, nil)
				for range b.N {
					b.StopTimer()
					createFirstVersionTable(b, db, d, rows)
					if upToDate {
						// The migration at the next start of the application.
						if err := outboxplugin.AutoMigrate(db); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
					migrateUnderWrites(b, db)
				}
				if err := db.Migrator().DropTable(outboxplugin.DefaultTableName); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// createFirstVersionTable replaces the outbox table with one of the first version holding rows
// events, one in ten of them pending.
func createFirstVersionTable(b *testing.B, db *gorm.DB, d dialect, rows int) {
	b.Helper()
	plain := db.Session(&gorm.Session{NewDB: true})
	if err := plain.Migrator().DropTable(outboxplugin.DefaultTableName); err != nil {
		b.Fatal(err)
	}
	v1, err := os.ReadFile(filepath.Join("migrations", d.server(), "golang-migrate", "000001_create_table.up.sql"))
	if err != nil {
		b.Fatal(err)
	}
	for _, stmt := range sqlStatements(string(v1)) {
		if err := plain.Exec(stmt).Error; err != nil {
			b.Fatalf("%s: %v", stmt, err)
		}
	}
	fill := `INSERT INTO outbox_events (message_id, event_type, payload, created_at, processed)
		SELECT md5(g::text)::uuid::text, 'Bench_old', '{"id": 1}', now() - interval '1 day' + g * interval '1 microsecond', g % 10 <> 0
		FROM generate_series(1, ?) g`
	if d.server() == "mysql" {
		// MariaDB's sequence engine: seq_1_to_N is a table of the numbers 1 to N.
		fill = `INSERT INTO outbox_events (message_id, event_type, payload, created_at, processed)
			SELECT uuid(), 'Bench_old', '{"id": 1}', UTC_TIMESTAMP(6) - INTERVAL 1 DAY + INTERVAL seq MICROSECOND, seq % 10 <> 0
			FROM seq_1_to_` + strconv.Itoa(rows)
	}
	if d.server() == "mysql" {
		err = plain.Exec(fill).Error
	} else {
		err = plain.Exec(fill, rows).Error
	}
	if err != nil {
		b.Fatal(err)
	}
	if d.server() == "postgres" {
		err = plain.Exec(`VACUUM ANALYZE outbox_events`).Error
	} else {
		err = plain.Exec(`ANALYZE TABLE outbox_events`).Error
	}
	if err != nil {
		b.Fatal(err)
	}
}

// migrateUnderWrites runs AutoMigrate while an application inserts events one after another, and
// reports the latencies of the inserts that overlapped the migration.
func migrateUnderWrites(b *testing.B, db *gorm.DB) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type insert struct {
		at   time.Time
		took time.Duration
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		inserts []insert
		started = make(chan struct{})
	)
	app := db.Session(&gorm.Session{NewDB: true})
	wg.Add(1)
	go func() {
		defer wg.Done()
		first := true
		for ctx.Err() == nil {
			t0 := time.Now()
			// The columns of the first version: the insert works before, during and after.
			err := app.Exec(`INSERT INTO outbox_events (message_id, event_type, payload, created_at) VALUES (?, 'Bench_new', '{"id": 2}', ?)`,
				randomMessageID(), time.Now().UTC()).Error
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			inserts = append(inserts, insert{t0, time.Since(t0)})
			mu.Unlock()
			if first {
				close(started)
				first = false
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	<-started
	t0 := time.Now()
	err := outboxplugin.AutoMigrate(db)
	took := time.Since(t0)
	// An insert the migration held up ends after it: wait for it, and keep every insert that began
	// while the migration ran.
	cancel()
	wg.Wait()
	if err != nil {
		b.Fatal(err)
	}
	var during []time.Duration
	for _, in := range inserts {
		if !in.at.Before(t0) && in.at.Before(t0.Add(took)) {
			during = append(during, in.took)
		}
	}
	slices.Sort(during)
	if len(during) == 0 {
		during = []time.Duration{0}
	}
	pct := func(p float64) float64 {
		return float64(during[int(p*float64(len(during)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(took.Seconds(), "migrate-s")
	b.ReportMetric(float64(len(during)), "inserts")
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(1), "max-ms")
}

// randomMessageID is a random id in the shape of a UUID.
func randomMessageID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
