package outboxplugin_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// recordingHandler keeps the log records a worker writes.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// tableWarnings returns the table warnings the worker logged: the value of each record's "warning"
// attribute, with the record's level and message.
func (h *recordingHandler) tableWarnings() (codes []outboxplugin.TableWarningCode, levels []slog.Level, messages []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "warning" {
				codes = append(codes, outboxplugin.TableWarningCode(a.Value.String()))
				levels = append(levels, r.Level)
				messages = append(messages, r.Message)
			}
			return true
		})
	}
	return codes, levels, messages
}

// gormTableWarnings are the warnings a table made by GORM's own db.AutoMigrate gets on each server:
// found by comparing its catalog with that of a table made by outboxplugin.AutoMigrate. On MySQL and
// MariaDB the two differ by the lease columns' defaults only.
var gormTableWarnings = map[string][]outboxplugin.TableWarningCode{
	"postgres": {outboxplugin.TableWarningStorageSettings, outboxplugin.TableWarningReferenceIndex, outboxplugin.TableWarningDeadIndex},
	"sqlite":   {outboxplugin.TableWarningReferenceIndex, outboxplugin.TableWarningDeadIndex},
	"mysql":    {outboxplugin.TableWarningLeaseDefaults},
}

// codesOf returns the codes of warnings, in order.
func codesOf(warnings []outboxplugin.TableWarning) []outboxplugin.TableWarningCode {
	var codes []outboxplugin.TableWarningCode
	for _, w := range warnings {
		codes = append(codes, w.Code)
	}
	return codes
}

// A table made by GORM's own db.AutoMigrate(&outboxplugin.OutboxEvent{}) works, but lacks what
// outboxplugin.AutoMigrate gives it: the worker says so at WARN, once, and Stats and CheckTable list
// the same warnings with the same text; once outboxplugin.AutoMigrate has run, none is left.
func TestGormAutoMigrateTableWarnings(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setupGormTable(t, d, nil) // GORM's own AutoMigrate
		ctx := context.Background()
		want := gormTableWarnings[d.server()]
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)

		require.NoError(t, db.Create(&User{Name: "a"}).Error)
		logs := &recordingHandler{}
		pub := newRecorder()
		w, err := outboxplugin.NewWorker(db, pub, outboxplugin.WithLogger(slog.New(logs)))
		require.NoError(t, err)
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n, "the table works")
		require.NoError(t, db.Create(&User{Name: "b"}).Error)
		n, err = w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, n)

		codes, levels, messages := logs.tableWarnings()
		assert.Equal(t, want, codes, "each warning logged once by the worker, whatever its claims")
		for _, l := range levels {
			assert.Equal(t, slog.LevelWarn, l)
		}

		st, err := admin.Stats(ctx)
		require.NoError(t, err)
		require.Equal(t, want, codesOf(st.TableWarnings))
		checked, err := admin.CheckTable(ctx)
		require.NoError(t, err)
		assert.Equal(t, st.TableWarnings, checked)
		for i, tw := range st.TableWarnings {
			assert.Contains(t, tw.What, outboxplugin.DefaultTableName, "names the table")
			assert.NotEmpty(t, tw.Cost)
			assert.Contains(t, tw.Fix, "outboxplugin.AutoMigrate(db)")
			assert.Contains(t, tw.Fix, "outbox migrate")
			assert.NotContains(t, tw.String(), "\n", "one line")
			if i < len(messages) {
				assert.Equal(t, "outboxplugin: "+tw.String(), messages[i], "the worker logs the text Stats gives")
			}
		}
		switch d.server() {
		case "postgres":
			assert.Contains(t, st.TableWarnings[0].What, "fillfactor = 50")
			assert.Contains(t, st.TableWarnings[0].Cost, "a relay drains it at")
			assert.Contains(t, st.TableWarnings[1].What, "idx_outbox_events_processed_created_at")
			assert.Contains(t, st.TableWarnings[2].What, "idx_outbox_events_dead")
		case "sqlite":
			assert.Contains(t, st.TableWarnings[0].What, "idx_outbox_events_processed_created_at")
			assert.Contains(t, st.TableWarnings[1].What, "idx_outbox_events_dead")
		}

		require.NoError(t, outboxplugin.AutoMigrate(db))
		st, err = admin.Stats(ctx)
		require.NoError(t, err)
		assert.Empty(t, st.TableWarnings, "outboxplugin.AutoMigrate leaves nothing to warn about")
		checked, err = admin.CheckTable(ctx)
		require.NoError(t, err)
		assert.Empty(t, checked)
		logs = &recordingHandler{}
		w, err = outboxplugin.NewWorker(db, pub, outboxplugin.WithLogger(slog.New(logs)))
		require.NoError(t, err)
		_, err = w.ProcessOnce(ctx)
		require.NoError(t, err)
		codes, _, _ = logs.tableWarnings()
		assert.Empty(t, codes)
	})
}

// A table of an earlier version brought up to date by GORM's own AutoMigrate keeps the pending index
// (created_at, id) those versions declared, on every database: a warning, until outboxplugin.AutoMigrate
// drops it.
func TestTableWarningPendingIndex(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setupGormTable(t, d, nil)
		ctx := context.Background()
		// As earlier versions declared it (index:,composite:pending on created_at and id).
		require.NoError(t, db.Exec(`CREATE INDEX idx_outbox_events_pending ON outbox_events (created_at, id)`).Error)
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		st, err := admin.Stats(ctx)
		require.NoError(t, err)
		want := append(append([]outboxplugin.TableWarningCode(nil), gormTableWarnings[d.server()]...), outboxplugin.TableWarningPendingIndex)
		require.Equal(t, want, codesOf(st.TableWarnings))
		last := st.TableWarnings[len(st.TableWarnings)-1]
		assert.Contains(t, last.What, "idx_outbox_events_pending")

		logs := &recordingHandler{}
		w, err := outboxplugin.NewWorker(db, newRecorder(), outboxplugin.WithLogger(slog.New(logs)))
		require.NoError(t, err)
		_, err = w.ProcessOnce(ctx)
		require.NoError(t, err)
		codes, _, _ := logs.tableWarnings()
		assert.Equal(t, want, codes)

		require.NoError(t, outboxplugin.AutoMigrate(db))
		st, err = admin.Stats(ctx)
		require.NoError(t, err)
		assert.Empty(t, st.TableWarnings)
	})
}

// The storage settings warning names only the settings the table has no value for: a value of the
// user's is kept by AutoMigrate, and is not warned about.
func TestTableWarningStorageSettingsOfTheUser(t *testing.T) {
	db := setupGormTable(t, dialects[1], nil)
	require.NoError(t, outboxplugin.AutoMigrate(db))
	require.NoError(t, db.Exec(`ALTER TABLE outbox_events RESET (autovacuum_vacuum_threshold)`).Error)
	require.NoError(t, db.Exec(`ALTER TABLE outbox_events SET (fillfactor = 60)`).Error)
	admin, err := outboxplugin.NewAdmin(db)
	require.NoError(t, err)
	warnings, err := admin.CheckTable(context.Background())
	require.NoError(t, err)
	require.Equal(t, []outboxplugin.TableWarningCode{outboxplugin.TableWarningStorageSettings}, codesOf(warnings))
	assert.Contains(t, warnings[0].What, "autovacuum_vacuum_threshold = 10000")
	assert.NotContains(t, warnings[0].What, "fillfactor")
}

// On PostgreSQL a dead index that a failed CREATE INDEX CONCURRENTLY left INVALID is no index at all
// to the planner: a warning that says so.
func TestTableWarningInvalidDeadIndex(t *testing.T) {
	db := setupGormTable(t, dialects[1], nil)
	require.NoError(t, db.Create(&User{Name: "a"}).Error)
	// Fails on the row there (division by zero) and leaves the index behind, INVALID.
	err := db.Exec(`CREATE INDEX CONCURRENTLY idx_outbox_events_dead ON outbox_events ((1 / (id - id)))`).Error
	require.Error(t, err)
	admin, err := outboxplugin.NewAdmin(db)
	require.NoError(t, err)
	warnings, err := admin.CheckTable(context.Background())
	require.NoError(t, err)
	require.Equal(t, gormTableWarnings["postgres"], codesOf(warnings))
	assert.Contains(t, warnings[2].What, "invalid")
}

// On MySQL and MariaDB the full reference index (processed, created_at) of earlier versions (made by
// their AutoMigrate, or by GORM's from their tags) is a warning: every insert and every mark pays for
// it. outboxplugin.AutoMigrate drops it, and GORM's own AutoMigrate does not make it again.
func TestTableWarningMySQLReferenceIndex(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() != "mysql" {
			t.Skip("PostgreSQL and SQLite keep a partial reference index (TestGormAutoMigrateTableWarnings)")
		}
		db := setup(t, d, nil)
		ctx := context.Background()
		require.NoError(t, db.Exec(`CREATE INDEX idx_outbox_events_processed_created_at ON outbox_events (processed, created_at)`).Error)
		admin, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		warnings, err := admin.CheckTable(ctx)
		require.NoError(t, err)
		require.Equal(t, []outboxplugin.TableWarningCode{outboxplugin.TableWarningReferenceIndex}, codesOf(warnings))
		assert.Contains(t, warnings[0].What, "idx_outbox_events_processed_created_at")
		assert.Contains(t, warnings[0].Fix, "drops it")

		require.NoError(t, outboxplugin.AutoMigrate(db))
		assert.False(t, db.Migrator().HasIndex(&outboxplugin.OutboxEvent{}, "idx_outbox_events_processed_created_at"))
		require.NoError(t, db.AutoMigrate(&outboxplugin.OutboxEvent{}))
		assert.False(t, db.Migrator().HasIndex(&outboxplugin.OutboxEvent{}, "idx_outbox_events_processed_created_at"),
			"GORM's own AutoMigrate does not make it again")
		// It takes the lease columns' defaults away, though (its tags declare none): a warning, until
		// outboxplugin.AutoMigrate runs again.
		warnings, err = admin.CheckTable(ctx)
		require.NoError(t, err)
		assert.Equal(t, []outboxplugin.TableWarningCode{outboxplugin.TableWarningLeaseDefaults}, codesOf(warnings))
		require.NoError(t, outboxplugin.AutoMigrate(db))
		warnings, err = admin.CheckTable(ctx)
		require.NoError(t, err)
		assert.Empty(t, warnings)
	})
}

// A table in a schema of its own (db.Table("audit.events") for outboxplugin.AutoMigrate, WithAdminTable
// and WithTable for the Admin and the worker): the check reads that schema's catalog, not the
// default one's.
func TestTableWarningsSchemaQualified(t *testing.T) {
	db := setupGormTable(t, dialects[1], nil)
	plain := db.Session(&gorm.Session{NewDB: true})
	require.NoError(t, plain.Exec(`DROP SCHEMA IF EXISTS tablehealth CASCADE`).Error)
	require.NoError(t, plain.Exec(`CREATE SCHEMA tablehealth`).Error)
	t.Cleanup(func() { require.NoError(t, plain.Exec(`DROP SCHEMA tablehealth CASCADE`).Error) })
	const table = "tablehealth.events"
	require.NoError(t, plain.Table(table).AutoMigrate(&outboxplugin.OutboxEvent{}))
	admin, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable(table))
	require.NoError(t, err)
	warnings, err := admin.CheckTable(context.Background())
	require.NoError(t, err)
	assert.Equal(t, gormTableWarnings["postgres"], codesOf(warnings))
	for _, w := range warnings {
		assert.True(t, strings.Contains(w.What, table), "names %s: %s", table, w.What)
	}
	require.NoError(t, outboxplugin.AutoMigrate(plain.Table(table)))
	warnings, err = admin.CheckTable(context.Background())
	require.NoError(t, err)
	assert.Empty(t, warnings)
}

// CheckTable of a table that is not there is an error, not a list of everything it lacks.
func TestCheckTableOfAMissingTable(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := openDB(t, d, nil)
		admin, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable("outbox_not_there"))
		require.NoError(t, err)
		warnings, err := admin.CheckTable(context.Background())
		assert.Error(t, err)
		assert.Empty(t, warnings)
	})
}
