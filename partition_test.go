package outboxplugin_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/internal/partition"
)

// The partitioned outbox (WithPartitions) on PostgreSQL and MariaDB: made by AutoMigrate, kept by the
// relay's maintenance, retired by dropping whole partitions.

// partitionDBs runs fn on the servers that partition the outbox.
func partitionDBs(t *testing.T, fn func(t *testing.T, d dialect)) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.name == "sqlite" {
			t.Skip("SQLite has no partitions")
		}
		fn(t, d)
	})
}

// setupPartitioned makes the outbox table partitioned by day, with its first partitions those of
// now's day and the next two.
func setupPartitioned(t *testing.T, d dialect, now time.Time) *gorm.DB {
	t.Helper()
	db := setupGormTable(t, d, nil)
	plain := db.Session(&gorm.Session{NewDB: true})
	require.NoError(t, plain.Migrator().DropTable(&outboxplugin.OutboxEvent{}))
	require.NoError(t, outboxplugin.AutoMigrate(plain, outboxplugin.WithPartitions(0), outboxplugin.WithMigrateNow(now)))
	t.Cleanup(func() {
		require.NoError(t, plain.Migrator().DropTable(&outboxplugin.OutboxEvent{}), "drop the partitioned table")
	})
	return db
}

// partitionNames lists the outbox table's partitions, as the catalog has them, sorted.
func partitionNames(t *testing.T, db *gorm.DB, d dialect) []string {
	t.Helper()
	var names []string
	q := db.Session(&gorm.Session{NewDB: true})
	if d.server() == "postgres" {
		require.NoError(t, q.Raw(`SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox_events'::regclass`).Scan(&names).Error)
	} else {
		require.NoError(t, q.Raw(`SELECT partition_name FROM information_schema.partitions WHERE table_schema = DATABASE() AND table_name = 'outbox_events' AND partition_name IS NOT NULL`).Scan(&names).Error)
	}
	sort.Strings(names)
	return names
}

// dayName is the partition of the day that holds at.
func dayName(d dialect, at time.Time) string {
	day := at.UTC().Format("20060102")
	if d.server() == "postgres" {
		return "outbox_events_p" + day
	}
	return "p" + day
}

func defaultName(d dialect) string {
	if d.server() == "postgres" {
		return "outbox_events_default"
	}
	return "pmax"
}

// putEvent writes an outbox row as of created_at, in the state given.
func putEvent(t *testing.T, db *gorm.DB, eventType string, createdAt time.Time, state string) outboxplugin.OutboxEvent {
	t.Helper()
	e := outboxplugin.OutboxEvent{MessageID: fmt.Sprintf("%s-%d", eventType, createdAt.UnixNano()), EventType: eventType,
		Payload: []byte(`{}`), CreatedAt: createdAt}
	switch state {
	case "processed":
		e.Processed = true
		now := time.Now().UTC()
		e.ProcessedAt = &now
	case "dead":
		now := time.Now().UTC()
		e.DeadAt = &now
		e.Attempts = 5
	}
	require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Create(&e).Error)
	return e
}

// A day at a time: AutoMigrate makes the first days, the maintenance the next ones, and the drop
// takes only days whose every event is finished. A day that holds a pending or a dead event is kept
// past the retention until it is published or discarded. What no partition covers lands in the
// default partition, and is reported.
func TestPartitionedOutboxLifecycle(t *testing.T) {
	partitionDBs(t, func(t *testing.T, d dialect) {
		ctx := context.Background()
		real := time.Now().UTC()
		day0 := real.Add(-10 * 24 * time.Hour).Truncate(24 * time.Hour)
		db := setupPartitioned(t, d, day0.Add(12*time.Hour))
		day := func(i int) time.Time { return day0.Add(time.Duration(i) * 24 * time.Hour) }
		assert.Equal(t, []string{dayName(d, day(0)), dayName(d, day(1)), dayName(d, day(2)), defaultName(d)}, sortedWithDefaultLast(partitionNames(t, db, d), d))

		// AutoMigrate on the made table runs nothing, with the option or without it.
		plain := db.Session(&gorm.Session{NewDB: true})
		stmts, err := outboxplugin.PlanMigration(plain, outboxplugin.WithPartitions(0), outboxplugin.WithMigrateNow(day0.Add(12*time.Hour)))
		require.NoError(t, err)
		assert.Empty(t, stmts)
		stmts, err = outboxplugin.PlanMigration(plain)
		require.NoError(t, err)
		assert.Empty(t, stmts)
		warnings, err := newTestAdmin(t, db).CheckTable(ctx)
		require.NoError(t, err)
		assert.Empty(t, warnings, "a partitioned table lacks nothing")

		for i := 0; i < 3; i++ {
			for j := 0; j < 3; j++ {
				putEvent(t, db, "done", day(i).Add(time.Duration(j+1)*time.Hour), "processed")
			}
		}
		pending := putEvent(t, db, "pending", day(0).Add(5*time.Hour), "pending")
		dead := putEvent(t, db, "dead", day(1).Add(5*time.Hour), "dead")
		stray := putEvent(t, db, "stray", real, "pending") // today: no partition covers it yet

		stats, err := newTestAdmin(t, db).Stats(ctx)
		require.NoError(t, err)
		assert.EqualValues(t, 2, stats.Pending, "across the partitions")
		assert.EqualValues(t, 1, stats.Dead)
		assert.EqualValues(t, 9, stats.Processed)

		w := newWorker(t, db, newRecorder())
		at := day(3).Add(time.Hour)
		res, err := outboxplugin.PartitionTurn(ctx, w, at, 24*time.Hour, true)
		require.NoError(t, err)
		assert.Equal(t, []string{dayName(d, day(3)), dayName(d, day(4)), dayName(d, day(5))}, res.Created)
		assert.Empty(t, res.Dropped, "day 0 holds a pending event, day 1 a dead one; day 2 is within the retention")
		require.Len(t, res.Kept, 2)
		assert.Equal(t, dayName(d, day(0)), res.Kept[0].Name)
		assert.EqualValues(t, 1, res.Kept[0].Pending)
		assert.Equal(t, dayName(d, day(1)), res.Kept[1].Name)
		assert.EqualValues(t, 1, res.Kept[1].Dead)
		assert.EqualValues(t, 1, res.DefaultRows, "today's event is in the default partition")

		// The relay publishes across the partitions: the pending event of day 0 and today's.
		rec := newRecorder()
		w = newWorker(t, db, rec)
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		assert.ElementsMatch(t, []string{pending.MessageID, stray.MessageID}, messageIDs(rec.published()))

		res, err = outboxplugin.PartitionTurn(ctx, w, at, 24*time.Hour, true)
		require.NoError(t, err)
		assert.Equal(t, []string{dayName(d, day(0))}, res.Dropped, "day 0's events are all processed now")
		require.Len(t, res.Kept, 1, "day 1's dead event keeps it")

		discarded, err := newTestAdmin(t, db).Discard(ctx, dead.MessageID)
		require.NoError(t, err)
		require.EqualValues(t, 1, discarded)
		res, err = outboxplugin.PartitionTurn(ctx, w, at, 24*time.Hour, true)
		require.NoError(t, err)
		assert.Equal(t, []string{dayName(d, day(1))}, res.Dropped)
		assert.Empty(t, res.Kept)
		assert.EqualValues(t, 3, countType(t, db, "done"), "day 2's events are kept: within the retention")

		// Today: on PostgreSQL the default partition holds a row of today's range, so today's partition
		// is not made (its rows would have to move); tomorrow's are. On MariaDB the MAXVALUE partition is
		// split, its row moved into today's.
		res, err = outboxplugin.PartitionTurn(ctx, w, real, 24*time.Hour, true)
		require.NoError(t, err)
		if d.server() == "postgres" {
			assert.Equal(t, []string{dayName(d, real)}, res.Skipped)
			assert.Equal(t, []string{dayName(d, real.Add(24*time.Hour)), dayName(d, real.Add(48*time.Hour))}, res.Created)
			assert.EqualValues(t, 1, res.DefaultRows)
		} else {
			assert.Contains(t, res.Created, dayName(d, real))
			assert.Zero(t, res.DefaultRows)
		}
		assert.Contains(t, res.Dropped, dayName(d, day(2)), "past the retention now")
		assert.EqualValues(t, 1, countType(t, db, "stray"))
	})
}

func sortedWithDefaultLast(names []string, d dialect) []string {
	var out []string
	for _, n := range names {
		if n != defaultName(d) {
			out = append(out, n)
		}
	}
	return append(out, defaultName(d))
}

func messageIDs(msgs []outboxplugin.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// On PostgreSQL a ctid addresses a row within its partition: each partition's first row is (0,1). A
// claim must take the rows it picked, not every row at their places: here the first row of day 0 is
// processed and the first of day 1 pending, at the same ctid.
func TestPartitionedClaimTakesOnlyItsRows(t *testing.T) {
	partitionDBs(t, func(t *testing.T, d dialect) {
		ctx := context.Background()
		now := time.Now().UTC()
		db := setupPartitioned(t, d, now.Add(-24*time.Hour))
		yesterday := now.Add(-24 * time.Hour)
		done := putEvent(t, db, "done", yesterday, "processed")
		want := putEvent(t, db, "fresh", now, "pending")
		if d.server() == "postgres" {
			var ctids []string
			require.NoError(t, db.Raw(`SELECT ctid::text FROM outbox_events ORDER BY id`).Scan(&ctids).Error)
			require.Equal(t, []string{"(0,1)", "(0,1)"}, ctids, "the two rows share their place, each in its partition")
		}
		rec := newRecorder()
		w := newWorker(t, db, rec)
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.Equal(t, []string{want.MessageID}, messageIDs(rec.published()))
		after := outboxRow(t, db, done.MessageID)
		assert.Equal(t, done.Attempts, after.Attempts, "the processed row was not claimed")
		assert.Nil(t, after.LockedUntil)
	})
}

// Relays and the maintenance together: while two relays publish and writers write through the
// plugin, one turn after another makes days ahead and drops days past the retention. No write fails,
// and every event is published exactly once (the drops take only finished days).
func TestPartitionMaintenanceBesideWritersAndRelays(t *testing.T) {
	partitionDBs(t, func(t *testing.T, d dialect) {
		ctx := context.Background()
		now := time.Now().UTC()
		start := now.Add(-40 * 24 * time.Hour)
		db := setupPartitioned(t, d, start)
		rec := newRecorder()
		// Today's partition and the next two, for the writers; the days from start on are the
		// maintenance's to make and drop.
		maint := newWorker(t, db, newRecorder())
		_, err := outboxplugin.PartitionTurn(ctx, maint, now, 24*time.Hour, false)
		require.NoError(t, err)
		stop := runWorkers(t, 2, func() *outboxplugin.Worker {
			return newWorker(t, db, rec, outboxplugin.WithPollInterval(5*time.Millisecond), outboxplugin.WithoutListen())
		})
		defer stop()

		var written, failed atomic.Int64
		var firstErr atomic.Value
		writers, done := sync.WaitGroup{}, make(chan struct{})
		for i := 0; i < 4; i++ {
			writers.Add(1)
			go func() {
				defer writers.Done()
				for {
					select {
					case <-done:
						return
					default:
					}
					if err := db.Create(&User{Name: "w"}).Error; err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
						continue
					}
					written.Add(1)
				}
			}()
		}
		var created, dropped int
		var cutoff time.Time
		for i := 0; i < 30; i++ {
			at := start.Add(time.Duration(i) * 24 * time.Hour)
			putEvent(t, db, "old", at.Add(time.Hour), "processed")
			res, err := outboxplugin.PartitionTurn(ctx, maint, at, 48*time.Hour, true)
			require.NoError(t, err)
			created += len(res.Created)
			dropped += len(res.Dropped)
			assert.Empty(t, res.Kept)
			assert.Empty(t, res.Busy)
			cutoff = at.Add(-48 * time.Hour)
		}
		close(done)
		writers.Wait()
		assert.Zero(t, failed.Load(), "no write fails during the maintenance: %v", firstErr.Load())
		require.Eventually(t, func() bool { return int64(rec.distinct()) == written.Load() }, 60*time.Second, 20*time.Millisecond)
		stop()
		assert.Equal(t, int(written.Load()), rec.distinct())
		assert.Equal(t, rec.distinct(), len(rec.published()), "each event published once")
		assert.Positive(t, written.Load())
		if d.server() == "postgres" {
			assert.Equal(t, 29, created, "a day a turn, after the three AutoMigrate made")
		}
		// Every day that ended before the last turn's cutoff is gone, and only those: a day a turn.
		gone := int(cutoff.Sub(start.Truncate(24*time.Hour)) / (24 * time.Hour)) // whole days before the cutoff
		assert.Equal(t, gone, dropped)
		assert.Greater(t, dropped, 20)
		for _, name := range partitionNames(t, db, d) {
			if name == defaultName(d) {
				continue
			}
			stamp := name[strings.LastIndex(name, "p")+1:]
			first, err := time.Parse("20060102", stamp)
			require.NoError(t, err, name)
			assert.False(t, first.Add(24*time.Hour).Before(cutoff) || first.Add(24*time.Hour).Equal(cutoff), "%s ended before the cutoff %v", name, cutoff)
		}
	})
}

func newTestAdmin(t *testing.T, db *gorm.DB) *outboxplugin.Admin {
	t.Helper()
	a, err := outboxplugin.NewAdmin(db)
	require.NoError(t, err)
	return a
}

// The statements of a partitioned table, as SchemaSQL prints them for a migration of one's own.
func TestSchemaSQLPartitioned(t *testing.T) {
	now := time.Date(2026, 12, 7, 15, 4, 5, 0, time.UTC)
	pg, err := outboxplugin.SchemaSQL("postgres", "", outboxplugin.WithPartitions(0), outboxplugin.WithMigrateNow(now))
	require.NoError(t, err)
	all := strings.Join(pg, ";\n")
	assert.Contains(t, pg[0], "PRIMARY KEY (id, created_at)")
	assert.True(t, strings.HasSuffix(pg[0], ") PARTITION BY RANGE (created_at)"), pg[0])
	assert.NotContains(t, all, `ALTER TABLE "outbox_events" SET`, "a partitioned table keeps no storage settings")
	storage := " WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000)"
	assert.Contains(t, pg, `CREATE TABLE IF NOT EXISTS "outbox_events_default" PARTITION OF "outbox_events" DEFAULT`+storage)
	for _, day := range [][2]string{{"07", "08"}, {"08", "09"}, {"09", "10"}} {
		day, next := day[0], day[1]
		assert.Contains(t, pg, `CREATE TABLE IF NOT EXISTS "outbox_events_p202612`+day+`" PARTITION OF "outbox_events" FOR VALUES FROM ('2026-12-`+day+
			` 00:00:00+00') TO ('2026-12-`+next+` 00:00:00+00')`+storage)
	}
	claimAt, defaultAt := -1, -1
	for i, s := range pg {
		if strings.Contains(s, "idx_outbox_events_claim") {
			claimAt = i
		}
		if strings.Contains(s, "outbox_events_default") {
			defaultAt = i
		}
	}
	assert.Less(t, claimAt, defaultAt, "the indexes first: each partition gets them as it is made")

	my, err := outboxplugin.SchemaSQL("mysql", "audit.events", outboxplugin.WithPartitions(6*time.Hour), outboxplugin.WithMigrateNow(now))
	require.NoError(t, err)
	require.Len(t, my, 1)
	assert.Contains(t, my[0], "PRIMARY KEY (id, created_at)")
	assert.Contains(t, my[0], "PARTITION BY RANGE COLUMNS(created_at) (\n"+
		"\tPARTITION `p2026120712` VALUES LESS THAN ('2026-12-07 18:00:00'),\n"+
		"\tPARTITION `p2026120718` VALUES LESS THAN ('2026-12-08 00:00:00'),\n"+
		"\tPARTITION `p2026120800` VALUES LESS THAN ('2026-12-08 06:00:00'),\n"+
		"\tPARTITION `pmax` VALUES LESS THAN (MAXVALUE)\n)")

	for _, bad := range []struct {
		dialect, table string
		every          time.Duration
		want           error
	}{
		{"sqlite", "", 0, outboxplugin.ErrInvalidOption},
		{"postgres", "", 90 * time.Minute, outboxplugin.ErrInvalidOption},
		{"mysql", "", -time.Hour, outboxplugin.ErrInvalidOption},
		{"postgres", strings.Repeat("x", 55), 0, outboxplugin.ErrInvalidTableName},
	} {
		_, err := outboxplugin.SchemaSQL(bad.dialect, bad.table, outboxplugin.WithPartitions(bad.every))
		assert.ErrorIs(t, err, bad.want, "%+v", bad)
	}
}

// AutoMigrate with WithPartitions on a table that is not partitioned refuses, and changes nothing;
// on a partitioned table it makes the partitions it lacks at the time, and nothing else.
func TestAutoMigratePartitionsExistingTables(t *testing.T) {
	partitionDBs(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		plain := db.Session(&gorm.Session{NewDB: true})
		err := outboxplugin.AutoMigrate(plain, outboxplugin.WithPartitions(0))
		require.ErrorIs(t, err, outboxplugin.ErrNotPartitioned)
		assert.Empty(t, partitionNames(t, db, d), "nothing changed")

		now := time.Now().UTC()
		db = setupPartitioned(t, d, now.Add(-5*24*time.Hour))
		plain = db.Session(&gorm.Session{NewDB: true})
		stmts, err := outboxplugin.PlanMigration(plain, outboxplugin.WithPartitions(0), outboxplugin.WithMigrateNow(now))
		require.NoError(t, err)
		require.NotEmpty(t, stmts)
		require.NoError(t, outboxplugin.AutoMigrate(plain, outboxplugin.WithPartitions(0), outboxplugin.WithMigrateNow(now)))
		names := partitionNames(t, db, d)
		for i := 0; i <= 2; i++ {
			assert.Contains(t, names, dayName(d, now.Add(time.Duration(i)*24*time.Hour)))
		}
		stmts, err = outboxplugin.PlanMigration(plain, outboxplugin.WithPartitions(0), outboxplugin.WithMigrateNow(now))
		require.NoError(t, err)
		assert.Empty(t, stmts, "made once")
	})
}

// A relay without a periodic cleanup still makes a partitioned table's next partitions: writes must
// not land in the default partition because nobody asked for a cleanup.
func TestRelayWithoutCleanupMakesPartitions(t *testing.T) {
	partitionDBs(t, func(t *testing.T, d dialect) {
		now := time.Now().UTC()
		db := setupPartitioned(t, d, now.Add(-5*24*time.Hour))
		require.NotContains(t, partitionNames(t, db, d), dayName(d, now))
		stop := runWorkers(t, 1, func() *outboxplugin.Worker {
			return newWorker(t, db, newRecorder(), outboxplugin.WithPollInterval(10*time.Millisecond), outboxplugin.WithoutListen())
		})
		defer stop()
		require.Eventually(t, func() bool {
			names := partitionNames(t, db, d)
			for i := 0; i <= 2; i++ {
				if !contains(names, dayName(d, now.Add(time.Duration(i)*24*time.Hour))) {
					return false
				}
			}
			return true
		}, 30*time.Second, 50*time.Millisecond, "today's partition and the next two")
		require.NoError(t, db.Create(&User{Name: "today"}).Error)
		var inDefault int64
		require.NoError(t, db.Raw(`SELECT COUNT(*) FROM `+partitionRef(d, defaultName(d))).Scan(&inDefault).Error)
		assert.Zero(t, inDefault)
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// partitionRef names one partition's rows in a FROM clause.
func partitionRef(d dialect, name string) string {
	if d.server() == "postgres" {
		return "ONLY " + name
	}
	return "outbox_events PARTITION (" + name + ")"
}

// docBlock returns the SQL block of docs/operations.md that starts with the comment line marker, with
// the example's dates moved to the cutover given, one statement per element (comments left out).
func docBlock(t *testing.T, marker string, cutover time.Time) []string {
	t.Helper()
	b, err := os.ReadFile("docs/operations.md")
	require.NoError(t, err)
	doc := string(b)
	i := strings.Index(doc, "```sql\n-- "+marker+"\n")
	require.GreaterOrEqual(t, i, 0, "docs/operations.md has no block %q", marker)
	block := doc[i+len("```sql\n") : i+strings.Index(doc[i:], "\n```")]
	var pairs []string
	for k := 0; k < 4; k++ {
		example := time.Date(2026, 12, 9+k, 0, 0, 0, 0, time.UTC)
		ours := cutover.Add(time.Duration(k) * 24 * time.Hour)
		pairs = append(pairs, example.Format("2006-01-02"), ours.Format("2006-01-02"), example.Format("20060102"), ours.Format("20060102"))
	}
	block = strings.NewReplacer(pairs...).Replace(block)
	var out []string
	for _, stmt := range strings.Split(block, ";\n") {
		var lines []string
		for _, l := range strings.Split(stmt, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(l), "--") {
				lines = append(lines, l)
			}
		}
		if s := strings.TrimSpace(strings.TrimSuffix(strings.Join(lines, "\n"), ";")); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// The conversion of an existing table that docs/operations.md gives, run as written: the events of
// every state survive it, the relay publishes across it, the id sequence goes on, and the old table,
// now the legacy partition, is kept while it holds a dead event and dropped once it holds none.
func TestConvertToPartitions(t *testing.T) {
	partitionDBs(t, func(t *testing.T, d dialect) {
		ctx := context.Background()
		now := time.Now().UTC()
		cutover := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
		db := setup(t, d, nil)
		plain := db.Session(&gorm.Session{NewDB: true})
		putEvent(t, db, "done", now.Add(-time.Hour), "processed")
		dead := putEvent(t, db, "dead", now.Add(-2*time.Hour), "dead")
		pending := putEvent(t, db, "pending", now.Add(-3*time.Hour), "pending")

		sqlDB, err := plain.DB()
		require.NoError(t, err)
		conn, err := sqlDB.Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		var steps []string
		if d.server() == "postgres" {
			steps = append(docBlock(t, "convert postgres: step 1", cutover), docBlock(t, "convert postgres: step 2", cutover)...)
		} else {
			steps = docBlock(t, "convert mysql", cutover)
		}
		for _, s := range steps {
			_, err := conn.ExecContext(ctx, s)
			require.NoError(t, err, s)
		}
		t.Cleanup(func() {
			_, err := sqlDB.ExecContext(context.Background(), "DROP TABLE IF EXISTS outbox_events_legacy")
			require.NoError(t, err)
		})

		stmts, err := outboxplugin.PlanMigration(plain, outboxplugin.WithPartitions(0))
		require.NoError(t, err)
		assert.Empty(t, stmts, "the converted table is as AutoMigrate would make it")
		require.NoError(t, outboxplugin.AutoMigrate(plain, outboxplugin.WithPartitions(0)))
		warnings, err := newTestAdmin(t, db).CheckTable(ctx)
		require.NoError(t, err)
		assert.Empty(t, warnings)

		fresh := putEvent(t, db, "fresh", now, "pending")
		assert.Greater(t, fresh.ID, pending.ID, "the id sequence goes on")
		rec := newRecorder()
		w := newWorker(t, db, rec)
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		assert.ElementsMatch(t, []string{pending.MessageID, fresh.MessageID}, messageIDs(rec.published()))

		legacy := "outbox_events_legacy"
		if d.server() == "mysql" {
			legacy = "plegacy"
		}
		at := cutover.Add(48*time.Hour + time.Hour)
		res, err := outboxplugin.PartitionTurn(ctx, w, at, 24*time.Hour, true)
		require.NoError(t, err)
		require.Len(t, res.Kept, 1, "the legacy partition holds a dead event")
		assert.Equal(t, legacy, res.Kept[0].Name)
		_, err = newTestAdmin(t, db).Discard(ctx, dead.MessageID)
		require.NoError(t, err)
		res, err = outboxplugin.PartitionTurn(ctx, w, at, 24*time.Hour, true)
		require.NoError(t, err)
		assert.Contains(t, res.Dropped, legacy)
		assert.NotContains(t, partitionNames(t, db, d), legacy)

		later := putEvent(t, db, "later", at, "pending")
		assert.Greater(t, later.ID, fresh.ID, "the sequence outlived the legacy partition")
	})
}

// Stats counts the processed rows of a partitioned table exactly up to ExactProcessedLimit and, past
// it, from the estimates of its partitions' processed indexes.
func TestStatsEstimatesProcessedAcrossPartitions(t *testing.T) {
	d := dialectNamed(t, "postgres")
	now := time.Now().UTC()
	db := setupPartitioned(t, d, now.Add(-24*time.Hour))
	n := outboxplugin.ExactProcessedLimit + 2000
	for _, at := range []time.Time{now.Add(-24 * time.Hour), now} { // two partitions
		require.NoError(t, db.Exec(`INSERT INTO outbox_events (message_id, event_type, payload, created_at, processed, processed_at)
			SELECT md5(g::text || ?::text), 'done', '{}', ?::timestamptz, true, now() FROM generate_series(1, ?) g`, at.String(), at, n/2).Error)
	}
	require.NoError(t, db.Exec("ANALYZE outbox_events").Error)
	stats, err := newTestAdmin(t, db).Stats(context.Background())
	require.NoError(t, err)
	assert.True(t, stats.ProcessedApproximate)
	assert.InEpsilon(t, n, stats.Processed, 0.1, "the partitions' estimates, summed")
}

// Two relays' maintenance at once, turn after turn: each partition is made once and dropped once, and
// neither fails; a turn that finds the other at work steps aside.
func TestPartitionMaintenanceTwoRelaysAtOnce(t *testing.T) {
	partitionDBs(t, func(t *testing.T, d dialect) {
		ctx := context.Background()
		start := time.Now().UTC().Add(-30 * 24 * time.Hour)
		db := setupPartitioned(t, d, start)
		workers := []*outboxplugin.Worker{newWorker(t, db, newRecorder()), newWorker(t, db, newRecorder())}
		var mu sync.Mutex
		created, dropped := map[string]int{}, map[string]int{}
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					at := start.Add(time.Duration(i) * 24 * time.Hour)
					res, err := outboxplugin.PartitionTurn(ctx, w, at, 48*time.Hour, true)
					if !assert.NoError(t, err) {
						return
					}
					mu.Lock()
					for _, n := range res.Created {
						created[n]++
					}
					for _, n := range res.Dropped {
						dropped[n]++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for n, c := range created {
			assert.Equal(t, 1, c, "%s made once", n)
		}
		for n, c := range dropped {
			assert.Equal(t, 1, c, "%s dropped once", n)
		}
		last := start.Add(19 * 24 * time.Hour)
		assert.NotEmpty(t, dropped)
		for _, name := range partitionNames(t, db, d) {
			if name == defaultName(d) {
				continue
			}
			first, err := time.Parse("20060102", name[strings.LastIndex(name, "p")+1:])
			require.NoError(t, err)
			assert.True(t, first.Add(24*time.Hour).After(last.Add(-48*time.Hour)), "%s is past the retention of the last turn and was not dropped", name)
		}
	})
}

// A partition dropped by another session while the catalog is read is left out, not an error: the
// catalog's rows come from the query's snapshot, but pg_get_expr reads the partition from the catalog
// cache, which has already lost it (a relay's turn beside another's drop failed the turn on this). A
// REPEATABLE READ transaction whose snapshot predates the drop makes the window as wide as needed.
func TestPartitionReadBesideADrop(t *testing.T) {
	partitionDBs(t, func(t *testing.T, d dialect) {
		if d.server() != "postgres" {
			t.Skip("MySQL's information_schema has no such window: a partition's row and its bounds are read together")
		}
		ctx := context.Background()
		now := time.Now().UTC()
		db := setupPartitioned(t, d, now)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		tx, err := sqlDB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		require.NoError(t, err)
		defer tx.Rollback()
		var one int
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one), "take the snapshot")

		gone := dayName(d, now)
		require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Exec(`DROP TABLE "`+gone+`"`).Error)

		table := partition.NewTable(partition.Postgres, "outbox_events")
		l, err := table.Read(ctx, tx)
		require.NoError(t, err)
		require.True(t, l.Partitioned)
		var names []string
		for _, p := range l.Partitions {
			names = append(names, p.Name)
		}
		assert.NotContains(t, names, gone)
		assert.Contains(t, names, dayName(d, now.Add(24*time.Hour)), "the partitions still there are read")
		assert.Contains(t, names, defaultName(d))
	})
}

// On a partitioned MySQL/MariaDB table the claim's locks leave the application's inserts alone. The
// claim locks its rows by id, which there is only a prefix of the primary key (id, created_at): at
// REPEATABLE READ such a lookup also locks the gap after the row, and after the newest row that gap
// is where the next insert goes. An insert made while the claim holds its locks must not wait (a
// second of innodb_lock_wait_timeout here; beside several relays the application's inserts were
// deadlock victims instead).
func TestPartitionedClaimLeavesInsertsAlone(t *testing.T) {
	partitionDBs(t, func(t *testing.T, d dialect) {
		if d.server() != "mysql" {
			t.Skip("PostgreSQL's locks of rows take no gaps")
		}
		now := time.Now().UTC()
		db := setupPartitioned(t, d, now)
		for i := range 5 {
			putEvent(t, db, fmt.Sprintf("Pending%d", i), now.Add(-time.Duration(5-i)*time.Second), "pending")
		}
		sqlDB, err := db.DB()
		require.NoError(t, err)
		app, err := sqlDB.Conn(context.Background())
		require.NoError(t, err)
		defer app.Close()
		_, err = app.ExecContext(context.Background(), `SET SESSION innodb_lock_wait_timeout = 1`)
		require.NoError(t, err)
		defer func() {
			_, err := app.ExecContext(context.Background(), `SET SESSION innodb_lock_wait_timeout = DEFAULT`)
			assert.NoError(t, err)
		}()

		rec := newRecorder()
		w := newWorker(t, db, rec)
		var insertErr error
		var once sync.Once
		outboxplugin.UseAfterClaimLock(w, func() {
			once.Do(func() {
				_, insertErr = app.ExecContext(context.Background(), `INSERT INTO outbox_events (message_id, event_type, payload, created_at) VALUES (?, ?, ?, ?)`,
					"during-the-claim", "Inserted", `{}`, time.Now().UTC())
			})
		})
		n, err := w.ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 5, n, "the claim took the rows there before it")
		assert.NoError(t, insertErr, "the application's insert beside the claim's locks")
	})
}
