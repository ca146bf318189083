package outboxplugin_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// Invoice shapes its own events.
type Invoice struct {
	ID     uint
	Number string `gorm:"size:32"`
	Total  int
	Secret bool
}

var errInvoice = errors.New("invoice refused")

func (i *Invoice) CustomizeOutboxEvent(c *outboxplugin.Changeset, e *outboxplugin.Event) error {
	switch {
	case i.Number == "refuse":
		return errInvoice
	case i.Secret:
		e.Skip = true
		return nil
	}
	e.Type = "billing.invoice." + c.Type.String()
	e.AggregateType = "invoice"
	if i.Number != "" {
		e.AggregateID = i.Number
		e.Payload = map[string]any{"number": i.Number, "total": i.Total}
	}
	e.Headers["model"] = c.Model
	return nil
}

func TestInvalidOptions(t *testing.T) {
	cases := []struct {
		name string
		opt  outboxplugin.Option
		want error
	}{
		{"empty table", outboxplugin.WithTableName(""), outboxplugin.ErrInvalidTableName},
		{"injection", outboxplugin.WithTableName("outbox; DROP TABLE users"), outboxplugin.ErrInvalidTableName},
		{"quote", outboxplugin.WithTableName(`outbox"x`), outboxplugin.ErrInvalidTableName},
		{"three parts", outboxplugin.WithTableName("a.b.c"), outboxplugin.ErrInvalidTableName},
		{"leading digit", outboxplugin.WithTableName("1outbox"), outboxplugin.ErrInvalidTableName},
		{"payload mode", outboxplugin.WithPayloadMode(outboxplugin.PayloadMode(42)), outboxplugin.ErrInvalidOption},
		{"nil event type", outboxplugin.WithEventType(nil), outboxplugin.ErrInvalidOption},
		{"nil headers", outboxplugin.WithContextHeaders(nil), outboxplugin.ErrInvalidOption},
		{"model not a struct", outboxplugin.WithModels("users"), outboxplugin.ErrInvalidOption},
		{"nil model", outboxplugin.WithoutModels(nil), outboxplugin.ErrInvalidOption},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := openDB(t, dialects[0], nil)
			err := db.Use(outboxplugin.New(c.opt))
			require.ErrorIs(t, err, c.want)
			// Nothing was registered: writes go on without capture and without failing.
			assert.Nil(t, db.Callback().Create().Get("outbox:after_create"))
		})
	}
}

func TestCustomTableName(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := openDB(t, d, nil)
		resetTables(t, db, captureModels...)
		require.NoError(t, db.Migrator().DropTable("custom_outbox"))
		require.NoError(t, db.Use(outboxplugin.New(outboxplugin.WithTableName("custom_outbox"))))
		require.NoError(t, outboxplugin.AutoMigrate(db))

		u := User{Name: "ann"}
		require.NoError(t, db.Create(&u).Error)
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Hello", map[string]int{"n": 1})
		}))
		var evs []outboxplugin.OutboxEvent
		require.NoError(t, db.Table("custom_outbox").Order("id").Find(&evs).Error)
		require.Len(t, evs, 2)
		assert.Equal(t, "User_create", evs[0].EventType)
		assert.Equal(t, "Hello", evs[1].EventType)
		assert.Empty(t, loadEvents(t, db), "nothing in the default table")
	})
}

func TestPayloadModes(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		t.Run("row", func(t *testing.T) {
			db := setup(t, d, nil, outboxplugin.WithPayloadMode(outboxplugin.PayloadRow))
			u := User{Name: "ann", Age: 30, Status: "new"}
			require.NoError(t, db.Create(&u).Error)
			require.NoError(t, db.Model(&u).Update("age", 31).Error)
			require.NoError(t, db.Model(&User{}).Where("status = ?", "new").Update("status", "old").Error)
			require.NoError(t, db.Delete(&u).Error)

			evs := loadEvents(t, db)
			require.Len(t, evs, 4)
			created := payloadMap(t, evs[0])
			assert.Equal(t, "ann", created["name"])
			assert.Equal(t, "30", fmt.Sprint(created["age"]))
			assert.Equal(t, fmt.Sprint(u.ID), fmt.Sprint(created["id"]))
			assert.Contains(t, created, "created_at")

			updated := payloadMap(t, evs[1])
			assert.Equal(t, "31", fmt.Sprint(updated["age"]), "the row after the update")
			assert.Equal(t, "ann", updated["name"])

			byCondition := payloadMap(t, evs[2])
			assert.Equal(t, "old", byCondition["status"], "the row as stored, though no row was in memory")
			assert.Equal(t, "ann", byCondition["name"])
			assert.Equal(t, "31", fmt.Sprint(byCondition["age"]))
			assert.Equal(t, fmt.Sprint(u.ID), fmt.Sprint(byCondition["id"]))

			deleted := payloadMap(t, evs[3])
			assert.Equal(t, "ann", deleted["name"], "the row as it was deleted")
			assert.Equal(t, "old", deleted["status"])
		})
		t.Run("changes", func(t *testing.T) {
			db := setup(t, d, nil, outboxplugin.WithPayloadMode(outboxplugin.PayloadChanges))
			u := User{Name: "bob", Age: 40}
			require.NoError(t, db.Create(&u).Error)
			require.NoError(t, db.Model(&u).Updates(map[string]any{"age": 41, "status": "x"}).Error)
			require.NoError(t, db.Model(&u).Update("age", gorm.Expr("age + ?", 1)).Error)
			require.NoError(t, db.Delete(&u).Error)

			evs := loadEvents(t, db)
			require.Len(t, evs, 4)
			assert.Equal(t, "bob", payloadMap(t, evs[0])["name"])
			upd := payloadMap(t, evs[1])
			assert.Equal(t, "41", fmt.Sprint(upd["age"]))
			assert.Equal(t, "x", upd["status"])
			assert.NotContains(t, upd, "name", "only the columns the update wrote")
			expr := payloadMap(t, evs[2])
			assert.Equal(t, "42", fmt.Sprint(expr["age"]), "a column set to an SQL expression carries its result")
			assert.Contains(t, expr, "updated_at")
			assert.NotContains(t, expr, "name")
			assert.JSONEq(t, fmt.Sprintf(`{"id":%d}`, u.ID), string(evs[3].Payload))
		})
	})
}

func TestEventTypeAndModelFilters(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil,
			outboxplugin.WithEventType(func(c outboxplugin.Changeset) string {
				return strings.ToLower(c.Model) + "." + c.Type.String() + "d"
			}),
			outboxplugin.WithModels(&User{}, &Pet{}, Language{}),
			outboxplugin.WithoutModels(&Pet{}),
		)
		u := User{Name: "ann", Pets: []Pet{{Name: "rex"}}}
		require.NoError(t, db.Create(&u).Error)
		require.NoError(t, db.Create(&SoftUser{Name: "not listed"}).Error)
		require.NoError(t, db.Create(&Language{Code: "en"}).Error)

		var types []string
		for _, e := range loadEvents(t, db) {
			types = append(types, e.EventType)
		}
		assert.Equal(t, []string{"user.created", "language.created"}, types)
	})
}

func TestWithoutCapture(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		ctx := outboxplugin.WithoutCapture(context.Background())
		u := User{Name: "quiet", Pets: []Pet{{Name: "rex"}}}
		require.NoError(t, db.WithContext(ctx).Create(&u).Error)
		require.NoError(t, db.WithContext(ctx).Model(&u).Update("age", 3).Error)
		assert.Empty(t, loadEvents(t, db))
		assert.EqualValues(t, 1, count(t, db, &User{}))

		require.NoError(t, db.Model(&User{ID: u.ID}).Update("age", 4).Error)
		assert.Len(t, loadEvents(t, db), 1, "other calls still capture")
	})
}

type traceKey struct{}

func TestContextHeaders(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil, outboxplugin.WithContextHeaders(func(ctx context.Context) map[string]string {
			if tp, ok := ctx.Value(traceKey{}).(string); ok {
				return map[string]string{"traceparent": tp}
			}
			return nil
		}))
		ctx := context.WithValue(context.Background(), traceKey{}, "00-abc-def-01")
		require.NoError(t, db.WithContext(ctx).Create(&User{Name: "traced"}).Error)
		require.NoError(t, db.Create(&User{Name: "untraced"}).Error)
		require.NoError(t, db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Traced", nil, outboxplugin.WithHeaders(map[string]string{"x": "y"}))
		}))

		evs := loadEvents(t, db)
		require.Len(t, evs, 3)
		assert.JSONEq(t, `{"traceparent":"00-abc-def-01"}`, string(evs[0].Headers))
		assert.Nil(t, evs[1].Headers)
		assert.JSONEq(t, `{"traceparent":"00-abc-def-01","x":"y"}`, string(evs[2].Headers))
	})
}

func TestEventCustomizer(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		resetTables(t, db, &Invoice{})

		inv := Invoice{Number: "INV-1", Total: 100}
		require.NoError(t, db.Create(&inv).Error)
		require.NoError(t, db.Create(&Invoice{Number: "INV-2", Secret: true}).Error)
		require.NoError(t, db.Model(&Invoice{}).Where("total = ?", 100).Update("total", 120).Error)

		err := db.Create(&Invoice{Number: "refuse"}).Error
		require.ErrorIs(t, err, errInvoice)
		assert.EqualValues(t, 2, count(t, db, &Invoice{}), "the refused invoice rolled back")

		evs := loadEvents(t, db)
		require.Len(t, evs, 2, "the secret invoice opted out")
		assert.Equal(t, "billing.invoice.create", evs[0].EventType)
		assert.Equal(t, "invoice", evs[0].AggregateType)
		assert.Equal(t, "INV-1", evs[0].AggregateID)
		assert.JSONEq(t, `{"number":"INV-1","total":100}`, string(evs[0].Payload))
		assert.JSONEq(t, `{"model":"Invoice"}`, string(evs[0].Headers))

		// An update by condition has no row in memory: the customizer runs on a zero Invoice and
		// keeps the default payload and aggregate id.
		assert.Equal(t, "billing.invoice.update", evs[1].EventType)
		assert.Equal(t, fmt.Sprint(inv.ID), evs[1].AggregateID)
		assert.JSONEq(t, fmt.Sprintf(`{"id":%d}`, inv.ID), string(evs[1].Payload))
	})
}
