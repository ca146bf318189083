package outboxplugin_test

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Payload values against the table: every event of a row payload (PayloadRow) or a changes payload
// (PayloadChanges) must hold, for each column it names, what the row holds in the database — NULL as
// null, a default or trigger or generated value as the database filled it, a time at the precision
// stored — never the value the Go struct held. Each case's events are compared with the table as read
// back after the write (before it, for rows the write deleted), column by column, as raw driver values.

// Widget has a column of each kind whose stored value can differ from the Go value of the struct
// that was written: Go types that cannot hold NULL, nullable types, database defaults, a column a
// trigger fills, a generated column, timestamps.
type Widget struct {
	ID    uint
	Code  string `gorm:"size:32;uniqueIndex"`
	Name  string `gorm:"size:64"`
	Qty   int
	Flag  bool
	Seen  time.Time
	Note  *string        `gorm:"size:64"`
	Nick  sql.NullString `gorm:"size:32"`
	At    *time.Time
	Label string `gorm:"size:32;default:fresh"`
	Score int    `gorm:"default:7"`
	// Stamp's default is the database's alone: GORM leaves a zero Stamp out of the INSERT.
	Stamp string `gorm:"type:varchar(32) DEFAULT 'db';default:(-)"`
	// Tag is set by triggers (widgetTriggers), whatever the statement wrote.
	Tag string `gorm:"size:64"`
	// Double is computed by the database; GORM never writes it.
	Double    int64 `gorm:"->;type:bigint GENERATED ALWAYS AS (qty * 2) STORED"`
	CreatedAt time.Time
	UpdatedAt time.Time
	DeletedAt gorm.DeletedAt
}

// widgetTriggers make the database change tag: a row inserted gets its name upper-cased, a row whose
// qty an update changes gets "q" and the new qty. Where the database has triggers that change the row
// before it is written (PostgreSQL, MySQL) they do; PostgreSQL also changes the inserted row again
// after the INSERT, and SQLite, whose triggers cannot change the row being written, updates it right
// after: what those later triggers write is not in the write's RETURNING.
var widgetTriggers = map[string][]string{
	"postgres": {
		`CREATE OR REPLACE FUNCTION widget_name() RETURNS trigger AS $$ BEGIN NEW.tag := upper(NEW.name); RETURN NEW; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER widget_name BEFORE INSERT ON widgets FOR EACH ROW EXECUTE FUNCTION widget_name()`,
		`CREATE OR REPLACE FUNCTION widget_mark() RETURNS trigger AS $$ BEGIN UPDATE widgets SET tag = tag || '+' WHERE id = NEW.id; RETURN NULL; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER widget_mark AFTER INSERT ON widgets FOR EACH ROW EXECUTE FUNCTION widget_mark()`,
		`CREATE OR REPLACE FUNCTION widget_qty() RETURNS trigger AS $$ BEGIN UPDATE widgets SET tag = 'q' || NEW.qty WHERE id = NEW.id; RETURN NULL; END $$ LANGUAGE plpgsql`,
		`CREATE TRIGGER widget_qty AFTER UPDATE OF qty ON widgets FOR EACH ROW WHEN (OLD.qty IS DISTINCT FROM NEW.qty) EXECUTE FUNCTION widget_qty()`,
	},
	"mysql": {
		`CREATE TRIGGER widget_name BEFORE INSERT ON widgets FOR EACH ROW SET NEW.tag = UPPER(NEW.name)`,
		`CREATE TRIGGER widget_qty BEFORE UPDATE ON widgets FOR EACH ROW SET NEW.tag = IF(NEW.qty <=> OLD.qty, NEW.tag, CONCAT('q', NEW.qty))`,
	},
	"sqlite": {
		`CREATE TRIGGER widget_name AFTER INSERT ON widgets BEGIN UPDATE widgets SET tag = upper(NEW.name) WHERE id = NEW.id; END`,
		`CREATE TRIGGER widget_qty AFTER UPDATE OF qty ON widgets WHEN OLD.qty IS NOT NEW.qty BEGIN UPDATE widgets SET tag = 'q' || NEW.qty WHERE id = NEW.id; END`,
	},
}

func setupWidgets(t *testing.T, d dialect, mode outboxplugin.PayloadMode) *gorm.DB {
	t.Helper()
	db := openDB(t, d, nil)
	resetTables(t, db, &outboxplugin.OutboxEvent{}, &Widget{})
	for _, ddl := range widgetTriggers[d.server()] {
		require.NoError(t, db.Exec(ddl).Error)
	}
	require.NoError(t, db.Use(outboxplugin.New(outboxplugin.WithPayloadMode(mode))))
	return db
}

// storedValues reads the widgets table as id -> column -> value, each value in the normal form of
// normalValue.
func storedValues(t *testing.T, db *gorm.DB) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, row := range storedRows(t, db, "widgets") {
		out[row["id"]] = row
	}
	return out
}

// storedRows reads a table as a list of column -> value, each value in the normal form of normalValue.
func storedRows(t *testing.T, db *gorm.DB, table string) []map[string]string {
	t.Helper()
	rows, err := db.Session(&gorm.Session{NewDB: true}).Table(table).Rows()
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out []map[string]string
	for rows.Next() {
		values := make([]any, len(cols))
		dests := make([]any, len(cols))
		for i := range dests {
			dests[i] = &values[i]
		}
		require.NoError(t, rows.Scan(dests...))
		row := make(map[string]string, len(cols))
		for i, c := range cols {
			row[c] = normalValue(values[i])
		}
		out = append(out, row)
	}
	require.NoError(t, rows.Err())
	return out
}

// normalValue writes a value read from the database or from a payload so that the same stored value
// compares equal whichever side it comes from: NULL as "null", times in UTC, booleans as 1 and 0
// (MySQL and SQLite keep them as numbers).
func normalValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case []byte:
		return normalValue(string(x))
	case string:
		if tm, err := time.Parse(time.RFC3339Nano, x); err == nil {
			return tm.UTC().Format(time.RFC3339Nano)
		}
		return x
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case bool:
		if x {
			return "1"
		}
		return "0"
	case int64:
		return strconv.FormatInt(x, 10)
	case json.Number:
		return x.String()
	}
	return fmt.Sprint(v)
}

// widgetColumns are the columns of a row payload: every column of the model.
var widgetColumns = []string{"id", "code", "name", "qty", "flag", "seen", "note", "nick", "at", "label", "score", "stamp", "tag", "double", "created_at", "updated_at", "deleted_at"}

type payloadCase struct {
	name string
	// before writes what the case starts from (its events are not the case's).
	before func(db *gorm.DB) error
	write  func(db *gorm.DB) error
	// events is how many events the write gives; absent lists columns a changes payload must not
	// name (the statement did not assign them).
	events int
	absent []string
}

func payloadCases() []payloadCase {
	note := "note"
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	full := func(code string) Widget {
		return Widget{Code: code, Name: "n-" + code, Qty: 3, Flag: true, Seen: at, Note: &note,
			Nick: sql.NullString{String: "nick", Valid: true}, At: &at, Label: "go", Score: 5, Stamp: "go", Tag: "go"}
	}
	create := func(code string) func(db *gorm.DB) error {
		return func(db *gorm.DB) error { w := full(code); return db.Create(&w).Error }
	}
	// omitted are columns each Go type of which cannot hold NULL, and nullable ones.
	omitted := []string{"name", "qty", "flag", "seen", "note", "nick", "at", "tag"}
	return []payloadCase{
		{name: "create", write: create("c1"), events: 1},
		{name: "create omit", events: 1, absent: omitted, write: func(db *gorm.DB) error {
			w := full("c2")
			return db.Omit(omitted...).Create(&w).Error
		}},
		{name: "create select", events: 1, absent: []string{"name", "qty", "flag", "seen", "label", "score", "stamp"}, write: func(db *gorm.DB) error {
			w := full("c3")
			return db.Select("code", "note").Create(&w).Error
		}},
		{name: "create zero defaults", events: 1, write: func(db *gorm.DB) error {
			return db.Create(&Widget{Code: "c4", Name: "z"}).Error
		}},
		{name: "create slice omit", events: 3, absent: omitted, write: func(db *gorm.DB) error {
			ws := []Widget{full("c5"), full("c6"), full("c7")}
			return db.Omit(omitted...).Create(&ws).Error
		}},
		{name: "create in batches omit", events: 5, absent: []string{"name", "seen"}, write: func(db *gorm.DB) error {
			ws := []*Widget{}
			for i := range 5 {
				w := full(fmt.Sprintf("b%d", i))
				ws = append(ws, &w)
			}
			return db.Omit("name", "seen").CreateInBatches(ws, 2).Error
		}},
		{name: "create map", events: 1, absent: omitted, write: func(db *gorm.DB) error {
			return db.Model(&Widget{}).Create(map[string]any{"code": "m1", "label": "map"}).Error
		}},
		{name: "create maps", events: 2, absent: omitted, write: func(db *gorm.DB) error {
			// Through Table: GORM itself fails Model(...).Create of a []map when it reads defaults back.
			return db.Table("widgets").Create([]map[string]any{{"code": "m2"}, {"code": "m3", "score": 9}}).Error
		}},
		{name: "create table map", events: 1, absent: omitted, write: func(db *gorm.DB) error {
			return db.Table("widgets").Create(map[string]any{"code": "m4"}).Error
		}},
		{name: "create explicit nulls", events: 1, write: func(db *gorm.DB) error {
			return db.Model(&Widget{}).Create(map[string]any{"code": "m5", "name": nil, "qty": gorm.Expr("NULL")}).Error
		}},
		{name: "save omit", before: create("s1"), events: 1, absent: []string{"name", "note"}, write: func(db *gorm.DB) error {
			var w Widget
			if err := db.Where("code = ?", "s1").Take(&w).Error; err != nil {
				return err
			}
			w.Name, w.Note, w.Qty = "changed", nil, 8
			return db.Omit("name", "note").Save(&w).Error
		}},
		{name: "updates struct omit", before: create("u1"), events: 1, absent: []string{"name", "code", "flag", "tag"}, write: func(db *gorm.DB) error {
			var w Widget
			if err := db.Where("code = ?", "u1").Take(&w).Error; err != nil {
				return err
			}
			return db.Model(&w).Omit("name").Updates(Widget{Name: "x", Qty: 11, Label: "l2"}).Error
		}},
		{name: "update to null", before: create("u2"), events: 1, absent: []string{"code", "flag", "qty"}, write: func(db *gorm.DB) error {
			return db.Model(&Widget{}).Where("code = ?", "u2").Updates(map[string]any{"name": nil, "seen": gorm.Expr("NULL"), "note": nil}).Error
		}},
		{name: "update partial model", before: create("u3"), events: 1, absent: []string{"code", "name"}, write: func(db *gorm.DB) error {
			var id uint
			if err := db.Model(&Widget{}).Where("code = ?", "u3").Select("id").Scan(&id).Error; err != nil {
				return err
			}
			return db.Model(&Widget{ID: id}).Update("qty", gorm.Expr("qty + 1")).Error
		}},
		{name: "upsert do updates", before: create("p1"), events: 2, write: func(db *gorm.DB) error {
			ws := []Widget{full("p1"), full("p2")}
			ws[0].Qty = 4 // MySQL leaves a row whose DO UPDATE changes nothing as it was: no event
			return db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "code"}}, DoUpdates: clause.AssignmentColumns([]string{"qty"})}).
				Omit("name", "seen").Create(&ws).Error
		}},
		{name: "upsert one do updates", before: create("p3"), events: 1, absent: []string{"name", "seen", "note"}, write: func(db *gorm.DB) error {
			w := full("p3")
			w.Qty = 42
			return db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "code"}}, DoUpdates: clause.AssignmentColumns([]string{"qty"})}).
				Omit("name", "seen").Create(&w).Error
		}},
		{name: "upsert one inserts", events: 1, absent: omitted, write: func(db *gorm.DB) error {
			w := full("p8")
			return db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "code"}}, DoUpdates: clause.AssignmentColumns([]string{"qty"})}).
				Omit(omitted...).Create(&w).Error
		}},
		{name: "save new omit", events: 1, absent: omitted, write: func(db *gorm.DB) error {
			w := full("s2")
			return db.Omit(omitted...).Save(&w).Error
		}},
		{name: "upsert update all", before: create("p4"), events: 2, write: func(db *gorm.DB) error {
			return db.Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "code"}}, UpdateAll: true}).
				Omit("name", "seen").Create(&[]Widget{full("p4"), full("p5")}).Error
		}},
		{name: "upsert do nothing", before: create("p6"), events: 1, absent: omitted, write: func(db *gorm.DB) error {
			return db.Clauses(clause.OnConflict{DoNothing: true}).Omit(omitted...).Create(&[]Widget{full("p6"), full("p7")}).Error
		}},
		{name: "soft delete", before: create("d1"), events: 1, write: func(db *gorm.DB) error {
			return db.Where("code = ?", "d1").Delete(&Widget{}).Error
		}},
		{name: "hard delete of nulls", before: func(db *gorm.DB) error {
			return db.Model(&Widget{}).Create(map[string]any{"code": "d2"}).Error
		}, events: 1, write: func(db *gorm.DB) error {
			return db.Unscoped().Where("code = ?", "d2").Delete(&Widget{}).Error
		}},
	}
}

// TestPayloadIsTheStoredRow checks each payload of each case against the table, on every database
// path, for both payload modes that carry values.
func TestPayloadIsTheStoredRow(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		for _, mode := range []outboxplugin.PayloadMode{outboxplugin.PayloadRow, outboxplugin.PayloadChanges} {
			t.Run(mode.String(), func(t *testing.T) {
				db := setupWidgets(t, d, mode)
				for _, c := range payloadCases() {
					t.Run(c.name, func(t *testing.T) {
						if c.before != nil {
							require.NoError(t, c.before(db))
						}
						before := storedValues(t, db)
						seen := len(loadEvents(t, db))
						require.NoError(t, c.write(db))
						after := storedValues(t, db)
						evs := loadEvents(t, db)[seen:]
						require.Len(t, evs, c.events)
						for _, e := range evs {
							assertPayloadStored(t, mode, e, before, after, c.absent)
						}
					})
				}
			})
		}
	})
}

// assertPayloadStored checks one event's payload against the row it names, as stored after the write
// (before it, for a row the write deleted).
func assertPayloadStored(t *testing.T, mode outboxplugin.PayloadMode, e outboxplugin.OutboxEvent, before, after map[string]map[string]string, absent []string) {
	t.Helper()
	p := payloadMap(t, e)
	id := normalValue(p["id"])
	stored, ok := after[id]
	if strings.HasSuffix(e.EventType, "_delete") && !ok {
		stored, ok = before[id]
	}
	require.True(t, ok, "event %s %s names no row", e.EventType, e.Payload)
	names := make([]string, 0, len(p))
	for name := range p {
		names = append(names, name)
	}
	sort.Strings(names)
	if mode == outboxplugin.PayloadRow {
		want := append([]string(nil), widgetColumns...)
		sort.Strings(want)
		assert.Equal(t, want, names, "a row payload names every column of the model")
	} else if e.EventType == "Widget_create" {
		for _, name := range absent {
			assert.NotContains(t, p, name, "%s: the statement did not assign %s", e.Payload, name)
		}
	}
	var wrong []string
	for _, name := range names {
		if got := normalValue(p[name]); got != stored[name] {
			wrong = append(wrong, fmt.Sprintf("%s: %s, stored %s", name, got, stored[name]))
		}
	}
	assert.Empty(t, wrong, "%s %s: values the row does not hold", e.EventType, e.Payload)
}

// A model without a primary key is identified by its columns and cannot be read back by key where
// the write returns nothing (MySQL): a column whose stored value the plugin does not know — one the
// INSERT did not write, one a MySQL UPDATE assigned — is left out of the payload, in every mode, never
// filled with the Go value. Each payload must match a row of the table in every column it names.
func TestKeylessPayloadIsAStoredRow(t *testing.T) {
	cases := []struct {
		name   string
		write  func(db *gorm.DB) error
		events int
	}{
		{"create omit", func(db *gorm.DB) error { return db.Omit("count").Create(&Tally{Name: "a", Count: 5}).Error }, 1},
		{"create slice omit", func(db *gorm.DB) error {
			return db.Omit("count").Create(&[]Tally{{Name: "b", Count: 5}, {Name: "c", Count: 6}}).Error
		}, 2},
		{"create table map", func(db *gorm.DB) error { return db.Table("tallies").Create(map[string]any{"name": "d"}).Error }, 1},
		{"update", func(db *gorm.DB) error { return db.Model(&Tally{}).Where("name = ?", "b").Update("count", 9).Error }, 1},
		{"delete", func(db *gorm.DB) error { return db.Where("name = ?", "c").Delete(&Tally{}).Error }, 1},
	}
	forEachDB(t, func(t *testing.T, d dialect) {
		for _, mode := range []outboxplugin.PayloadMode{outboxplugin.PayloadKey, outboxplugin.PayloadRow, outboxplugin.PayloadChanges} {
			t.Run(mode.String(), func(t *testing.T) {
				db := openDB(t, d, nil)
				resetTables(t, db, &outboxplugin.OutboxEvent{}, &Tally{})
				require.NoError(t, db.Use(outboxplugin.New(outboxplugin.WithPayloadMode(mode))))
				for _, c := range cases {
					t.Run(c.name, func(t *testing.T) {
						before := storedRows(t, db, "tallies")
						seen := len(loadEvents(t, db))
						require.NoError(t, c.write(db))
						evs := loadEvents(t, db)[seen:]
						require.Len(t, evs, c.events)
						table := storedRows(t, db, "tallies")
						for _, e := range evs {
							if strings.HasSuffix(e.EventType, "_delete") {
								table = before
							}
							p := payloadMap(t, e)
							assert.NotEmpty(t, p)
							assert.True(t, slices.ContainsFunc(table, func(row map[string]string) bool {
								for name, v := range p {
									if row[name] != normalValue(v) {
										return false
									}
								}
								return true
							}), "%s %s: no row of the table holds these values: %v", e.EventType, e.Payload, table)
						}
					})
				}
			})
		}
	})
}

// Changeset.Changes, which WithEventType and customizers see, names the columns the statement assigned
// and, in the modes that read the row back, holds their stored values: an omitted column is not in it
// (in PayloadKey mode it held the Go value), and a column written as NULL holds nil there.
func TestChangesetChangesAreWhatWasWritten(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		for _, mode := range []outboxplugin.PayloadMode{outboxplugin.PayloadKey, outboxplugin.PayloadRow, outboxplugin.PayloadChanges} {
			t.Run(mode.String(), func(t *testing.T) {
				var seen []map[string]any
				db := openDB(t, d, nil)
				resetTables(t, db, &outboxplugin.OutboxEvent{}, &Widget{})
				require.NoError(t, db.Use(outboxplugin.New(outboxplugin.WithPayloadMode(mode),
					outboxplugin.WithEventType(func(c outboxplugin.Changeset) string {
						seen = append(seen, c.Changes)
						return c.Model + "_" + c.Type.String()
					}))))

				note := "n"
				require.NoError(t, db.Omit("name", "note").Create(&Widget{Code: "a", Name: "secret", Note: &note, Qty: 2}).Error)
				require.NoError(t, db.Omit("name").Create(&[]Widget{{Code: "b", Name: "secret"}, {Code: "c", Name: "secret"}}).Error)
				require.Len(t, seen, 3)
				for _, changes := range seen {
					assert.NotContains(t, changes, "name", "omitted")
					assert.Contains(t, changes, "code")
				}
				assert.NotContains(t, seen[0], "note", "omitted")

				seen = nil
				require.NoError(t, db.Model(&Widget{}).Create(map[string]any{"code": "d", "name": nil}).Error)
				require.Len(t, seen, 1)
				require.Contains(t, seen[0], "name")
				assert.Nil(t, seen[0]["name"], "written as NULL")
			})
		}
	})
}

// Whatever columns a create leaves out, the row payload is the stored row: every subset of the
// columns that can be omitted, on every database.
func TestRowPayloadUnderEveryOmit(t *testing.T) {
	omittable := []string{"name", "qty", "flag", "seen", "note", "nick", "label", "stamp"}
	note := "note"
	at := time.Date(2024, 5, 6, 7, 8, 9, 987654321, time.UTC)
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupWidgets(t, d, outboxplugin.PayloadRow)
		for mask := range 1 << len(omittable) {
			var omit []string
			for i, c := range omittable {
				if mask&(1<<i) != 0 {
					omit = append(omit, c)
				}
			}
			w := Widget{Code: fmt.Sprintf("o%d", mask), Name: "n", Qty: 1, Flag: true, Seen: at, Note: &note,
				Nick: sql.NullString{String: "k", Valid: true}, At: &at, Label: "l", Score: 2, Stamp: "s", Tag: "t"}
			if len(omit) > 0 {
				require.NoError(t, db.Omit(omit...).Create(&w).Error)
			} else {
				require.NoError(t, db.Create(&w).Error)
			}
		}
		stored := storedValues(t, db)
		evs := loadEvents(t, db)
		require.Len(t, evs, 1<<len(omittable))
		for _, e := range evs {
			assertPayloadStored(t, outboxplugin.PayloadRow, e, nil, stored, nil)
		}
	})
}
