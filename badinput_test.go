package outboxplugin_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
)

// Sealed stores as text but refuses to be encoded as JSON, as a type that guards its secret might.
type Sealed string

func (s Sealed) Value() (driver.Value, error) { return string(s), nil }

func (s *Sealed) Scan(src any) error {
	switch v := src.(type) {
	case string:
		*s = Sealed(v)
	case []byte:
		*s = Sealed(v)
	case nil:
		*s = ""
	default:
		return fmt.Errorf("Sealed: cannot scan %T", src)
	}
	return nil
}

var errSealed = errors.New("sealed values are not encoded")

func (Sealed) MarshalJSON() ([]byte, error) { return nil, errSealed }

// Vault has a column whose value cannot be encoded as JSON.
type Vault struct {
	ID     uint
	Secret Sealed `gorm:"type:varchar(32)"`
}

func TestUnencodablePayloadRollsBack(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil, outboxplugin.WithPayloadMode(outboxplugin.PayloadRow))
		resetTables(t, db, &Vault{})
		err := db.Create(&Vault{Secret: "s"}).Error
		require.ErrorIs(t, err, outboxplugin.ErrEncodePayload)
		require.ErrorIs(t, err, errSealed)
		assert.Zero(t, count(t, db, &Vault{}), "no business row without its event")
		assert.Empty(t, loadEvents(t, db))
	})
}

func TestUnencodableCustomPayloadRollsBack(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		resetTables(t, db, &Gadget{})
		err := db.Create(&Gadget{Name: "chan"}).Error
		require.ErrorIs(t, err, outboxplugin.ErrEncodePayload)
		assert.Zero(t, count(t, db, &Gadget{}))
		assert.Empty(t, loadEvents(t, db))
	})
}

// Gadget's customizer returns a payload encoding/json refuses.
type Gadget struct {
	ID   uint
	Name string
}

func (g *Gadget) CustomizeOutboxEvent(_ *outboxplugin.Changeset, e *outboxplugin.Event) error {
	e.Payload = map[string]any{"ch": make(chan int)}
	return nil
}

func TestMissingOutboxTableRollsBack(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Migrator().DropTable(&outboxplugin.OutboxEvent{}))
		err := db.Create(&User{Name: "orphan"}).Error
		require.Error(t, err)
		assert.Contains(t, err.Error(), "outbox_events")
		assert.Zero(t, count(t, db, &User{}), "no business row without its event")
	})
}

// A model without a primary key is identified by all its columns: its events carry the whole row,
// and updates and deletes by condition read the rows they change.
func TestModelWithoutPrimaryKey(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&[]Tally{{Name: "a", Count: 1}, {Name: "b", Count: 2}}).Error)
		require.NoError(t, db.Model(&Tally{}).Where("name = ?", "a").Update("count", 5).Error)
		require.NoError(t, db.Where("count > ?", 1).Delete(&Tally{}).Error)

		var got []string
		for _, e := range loadEvents(t, db) {
			assert.Empty(t, e.AggregateID)
			got = append(got, e.EventType+" "+string(e.Payload))
		}
		// The update's row: as written where the database returns it; on MySQL, which cannot read a
		// row without a key back, as the update found it without the column it assigned, whose
		// stored value is not known.
		updated := `Tally_update {"count":5,"name":"a"}`
		if d.server() == "mysql" {
			updated = `Tally_update {"name":"a"}`
		}
		assert.Equal(t, sortedLines([]string{
			`Tally_create {"count":1,"name":"a"}`,
			`Tally_create {"count":2,"name":"b"}`,
			`Tally_delete {"count":2,"name":"b"}`,
			`Tally_delete {"count":5,"name":"a"}`,
			updated,
		}), sortedLines(normalizeJSON(t, got)))
	})
}

func sortedLines(lines []string) []string {
	out := append([]string(nil), lines...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestLargeUpdateByCondition(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		users := make([]User, 2500)
		for i := range users {
			users[i] = User{Name: fmt.Sprint("u", i), Status: "bulk"}
		}
		require.NoError(t, db.WithContext(outboxplugin.WithoutCapture(context.Background())).CreateInBatches(&users, 500).Error)
		res := db.Model(&User{}).Where("status = ?", "bulk").Update("status", "done")
		require.NoError(t, res.Error)
		require.EqualValues(t, 2500, res.RowsAffected)
		evs := loadEvents(t, db)
		require.Len(t, evs, 2500, "one event per row, written in INSERTs of bounded size")
		seen := map[string]bool{}
		for _, e := range evs {
			seen[e.AggregateID] = true
		}
		assert.Len(t, seen, 2500)
	})
}

// phantomLogger inserts a matching row from another connection right after the plugin has read
// and locked the rows of an update on MySQL, before the update runs. Under READ COMMITTED nothing
// stops that insert; the update must then change exactly the rows it locked, whose events it has.
type phantomLogger struct {
	logger.Interface
	inject func()
	done   bool
}

func (l *phantomLogger) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	if !l.done {
		if sql, _ := fc(); strings.Contains(sql, "FOR UPDATE") {
			l.done = true
			l.inject()
		}
	}
}

func TestUpdateByConditionWritesTheRowsItLocked(t *testing.T) {
	for _, d := range dialects {
		if d.server() != "mysql" {
			continue // PostgreSQL and SQLite take the keys from the UPDATE's own RETURNING
		}
		t.Run(d.name, func(t *testing.T) {
			pl := &phantomLogger{Interface: logger.Discard}
			db := setup(t, d, &gorm.Config{Logger: pl})
			a := User{Name: "a", Status: "open"}
			require.NoError(t, db.Create(&a).Error)
			other := openDB(t, d, nil)
			pl.inject = func() {
				require.NoError(t, other.Exec("INSERT INTO users (name, status) VALUES ('phantom', 'open')").Error)
			}
			before := len(loadEvents(t, db))
			err := db.Transaction(func(tx *gorm.DB) error {
				return tx.Model(&User{}).Where("status = ?", "open").Update("status", "closed").Error
			}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			require.NoError(t, err)
			require.True(t, pl.done, "the phantom was inserted")
			var open []User
			require.NoError(t, db.Where("status = ?", "open").Find(&open).Error)
			require.Len(t, open, 1)
			assert.Equal(t, "phantom", open[0].Name, "the row committed after the lock was not written")
			assert.Equal(t, want("User_update", a.ID), eventKeys(t, loadEvents(t, db)[before:]))
		})
	}
}

// A callback that puts another connection in place after the plugin's, as a read/write splitting
// plugin registered later might, makes the write bypass the plugin: the write then fails rather than
// commit without its event.
func TestWriteThatBypassesThePluginFails(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		const key = "test:pool"
		create := db.Callback().Create()
		require.NoError(t, create.Before("outbox:before_create").Register("test:keep_pool", func(tx *gorm.DB) {
			tx.InstanceSet(key, tx.Statement.ConnPool)
		}))
		require.NoError(t, create.After("outbox:before_create").Before("gorm:create").Register("test:swap_pool", func(tx *gorm.DB) {
			if pool, ok := tx.InstanceGet(key); ok {
				tx.Statement.ConnPool = pool.(gorm.ConnPool)
			}
		}))
		// A plain create needs nothing in place; an upsert does.
		require.NoError(t, db.Create(&Language{Code: "en"}).Error)
		err := db.Clauses(clause.OnConflict{UpdateAll: true}).Create(&Language{Code: "en", Name: "English"}).Error
		require.Error(t, err)
		assert.Contains(t, err.Error(), "did not go through the plugin's connection")
		var l Language
		require.NoError(t, db.First(&l, "code = ?", "en").Error)
		assert.Empty(t, l.Name, "rolled back")
		assert.Len(t, loadEvents(t, db), 1)
	})
}

// Under READ COMMITTED nothing stops another transaction from inserting, between the rows a multi-row
// upsert locks and the upsert itself, a key the upsert then conflicts with. Where MySQL reports the
// count of affected rows (no RETURNING: MySQL 8's path), the count gives it away and the write fails.
func TestMultiRowUpsertRaceUnderReadCommitted(t *testing.T) {
	d := dialects[3]
	require.Equal(t, "mysql_noreturning", d.name)
	pl := &phantomLogger{Interface: logger.Discard}
	db := setup(t, d, &gorm.Config{Logger: pl})
	resetTables(t, db, &Account{})
	other := openDB(t, d, nil)
	pl.inject = func() {
		require.NoError(t, other.Exec("INSERT INTO accounts (email, name, ver) VALUES ('raced@x', 'other', 0)").Error)
	}
	onEmail := clause.OnConflict{Columns: []clause.Column{{Name: "email"}}, DoUpdates: clause.AssignmentColumns([]string{"name"})}
	err := db.Transaction(func(tx *gorm.DB) error {
		return tx.Clauses(onEmail).Create(&[]Account{{Email: "raced@x", Name: "mine"}, {Email: "fresh@x", Name: "fresh"}}).Error
	}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	require.True(t, pl.done)
	require.ErrorIs(t, err, outboxplugin.ErrConcurrentChange)
	var a Account
	require.NoError(t, db.First(&a, "email = ?", "raced@x").Error)
	assert.Equal(t, "other", a.Name, "rolled back")
	assert.Empty(t, loadEvents(t, db))
}
