package outboxplugin_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

func TestEmit(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		var u User
		err := db.Transaction(func(tx *gorm.DB) error {
			u = User{Name: "ann"}
			if err := tx.WithContext(outboxplugin.WithoutCapture(tx.Statement.Context)).Create(&u).Error; err != nil {
				return err
			}
			return outboxplugin.Emit(tx, "UserRegistered", map[string]any{"id": u.ID, "name": u.Name},
				outboxplugin.WithAggregate("user", "42"))
		})
		require.NoError(t, err)
		evs := loadEvents(t, db)
		require.Len(t, evs, 1)
		assert.Equal(t, "UserRegistered", evs[0].EventType)
		assert.Equal(t, "user", evs[0].AggregateType)
		assert.Equal(t, "42", evs[0].AggregateID)
		assert.Equal(t, "ann", payloadMap(t, evs[0])["name"])
		assert.Len(t, evs[0].MessageID, 36)

		// Raw JSON is taken as it is.
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Raw", json.RawMessage(`{"a":[1,2]}`))
		}))
		assert.JSONEq(t, `{"a":[1,2]}`, string(loadEvents(t, db)[1].Payload))

		// Characters that need escaping on the way in, several events in one statement.
		tricky := map[string]string{"s": "quote\" back\\ slash, {brace} ünïcödé \t tab NULL"}
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, `Type "with" \ quotes`, tricky, outboxplugin.WithAggregate(`a"b`, `c\d`),
				outboxplugin.WithHeaders(map[string]string{"h": `x"y\z`}))
		}))
		last := loadEvents(t, db)[2]
		assert.Equal(t, `Type "with" \ quotes`, last.EventType)
		assert.Equal(t, `a"b`, last.AggregateType)
		assert.Equal(t, `c\d`, last.AggregateID)
		assert.Equal(t, tricky["s"], payloadMap(t, last)["s"])
		assert.JSONEq(t, `{"h":"x\"y\\z"}`, string(last.Headers))
	})
}

func TestEmitRollsBackWithTransaction(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		boom := errors.New("boom")
		err := db.Transaction(func(tx *gorm.DB) error {
			if err := outboxplugin.Emit(tx, "Doomed", map[string]int{"n": 1}); err != nil {
				return err
			}
			return boom
		})
		require.ErrorIs(t, err, boom)
		assert.Empty(t, loadEvents(t, db))

		// With Begin/Rollback too.
		tx := db.Begin()
		require.NoError(t, outboxplugin.Emit(tx, "Doomed", nil))
		require.NoError(t, tx.Rollback().Error)
		assert.Empty(t, loadEvents(t, db))
	})
}

func TestEmitRefusesBadInput(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)

		require.ErrorIs(t, outboxplugin.Emit(db, "NoTx", nil), outboxplugin.ErrNotInTransaction)

		err := db.Transaction(func(tx *gorm.DB) error {
			require.ErrorIs(t, outboxplugin.Emit(tx, "", nil), outboxplugin.ErrEmptyEventType)
			require.ErrorIs(t, outboxplugin.Emit(tx, "Chan", make(chan int)), outboxplugin.ErrEncodePayload)
			require.ErrorIs(t, outboxplugin.Emit(tx, "BadRaw", json.RawMessage(`{"a":`)), outboxplugin.ErrInvalidJSON)
			require.ErrorIs(t, outboxplugin.Emit(tx, "BadBytes", []byte("not json")), outboxplugin.ErrEncodePayload)
			require.ErrorIs(t, outboxplugin.Emit(tx, "BadJSONType", outboxplugin.JSON(`{"a":`)), outboxplugin.ErrInvalidJSON)
			return nil
		})
		require.NoError(t, err)
		assert.Empty(t, loadEvents(t, db), "nothing written by refused calls")
		require.Error(t, outboxplugin.Emit(nil, "Nil", nil))
	})
}

// A payload of this package's JSON type, from Emit or from a customizer, is JSON text written as it
// is, like json.RawMessage, not a byte slice for encoding/json to encode as base64.
func TestJSONPayloadIsJSONText(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		resetTables(t, db, &RawWidget{})
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Raw", outboxplugin.JSON(`{"emitted":[1,2]}`))
		}))
		require.NoError(t, db.Create(&RawWidget{Name: "w"}).Error)
		evs := loadEvents(t, db)
		require.Len(t, evs, 2)
		assert.JSONEq(t, `{"emitted":[1,2]}`, string(evs[0].Payload))
		assert.JSONEq(t, `{"customized":"w"}`, string(evs[1].Payload))
	})
}

// RawWidget's customizer sets its payload as this package's JSON type.
type RawWidget struct {
	ID   uint
	Name string
}

func (w *RawWidget) CustomizeOutboxEvent(_ *outboxplugin.Changeset, e *outboxplugin.Event) error {
	e.Payload = outboxplugin.JSON(`{"customized":"` + w.Name + `"}`)
	return nil
}
