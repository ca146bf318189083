package outboxplugin_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Ratio has a float that JSON cannot encode when it is NaN.
type Ratio struct {
	ID    uint
	Value float64
}

func TestUnencodablePayloadRollsBack(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil, outboxplugin.WithPayloadMode(outboxplugin.PayloadRow))
		resetTables(t, db, &Ratio{})
		if d.name == "postgres" || d.name == "mysql" {
			// These servers refuse NaN in a double column on their own; store it through a
			// column type that takes it, so that the payload is what fails.
			t.Skipf("%s cannot store NaN in a double column", d.name)
		}
		err := db.Create(&Ratio{Value: math.NaN()}).Error
		require.ErrorIs(t, err, outboxplugin.ErrEncodePayload)
		assert.Zero(t, count(t, db, &Ratio{}), "no business row without its event")
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
		assert.Equal(t, []string{
			`Tally_create {"count":1,"name":"a"}`,
			`Tally_create {"count":2,"name":"b"}`,
			`Tally_delete {"count":2,"name":"b"}`,
			`Tally_delete {"count":5,"name":"a"}`,
			`Tally_update {"count":1,"name":"a"}`, // the row as the update found it
		}, sortedLines(normalizeJSON(t, got)))
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
// and locked the rows of an update, before the update runs: the update then changes a row whose key
// the plugin does not have. That must fail the write, never commit it without its event.
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

func TestConcurrentPhantomFailsTheWrite(t *testing.T) {
	d := dialects[1] // PostgreSQL: under READ COMMITTED each statement sees rows committed before it.
	pl := &phantomLogger{Interface: logger.Discard}
	db := setup(t, d, &gorm.Config{Logger: pl})
	require.NoError(t, db.Create(&User{Name: "a", Status: "open"}).Error)
	other := openDB(t, d, nil)
	pl.inject = func() {
		require.NoError(t, other.Exec("INSERT INTO users (name, status) VALUES ('phantom', 'open')").Error)
	}
	before := len(loadEvents(t, db))
	err := db.Model(&User{}).Where("status = ?", "open").Update("status", "closed").Error
	require.ErrorIs(t, err, outboxplugin.ErrConcurrentChange)
	var open int64
	require.NoError(t, db.Model(&User{}).Where("status = ?", "open").Count(&open).Error)
	assert.EqualValues(t, 2, open, "the update rolled back")
	assert.Len(t, loadEvents(t, db), before)
}
