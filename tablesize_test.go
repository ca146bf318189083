package outboxplugin_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
)

// createHealthTable creates an outbox table of the test's own, named after prefix, from SchemaSQL's
// statements: as it is, or (partitionBy non-empty) with the primary key (id, created_at) and the
// clause appended to its CREATE TABLE, as a partitioned outbox is made. It drops the table when the
// test ends and returns its name.
func createHealthTable(t *testing.T, db *gorm.DB, server, prefix, partitionBy string) string {
	t.Helper()
	table := prefix + "_" + runToken()
	stmts, err := outboxplugin.SchemaSQL(server, table)
	require.NoError(t, err)
	for _, s := range stmts {
		if partitionBy != "" {
			if strings.HasPrefix(s, "ALTER TABLE") {
				continue // PostgreSQL takes no storage settings on a partitioned table, only on its partitions
			}
			if strings.HasPrefix(s, "CREATE TABLE") {
				s = strings.Replace(s, "PRIMARY KEY (id)", "PRIMARY KEY (id, created_at)", 1) + " " + partitionBy
			}
		}
		require.NoError(t, db.Exec(s).Error, s)
	}
	t.Cleanup(func() { require.NoError(t, db.Exec("DROP TABLE "+table).Error) })
	return table
}

// insertEvents writes n events created at the given time straight into table, each with a payload of
// size bytes.
func insertEvents(t *testing.T, db *gorm.DB, table string, n, size int, createdAt time.Time) {
	t.Helper()
	payload := `"` + strings.Repeat("x", size) + `"`
	for i := 0; i < n; i += 100 {
		var (
			values []string
			args   []any
		)
		for j := i; j < min(i+100, n); j++ {
			values = append(values, "(?, ?, ?, ?)")
			args = append(args, fmt.Sprintf("%d-%d-%s", createdAt.Unix(), j, runToken()), "HealthProbe", payload, createdAt)
		}
		require.NoError(t, db.Exec("INSERT INTO "+table+" (message_id, event_type, payload, created_at) VALUES "+strings.Join(values, ", "), args...).Error)
	}
}

// waitForHealth reads Stats until ok accepts its Health (the statistics views trail the writes by
// their flush), for at most 30 s, and returns the last Stats.
func waitForHealth(t *testing.T, admin *outboxplugin.Admin, ok func(outboxplugin.TableHealth) bool) outboxplugin.Stats {
	t.Helper()
	var st outboxplugin.Stats
	waitFor(t, func() bool {
		var err error
		st, err = admin.Stats(context.Background())
		require.NoError(t, err)
		return ok(st.Health)
	})
	return st
}

// waitForTableHealth is waitForHealth with Admin.TableHealth, which reads no page of the table: on
// PostgreSQL a query that reads them (Stats does) may prune dead rows, which the tests count.
func waitForTableHealth(t *testing.T, admin *outboxplugin.Admin, ok func(outboxplugin.TableHealth) bool) outboxplugin.TableHealth {
	t.Helper()
	var h outboxplugin.TableHealth
	waitFor(t, func() bool {
		var err error
		h, err = admin.TableHealth(context.Background())
		require.NoError(t, err)
		return ok(h)
	})
	return h
}

// waitFor calls cond until it holds, for at most 30 s; the caller asserts what it waited for.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
}

func known[T any](t *testing.T, what string, v *T) T {
	t.Helper()
	require.NotNil(t, v, "%s unknown", what)
	return *v
}

// Stats.Health gives the table's size and bloat on each database: sizes that grow with the rows
// written, dead rows after updates and the vacuum that clears them on PostgreSQL, the free space of
// deleted rows on MariaDB and SQLite, the purge lag on MariaDB.
func TestTableHealth(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := openDB(t, d, nil)
		table := createHealthTable(t, db, d.server(), "health", "")
		admin, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable(table))
		require.NoError(t, err)
		empty, err := admin.Stats(context.Background())
		require.NoError(t, err)

		insertEvents(t, db, table, 2000, 500, time.Now().UTC())
		switch d.server() {
		case "postgres":
			// Each UPDATE leaves a dead version of every row: 2000 dead rows, below the autovacuum
			// threshold the table has (10 000), so nothing vacuums them before the test does. The
			// session's statistics reach the views when it goes idle; pg_stat_force_next_flush makes
			// that the next time.
			sqlDB, err := db.DB()
			require.NoError(t, err)
			conn, err := sqlDB.Conn(context.Background())
			require.NoError(t, err)
			_, err = conn.ExecContext(context.Background(), "UPDATE "+table+" SET attempts = attempts + 1")
			require.NoError(t, err)
			_, err = conn.ExecContext(context.Background(), "SELECT pg_stat_force_next_flush()")
			require.NoError(t, err)
			require.NoError(t, conn.Close())
			h := waitForTableHealth(t, admin, func(h outboxplugin.TableHealth) bool { return h.DeadRows != nil && *h.DeadRows >= 2000 })
			assert.Empty(t, h.Unread)
			assert.GreaterOrEqual(t, known(t, "dead rows", h.DeadRows), int64(2000))
			assert.GreaterOrEqual(t, known(t, "live rows", h.LiveRows), int64(2000))
			assert.Greater(t, known(t, "table bytes", h.TableBytes), known(t, "table bytes of the empty table", empty.Health.TableBytes))
			assert.Greater(t, known(t, "index bytes", h.IndexBytes), int64(0))
			assert.GreaterOrEqual(t, known(t, "total bytes", h.TotalBytes), *h.TableBytes+*h.IndexBytes)
			assert.Nil(t, h.FreeBytes, "PostgreSQL has no cheap figure of free space")
			assert.Nil(t, h.PurgeLag)
			assert.Nil(t, h.LastVacuum, "never vacuumed")
			assert.Nil(t, h.Partitions)
			assert.Empty(t, h.Alerts, "2000 dead rows are below the threshold")

			st, err := admin.Stats(context.Background())
			require.NoError(t, err)
			assert.Equal(t, h.TotalBytes, st.Health.TotalBytes, "Stats carries the same figures")
			assert.NotNil(t, st.Health.DeadRows)

			require.NoError(t, db.Exec("VACUUM "+table).Error)
			st = waitForHealth(t, admin, func(h outboxplugin.TableHealth) bool { return h.LastVacuum != nil })
			vacuumed := known(t, "last vacuum", st.Health.LastVacuum)
			assert.False(t, vacuumed.After(st.At), "vacuumed %v, read at %v", vacuumed, st.At)
			assert.Equal(t, int64(0), known(t, "dead rows after VACUUM", st.Health.DeadRows))

		case "mysql":
			// InnoDB's in-memory figures move with the writes; ANALYZE makes the persistent ones
			// (which a server may show instead) current.
			require.NoError(t, db.Exec("ANALYZE TABLE "+table).Error)
			st, err := admin.Stats(context.Background())
			require.NoError(t, err)
			h := st.Health
			assert.Empty(t, h.Unread)
			assert.Greater(t, known(t, "table bytes", h.TableBytes), known(t, "table bytes of the empty table", empty.Health.TableBytes))
			assert.Greater(t, known(t, "index bytes", h.IndexBytes), int64(0))
			assert.Equal(t, *h.TableBytes+*h.IndexBytes, known(t, "total bytes", h.TotalBytes))
			assert.Greater(t, known(t, "live rows", h.LiveRows), int64(0))
			known(t, "free bytes", h.FreeBytes)
			assert.GreaterOrEqual(t, known(t, "purge lag", h.PurgeLag), int64(0))
			assert.Nil(t, h.DeadRows)
			assert.Nil(t, h.LastVacuum)
			assert.Nil(t, h.Partitions)

		case "sqlite":
			st, err := admin.Stats(context.Background())
			require.NoError(t, err)
			h := st.Health
			assert.Empty(t, h.Unread)
			full := known(t, "total bytes", h.TotalBytes)
			assert.Greater(t, full, known(t, "total bytes of the empty table", empty.Health.TotalBytes))
			assert.Equal(t, int64(0), known(t, "free bytes", h.FreeBytes))
			// Deleted rows leave their pages free in the file until VACUUM (no auto_vacuum).
			require.NoError(t, db.Exec("DELETE FROM "+table).Error)
			require.NoError(t, db.Exec("PRAGMA wal_checkpoint(TRUNCATE)").Error)
			st, err = admin.Stats(context.Background())
			require.NoError(t, err)
			assert.Greater(t, known(t, "free bytes after a delete", st.Health.FreeBytes), int64(500*1000))
			assert.Nil(t, st.Health.TableBytes)
			assert.Nil(t, st.Health.LiveRows)
		}
	})
}

// The partitions of a partitioned outbox (PostgreSQL's declarative partitions by range of created_at,
// MariaDB's RANGE COLUMNS) are listed from the catalog in range order with their bounds, ages, sizes
// and row estimates, the default (MAXVALUE) partition last and flagged; rows in it raise an alert,
// and the table's sizes are the partitions' sums.
func TestTableHealthPartitions(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() == "sqlite" {
			t.Skip("SQLite has no partitions")
		}
		db := openDB(t, d, nil)
		day := time.Now().UTC().Truncate(24 * time.Hour)
		days := []time.Time{day.AddDate(0, 0, -2), day.AddDate(0, 0, -1), day, day.AddDate(0, 0, 1)}
		var (
			clause string
			parts  []string
		)
		if d.server() == "postgres" {
			clause = "PARTITION BY RANGE (created_at)"
		} else {
			var defs []string
			for _, from := range days[:3] {
				defs = append(defs, fmt.Sprintf("PARTITION p%s VALUES LESS THAN ('%s')", from.Format("20060102"), from.AddDate(0, 0, 1).Format("2006-01-02 15:04:05")))
			}
			clause = "PARTITION BY RANGE COLUMNS(created_at) (" + strings.Join(defs, ", ") + ", PARTITION pmax VALUES LESS THAN (MAXVALUE))"
		}
		table := createHealthTable(t, db, d.server(), "healthpart", clause)
		if d.server() == "postgres" {
			for _, from := range days[:3] {
				name := table + "_p" + from.Format("20060102")
				parts = append(parts, name)
				require.NoError(t, db.Exec(fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
					name, table, from.Format("2006-01-02 15:04:05-07"), from.AddDate(0, 0, 1).Format("2006-01-02 15:04:05-07"))).Error)
			}
			parts = append(parts, table+"_default")
			require.NoError(t, db.Exec("CREATE TABLE "+table+"_default PARTITION OF "+table+" DEFAULT").Error)
		} else {
			for _, from := range days[:3] {
				parts = append(parts, "p"+from.Format("20060102"))
			}
			parts = append(parts, "pmax")
		}
		admin, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable(table))
		require.NoError(t, err)

		insertEvents(t, db, table, 300, 200, days[1].Add(time.Hour))
		insertEvents(t, db, table, 40, 200, days[3].AddDate(0, 0, 30)) // beyond every partition: the default's
		if d.server() == "postgres" {
			require.NoError(t, db.Exec("ANALYZE "+table).Error) // the partitions' row counts, at once
		} else {
			require.NoError(t, db.Exec("ANALYZE TABLE "+table).Error)
		}
		st := waitForHealth(t, admin, func(h outboxplugin.TableHealth) bool {
			return len(h.Partitions) == 4 && h.Partitions[3].Rows != nil && *h.Partitions[3].Rows > 0
		})
		require.Empty(t, st.Health.Unread)
		require.Len(t, st.Health.Partitions, 4)
		assert.Equal(t, int64(340), st.Processed+st.Pending, "Stats counts the partitioned table's events")

		var total int64
		for i, p := range st.Health.Partitions {
			assert.Equal(t, parts[i], p.Name)
			total += known(t, p.Name+" total bytes", p.TotalBytes)
			known(t, p.Name+" index bytes", p.IndexBytes)
			if i == 3 {
				assert.True(t, p.Default, "%s is the default partition", p.Name)
				assert.Nil(t, p.Age)
				assert.Nil(t, p.To)
				if d.server() == "mysql" { // VALUES LESS THAN (MAXVALUE): from the bound of the one before
					assert.Equal(t, days[3], known(t, p.Name+" lower bound", p.From).UTC())
				} else {
					assert.Nil(t, p.From)
				}
				assert.Greater(t, known(t, "rows of the default partition", p.Rows), int64(0))
				continue
			}
			assert.False(t, p.Default, p.Name)
			assert.Equal(t, days[i+1], known(t, p.Name+" upper bound", p.To).UTC(), p.Bound)
			if d.server() == "mysql" && i == 0 {
				assert.Nil(t, p.From, "no lower bound in the catalog; aged as wide as the next partition")
			} else {
				assert.Equal(t, days[i], known(t, p.Name+" lower bound", p.From).UTC(), p.Bound)
			}
			assert.Equal(t, st.At.Sub(days[i]), known(t, p.Name+" age", p.Age))
		}
		assert.Contains(t, st.Health.Partitions[0].Bound, days[1].Format("2006-01-02"))
		assert.Greater(t, known(t, "rows of "+parts[1], st.Health.Partitions[1].Rows), int64(0))
		assert.Equal(t, total, known(t, "total bytes", st.Health.TotalBytes), "the table's size is its partitions'")
		var codes []outboxplugin.HealthAlertCode
		for _, a := range st.Health.Alerts {
			codes = append(codes, a.Code)
		}
		assert.Contains(t, codes, outboxplugin.HealthAlertDefaultPartition)
	})
}

// A figure the database user may not read is unknown (nil), named in Unread, and Stats still
// succeeds: a MariaDB user without the PROCESS privilege cannot read INNODB_METRICS, so the purge lag
// is unknown while the table's own figures are there.
func TestTableHealthUnreadable(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() != "mysql" {
			t.Skip("the test takes a privilege away on MariaDB")
		}
		tableHealthWithoutProcess(t, d)
	})
}

func tableHealthWithoutProcess(t *testing.T, d dialect) {
	db := openDB(t, d, nil)
	table := createHealthTable(t, db, d.server(), "healthpriv", "")
	user := "outbox_health_" + runToken()
	require.NoError(t, db.Exec("CREATE USER '"+user+"'@'%'").Error)
	t.Cleanup(func() { require.NoError(t, db.Exec("DROP USER '"+user+"'@'%'").Error) })
	require.NoError(t, db.Exec("GRANT SELECT ON "+table+" TO '"+user+"'@'%'").Error)

	dsn := strings.Replace(myDSN, "root@", user+"@", 1)
	require.NotEqual(t, myDSN, dsn, "the MariaDB DSN names user root")
	pool, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { pool.Close() })
	limited, err := d.open(pool, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	admin, err := outboxplugin.NewAdmin(limited, outboxplugin.WithAdminTable(table))
	require.NoError(t, err)

	st, err := admin.Stats(context.Background())
	require.NoError(t, err)
	assert.Nil(t, st.Health.PurgeLag)
	require.Len(t, st.Health.Unread, 1)
	assert.Contains(t, st.Health.Unread[0], "INNODB_METRICS")
	known(t, "table bytes", st.Health.TableBytes)
}

// Dead rows past the threshold on a table never vacuumed raise the dead_rows alert (PostgreSQL):
// 12 000 rows deleted leave 12 000 dead ones, above 20 % of the live ones (none) plus 10 000. Only
// TableHealth reads the table's figures meanwhile: a query that reads its pages (Stats does) may prune
// them. Autovacuum is off on the test's table, so that it cannot clear them first.
func TestTableHealthDeadRowsAlert(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() != "postgres" {
			t.Skip("dead rows are PostgreSQL's")
		}
		db := openDB(t, d, nil)
		table := createHealthTable(t, db, d.server(), "healthdead", "")
		require.NoError(t, db.Exec("ALTER TABLE "+table+" SET (autovacuum_enabled = false)").Error)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		conn, err := sqlDB.Conn(context.Background())
		require.NoError(t, err)
		for _, stmt := range []string{"INSERT INTO " + table + " (message_id, event_type, payload, created_at) " +
			"SELECT g::text, 'HealthProbe', '{}', now() FROM generate_series(1, 12000) g",
			"DELETE FROM " + table, "SELECT pg_stat_force_next_flush()"} {
			_, err = conn.ExecContext(context.Background(), stmt)
			require.NoError(t, err)
		}
		require.NoError(t, conn.Close())
		admin, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable(table))
		require.NoError(t, err)
		h := waitForTableHealth(t, admin, func(h outboxplugin.TableHealth) bool { return h.DeadRows != nil && *h.DeadRows >= 12000 })
		require.GreaterOrEqual(t, known(t, "dead rows", h.DeadRows), int64(12000))
		require.Len(t, h.Alerts, 1)
		assert.Equal(t, outboxplugin.HealthAlertDeadRows, h.Alerts[0].Code)
		assert.Contains(t, h.Alerts[0].Text, "never vacuumed")

		require.NoError(t, db.Exec("VACUUM "+table).Error)
		h = waitForTableHealth(t, admin, func(h outboxplugin.TableHealth) bool { return h.DeadRows != nil && *h.DeadRows == 0 })
		assert.Equal(t, int64(0), known(t, "dead rows after VACUUM", h.DeadRows))
		assert.Empty(t, h.Alerts, "vacuumed: no dead rows left")
	})
}
