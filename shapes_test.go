package outboxplugin_test

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// The write shapes services run beyond plain creates, updates and deletes: upserts by any unique key,
// INSERT modifiers, conditional upserts, UPDATE … FROM, Table(...) writes. Each test checks the
// events against what the database did, read from the table itself before and after the write
// (tableChanges), so that an event for a row the database skipped, or a row written without one,
// fails it.

// Account has a unique email besides its key.
type Account struct {
	ID     uint
	Email  string `gorm:"size:64;uniqueIndex"`
	Name   string `gorm:"size:64"`
	Ver    int
	Secret *string `gorm:"size:64"`
}

// Profile belongs to an account; UPDATE … FROM reads it.
type Profile struct {
	ID        uint
	AccountID uint
	Nick      string `gorm:"size:64"`
	VIP       bool   `gorm:"column:vip"`
}

func setupAccounts(t *testing.T, d dialect, opts ...outboxplugin.Option) *gorm.DB {
	t.Helper()
	db := setup(t, d, nil, opts...)
	resetTables(t, db, &Account{}, &Profile{})
	return db
}

// accountRows reads the accounts table as id -> its columns.
func accountRows(t *testing.T, db *gorm.DB) map[uint]string {
	t.Helper()
	var rows []Account
	require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Order("id").Find(&rows).Error)
	out := make(map[uint]string, len(rows))
	for _, r := range rows {
		secret := "<nil>"
		if r.Secret != nil {
			secret = *r.Secret
		}
		out[r.ID] = fmt.Sprintf("%s|%s|%d|%s", r.Email, r.Name, r.Ver, secret)
	}
	return out
}

// tableChanges runs write and returns the events the table's changes call for ("Account_create 3"),
// and the events written, both sorted: exactly one event per row the database wrote. Writes must
// change every row they write, so that the change shows in the table.
func tableChanges(t *testing.T, db *gorm.DB, write func() error) (expected, got []string) {
	t.Helper()
	before := accountRows(t, db)
	events := len(loadEvents(t, db))
	expected = []string{}
	require.NoError(t, write())
	after := accountRows(t, db)
	for id, row := range after {
		old, existed := before[id]
		switch {
		case !existed:
			expected = append(expected, fmt.Sprintf("Account_create %d", id))
		case old != row:
			expected = append(expected, fmt.Sprintf("Account_update %d", id))
		}
	}
	for id := range before {
		if _, ok := after[id]; !ok {
			expected = append(expected, fmt.Sprintf("Account_delete %d", id))
		}
	}
	sort.Strings(expected)
	return expected, eventKeys(t, loadEvents(t, db)[events:])
}

func assertEventsMatchTable(t *testing.T, db *gorm.DB, write func() error) []string {
	t.Helper()
	expected, got := tableChanges(t, db, write)
	assert.Equal(t, expected, got, "one event per row the database wrote, with that row's key")
	return got
}

func TestUpsertByAnotherUniqueKey(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupAccounts(t, d)
		ann := Account{Email: "ann@x", Name: "ann"}
		require.NoError(t, db.Create(&ann).Error)
		onEmail := clause.OnConflict{Columns: []clause.Column{{Name: "email"}}, DoUpdates: clause.AssignmentColumns([]string{"name"})}

		// A client-chosen key that does not exist, and an email that does: the database updates
		// ann's row; no row with the proposed key appears.
		got := assertEventsMatchTable(t, db, func() error {
			return db.Clauses(onEmail).Create(&Account{ID: ann.ID + 100, Email: "ann@x", Name: "ann2"}).Error
		})
		assert.Equal(t, []string{fmt.Sprintf("Account_update %d", ann.ID)}, got)

		// Several rows: one updates ann again, one is new.
		got = assertEventsMatchTable(t, db, func() error {
			return db.Clauses(onEmail).Create(&[]Account{{ID: ann.ID + 200, Email: "ann@x", Name: "ann3"}, {Email: "bob@x", Name: "bob"}}).Error
		})
		require.Len(t, got, 2)
		assert.Contains(t, got, fmt.Sprintf("Account_update %d", ann.ID))

		// The same without client keys.
		assertEventsMatchTable(t, db, func() error {
			return db.Clauses(onEmail).Create(&[]Account{{Email: "bob@x", Name: "bob2"}, {Email: "cid@x", Name: "cid"}, {Email: "ann@x", Name: "ann4"}}).Error
		})
	})
}

func TestUpsertDoNothingByAnotherUniqueKey(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupAccounts(t, d)
		require.NoError(t, db.Create(&Account{Email: "ann@x", Name: "ann"}).Error)
		skip := clause.OnConflict{Columns: []clause.Column{{Name: "email"}}, DoNothing: true}

		got := assertEventsMatchTable(t, db, func() error {
			return db.Clauses(skip).Create(&Account{Email: "ann@x", Name: "again"}).Error
		})
		assert.Empty(t, got, "a skipped row gets no event")

		got = assertEventsMatchTable(t, db, func() error {
			return db.Clauses(skip).Create(&[]Account{{Email: "ann@x", Name: "again"}, {Email: "new@x", Name: "new"}, {Email: "new2@x"}}).Error
		})
		assert.Len(t, got, 2)
	})
}

func TestInsertModifierIgnore(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		modifier := "IGNORE"
		switch d.server() {
		case "postgres":
			t.Skip("PostgreSQL has no INSERT modifiers; ON CONFLICT DO NOTHING is the same")
		case "sqlite":
			modifier = "OR IGNORE"
		}
		db := setupAccounts(t, d)
		require.NoError(t, db.Create(&Account{Email: "ann@x", Name: "ann"}).Error)
		ignore := clause.Insert{Modifier: modifier}

		got := assertEventsMatchTable(t, db, func() error {
			return db.Clauses(ignore).Create(&Account{Email: "ann@x", Name: "dup"}).Error
		})
		assert.Empty(t, got, "an ignored row gets no event")

		got = assertEventsMatchTable(t, db, func() error {
			return db.Clauses(ignore).Create(&Account{Email: "bob@x", Name: "bob"}).Error
		})
		assert.Len(t, got, 1)

		got = assertEventsMatchTable(t, db, func() error {
			return db.Clauses(ignore).Create(&[]Account{{Email: "ann@x", Name: "dup"}, {Email: "cid@x", Name: "cid"}, {Email: "bob@x"}, {Email: "dan@x"}}).Error
		})
		assert.Len(t, got, 2)
	})
}

func TestSQLiteInsertOrReplace(t *testing.T) {
	d := dialects[0]
	db := setupAccounts(t, d)
	ann, bob := Account{Email: "ann@x", Name: "ann"}, Account{Email: "bob@x", Name: "bob"}
	require.NoError(t, db.Create(&ann).Error)
	require.NoError(t, db.Create(&bob).Error)
	before := len(loadEvents(t, db))
	// REPLACE deletes the rows the new one conflicts with: bob under his key (replaced), ann under
	// her email (deleted, since the new row has bob's key).
	res := db.Clauses(clause.Insert{Modifier: "OR REPLACE"}).Create(&Account{ID: bob.ID, Email: "ann@x", Name: "merged"})
	require.NoError(t, res.Error)
	assert.EqualValues(t, 1, res.RowsAffected, "as SQLite counts: the row inserted")
	assert.Equal(t, []string{fmt.Sprintf("Account_delete %d", ann.ID), fmt.Sprintf("Account_update %d", bob.ID)},
		eventKeys(t, loadEvents(t, db)[before:]))
	assert.Len(t, accountRows(t, db), 1)
}

func TestInsertModifiersRefused(t *testing.T) {
	d := dialects[0]
	db := setupAccounts(t, d)
	for _, mod := range []string{"OR FAIL", "DEFERRED"} {
		err := db.Clauses(clause.Insert{Modifier: mod}).Create(&Account{Email: mod}).Error
		require.ErrorIs(t, err, outboxplugin.ErrUnsupportedWrite, mod)
		assert.Contains(t, err.Error(), mod)
	}
	assert.Empty(t, accountRows(t, db), "refused before anything was written")
}

func TestConditionalUpsert(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupAccounts(t, d)
		require.NoError(t, db.Create(&[]Account{{Email: "old@x", Name: "old", Ver: 1}, {Email: "new@x", Name: "new", Ver: 9}}).Error)
		// Only a higher version replaces a row. MySQL has no condition on ON DUPLICATE KEY UPDATE
		// (GORM drops it) and updates both: the events follow what the database did either way.
		cond := clause.OnConflict{
			Columns:   []clause.Column{{Name: "email"}},
			DoUpdates: clause.AssignmentColumns([]string{"name", "ver"}),
			Where:     clause.Where{Exprs: []clause.Expression{clause.Expr{SQL: "excluded.ver > accounts.ver"}}},
		}
		got := assertEventsMatchTable(t, db, func() error {
			return db.Clauses(cond).Create(&[]Account{{Email: "old@x", Name: "old2", Ver: 5}, {Email: "new@x", Name: "stale", Ver: 2}, {Email: "fresh@x", Name: "fresh"}}).Error
		})
		if d.server() != "mysql" {
			assert.Len(t, got, 2, "the row the condition kept gets no event")
		}
	})
}

func TestSaveSliceWithZeroKeyPart(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		lines := []OrderLine{{OrderID: 7, LineNo: 0, Qty: 1}, {OrderID: 7, LineNo: 1, Qty: 2}}
		require.NoError(t, db.Save(&lines).Error)
		lines[0].Qty, lines[1].Qty = 10, 20
		require.NoError(t, db.Save(&lines).Error)
		var got []string
		for _, e := range loadEvents(t, db) {
			got = append(got, e.EventType+" "+string(e.Payload))
		}
		assert.Equal(t, []string{
			`OrderLine_create {"order_id":7,"line_no":0}`, `OrderLine_create {"order_id":7,"line_no":1}`,
			`OrderLine_update {"order_id":7,"line_no":0}`, `OrderLine_update {"order_id":7,"line_no":1}`,
		}, sortedLines(got), "a key part that is legitimately zero is a key")
	})
}

// Many goroutines upsert the same few keys at once, each write giving its row a value of its own:
// every committed write has exactly its event, the first for each key a create with the row's key.
func TestConcurrentUpsertsOfTheSameKeys(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupAccounts(t, d)
		const workers, writes, keys = 6, 15, 4
		onEmail := clause.OnConflict{Columns: []clause.Column{{Name: "email"}}, DoUpdates: clause.AssignmentColumns([]string{"name"})}
		var mu sync.Mutex
		committed := map[string]int{}
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < writes; i++ {
					email := fmt.Sprintf("k%d@x", (w+i)%keys)
					err := db.Clauses(onEmail).Create(&Account{Email: email, Name: fmt.Sprintf("w%d-%d", w, i)}).Error
					if err != nil {
						// Lock waits and deadlocks happen between concurrent upserts of one key on
						// MySQL without the plugin too; a write that failed rolled back.
						continue
					}
					mu.Lock()
					committed[email]++
					mu.Unlock()
				}
			}(w)
		}
		wg.Wait()

		var accounts []Account
		require.NoError(t, db.Find(&accounts).Error)
		require.Len(t, accounts, keys)
		events := loadEvents(t, db)
		perKey := map[string][]string{}
		for _, e := range events {
			perKey[e.AggregateID] = append(perKey[e.AggregateID], e.EventType)
		}
		total := 0
		for _, a := range accounts {
			n := committed[a.Email]
			total += n
			got := perKey[fmt.Sprint(a.ID)]
			require.Len(t, got, n, "%s: %d committed writes", a.Email, n)
			assert.Equal(t, "Account_create", got[0], "%s: the first write created the row", a.Email)
			for _, typ := range got[1:] {
				assert.Equal(t, "Account_update", typ, a.Email)
			}
		}
		assert.Len(t, events, total, "no event for a key other than the rows'")
		assert.Greater(t, total, workers*writes/2, "most writes committed")
	})
}

func TestUpdateFrom(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		if d.server() == "mysql" {
			t.Skip("GORM builds no FROM for UPDATE on MySQL")
		}
		t.Run("returning", func(t *testing.T) { testUpdateFrom(t, setupAccounts(t, d)) })
		t.Run("locked", func(t *testing.T) { testUpdateFrom(t, setupLocked(t, d)) })
	})
}

// setupLocked is setupAccounts with updates and deletes by condition run as locked writes.
func setupLocked(t *testing.T, d dialect) *gorm.DB {
	t.Helper()
	db := openDB(t, d, nil)
	resetTables(t, db, captureModels...)
	resetTables(t, db, &Account{}, &Profile{})
	p := outboxplugin.New()
	outboxplugin.UseLockedWrites(p)
	require.NoError(t, db.Use(p))
	return db
}

func testUpdateFrom(t *testing.T, db *gorm.DB) {
	accounts := []Account{{Email: "a@x", Name: "a"}, {Email: "b@x", Name: "b"}, {Email: "c@x", Name: "c"}}
	require.NoError(t, db.Create(&accounts).Error)
	require.NoError(t, db.Create(&[]Profile{{AccountID: accounts[0].ID, Nick: "A", VIP: true}, {AccountID: accounts[1].ID, Nick: "B"}}).Error)
	got := assertEventsMatchTable(t, db, func() error {
		return db.Model(&Account{}).Clauses(clause.From{Tables: []clause.Table{{Name: "profiles"}}}).
			Where("profiles.account_id = accounts.id AND profiles.vip = ?", true).
			Update("name", gorm.Expr("profiles.nick")).Error
	})
	assert.Equal(t, []string{fmt.Sprintf("Account_update %d", accounts[0].ID)}, got)
}

func TestUpdateOrderedAndLimited(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		t.Run("default", func(t *testing.T) { testUpdateOrderedAndLimited(t, setupAccounts(t, d)) })
		t.Run("locked", func(t *testing.T) { testUpdateOrderedAndLimited(t, setupLocked(t, d)) })
	})
}

func testUpdateOrderedAndLimited(t *testing.T, db *gorm.DB) {
	// Ties on the order column: which two rows the limit takes is the database's choice; the
	// events must name the ones it took.
	require.NoError(t, db.Create(&[]Account{{Email: "a@x", Ver: 1}, {Email: "b@x", Ver: 1}, {Email: "c@x", Ver: 1}, {Email: "d@x", Ver: 2}}).Error)
	assertEventsMatchTable(t, db, func() error {
		return db.Model(&Account{}).Where("ver = ?", 1).Order("ver").Limit(2).Update("name", "taken").Error
	})
	assertEventsMatchTable(t, db, func() error {
		return db.Where("ver = ?", 1).Order("ver").Limit(1).Delete(&Account{}).Error
	})
}

func TestScopesAndJoinsInConditions(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		t.Run("default", func(t *testing.T) { testScopesAndJoins(t, setupAccounts(t, d)) })
		t.Run("locked", func(t *testing.T) { testScopesAndJoins(t, setupLocked(t, d)) })
	})
}

func testScopesAndJoins(t *testing.T, db *gorm.DB) {
	accounts := []Account{{Email: "a@x", Ver: 1}, {Email: "b@x", Ver: 2}, {Email: "c@x", Ver: 3}}
	require.NoError(t, db.Create(&accounts).Error)
	require.NoError(t, db.Create(&Profile{AccountID: accounts[1].ID, VIP: true}).Error)
	atLeast := func(v int) func(*gorm.DB) *gorm.DB {
		return func(tx *gorm.DB) *gorm.DB { return tx.Where("ver >= ?", v) }
	}
	assertEventsMatchTable(t, db, func() error {
		return db.Model(&Account{}).Scopes(atLeast(2)).Update("name", "scoped").Error
	})
	assertEventsMatchTable(t, db, func() error {
		return db.Model(&Account{}).Where("id IN (?)", db.Model(&Profile{}).Select("account_id").Where("vip = ?", true)).Update("ver", gorm.Expr("ver + 10")).Error
	})
	assertEventsMatchTable(t, db, func() error {
		return db.Scopes(atLeast(3)).Delete(&Account{}).Error
	})
}

// Row payloads hold what the database stored: not the zero values of a partial model, not an
// expression's input, not an omitted column's Go value.
func TestRowPayloadIsTheStoredRow(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupAccounts(t, d, outboxplugin.WithPayloadMode(outboxplugin.PayloadRow))
		secret := "s3cret"
		a := Account{Email: "ann@x", Name: "a", Ver: 3, Secret: &secret}
		require.NoError(t, db.Omit("secret").Create(&a).Error)
		require.NoError(t, db.Model(&Account{ID: a.ID}).Update("name", "b").Error)
		require.NoError(t, db.Model(&Account{ID: a.ID}).Update("ver", gorm.Expr("ver + ?", 1)).Error)

		evs := loadEvents(t, db)
		require.Len(t, evs, 3)
		for _, e := range evs {
			assert.NotContains(t, string(e.Payload), secret, "an omitted column's value was never stored")
		}
		created := payloadMap(t, evs[0])
		assert.Nil(t, created["secret"], "the omitted column as stored: NULL")
		named := payloadMap(t, evs[1])
		assert.Equal(t, "ann@x", named["email"], "the stored email, not the partial model's empty one")
		assert.Equal(t, "3", fmt.Sprint(named["ver"]))
		assert.Equal(t, "b", named["name"])
		bumped := payloadMap(t, evs[2])
		assert.Equal(t, "4", fmt.Sprint(bumped["ver"]), "the expression's result")
	})
}

func TestChangesPayloadOfAnUpsert(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupAccounts(t, d, outboxplugin.WithPayloadMode(outboxplugin.PayloadChanges))
		secret := "s3cret"
		a := Account{Email: "ann@x", Name: "a", Secret: &secret}
		require.NoError(t, db.Omit("secret").Create(&a).Error)
		require.NoError(t, db.Clauses(clause.OnConflict{UpdateAll: true}).Create(&Account{ID: a.ID, Email: "ann@x", Name: "z", Ver: 7}).Error)
		evs := loadEvents(t, db)
		require.Len(t, evs, 2)
		created := payloadMap(t, evs[0])
		assert.NotContains(t, created, "secret", "an omitted column was not assigned")
		assert.Equal(t, "a", created["name"])
		upserted := payloadMap(t, evs[1])
		assert.Equal(t, "Account_update", evs[1].EventType)
		assert.Equal(t, "z", upserted["name"], "every column the upsert updated")
		assert.Equal(t, "7", fmt.Sprint(upserted["ver"]))
		assert.Equal(t, fmt.Sprint(a.ID), fmt.Sprint(upserted["id"]))
	})
}

// Timestamps carry the precision the database stored; a hard delete after a soft delete carries the
// stored deleted_at.
func TestStoredTimestamps(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil, outboxplugin.WithPayloadMode(outboxplugin.PayloadRow))
		u := SoftUser{Name: "s"}
		require.NoError(t, db.Create(&u).Error)
		require.NoError(t, db.Delete(&u).Error)
		require.NoError(t, db.Unscoped().Delete(&SoftUser{ID: u.ID}).Error)

		evs := loadEvents(t, db)
		require.Len(t, evs, 3)
		soft := payloadMap(t, evs[1])
		hard := payloadMap(t, evs[2])
		require.NotNil(t, soft["deleted_at"])
		assert.Equal(t, soft["deleted_at"], hard["deleted_at"], "the hard delete carries the deleted_at the soft delete stored")
		_, err := time.Parse(time.RFC3339Nano, fmt.Sprint(hard["deleted_at"]))
		require.NoError(t, err)
		digits := 0
		if _, frac, ok := strings.Cut(fmt.Sprint(hard["deleted_at"]), "."); ok {
			digits = len(strings.TrimRight(frac, "Z"))
		}
		switch d.server() {
		case "postgres":
			assert.LessOrEqual(t, digits, 6, "microseconds, as PostgreSQL stores them")
		case "mysql":
			assert.LessOrEqual(t, digits, 3, "milliseconds, GORM's datetime(3) on MySQL")
		}
		assert.True(t, strings.HasSuffix(fmt.Sprint(hard["deleted_at"]), "Z"), "in UTC")
	})
}

// The same event has the same JSON text on every database.
func TestPayloadTextIsTheSameOnEveryDatabase(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupAccounts(t, d, outboxplugin.WithPayloadMode(outboxplugin.PayloadChanges))
		require.NoError(t, db.Create(&Account{Email: "ann@x", Name: "Ann <&> \u00e9", Ver: 2}).Error)
		evs := loadEvents(t, db)
		require.Len(t, evs, 1)
		assert.Equal(t, `{"id":1,"email":"ann@x","name":"Ann \u003c\u0026\u003e é","ver":2,"secret":null}`, string(evs[0].Payload))
	})
}

func TestTableWritesOfAKnownModel(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupAccounts(t, d) // migrated: GORM knows the model of "accounts"
		got := assertEventsMatchTable(t, db, func() error {
			return db.Table("accounts").Create(map[string]any{"email": "t@x", "name": "t"}).Error
		})
		require.Len(t, got, 1)
		assertEventsMatchTable(t, db, func() error {
			return db.Table("accounts").Create([]map[string]any{{"email": "u@x", "name": "u"}, {"email": "v@x", "name": "v"}}).Error
		})
		assertEventsMatchTable(t, db, func() error {
			return db.Table("accounts").Where("email = ?", "t@x").Updates(map[string]any{"name": "t2"}).Error
		})
		assertEventsMatchTable(t, db, func() error {
			return db.Table("accounts").Where("email = ?", "u@x").Delete(map[string]any{}).Error
		})
	})
}

func TestTableWritesOfAnUnknownTable(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		looseTable := func(db *gorm.DB) *gorm.DB {
			plain := db.Session(&gorm.Session{NewDB: true})
			require.NoError(t, plain.Exec("DROP TABLE IF EXISTS loose_rows").Error)
			require.NoError(t, plain.Exec("CREATE TABLE loose_rows (id integer PRIMARY KEY, note varchar(32))").Error)
			t.Cleanup(func() { plain.Exec("DROP TABLE IF EXISTS loose_rows") })
			return plain
		}
		db := setup(t, d, nil)
		looseTable(db)
		require.NoError(t, db.Table("loose_rows").Create(map[string]any{"id": 1, "note": "n"}).Error)
		assert.Empty(t, loadEvents(t, db), "no model maps to the table: not captured, as documented")

		strict := setup(t, d, nil, outboxplugin.WithStrictTables())
		plain := looseTable(strict)
		err := strict.Table("loose_rows").Create(map[string]any{"id": 2, "note": "n"}).Error
		require.ErrorIs(t, err, outboxplugin.ErrUnknownTable)
		assert.Contains(t, err.Error(), "loose_rows")
		var n int64
		require.NoError(t, plain.Table("loose_rows").Count(&n).Error)
		assert.Zero(t, n, "the refused write wrote nothing")
		require.NoError(t, strict.Create(&User{Name: "typed"}).Error, "writes with a model go on")
		require.NoError(t, strict.Table("users").Create(map[string]any{"name": "mapped"}).Error, "and so do Table writes of a known model")
		assert.Len(t, loadEvents(t, strict), 2)
	})
}

// An outbox table that earlier versions created with jsonb columns keeps them through AutoMigrate
// (changing the type would rewrite the table under an exclusive lock), and the plugin writes to it.
// The test has a table of its own: pgx caches statements per connection, and a column that changes
// type under a cached statement fails it.
func TestPostgresJSONBOutboxKeepsItsType(t *testing.T) {
	const table = "outbox_jsonb"
	db := openDB(t, dialects[1], nil)
	resetTables(t, db, &OrderLine{})
	plain := db.Session(&gorm.Session{NewDB: true})
	require.NoError(t, plain.Migrator().DropTable(table))
	t.Cleanup(func() { plain.Migrator().DropTable(table) })
	require.NoError(t, db.Use(outboxplugin.New(outboxplugin.WithTableName(table))))
	require.NoError(t, outboxplugin.AutoMigrate(db))
	columnType := func(column string) string {
		var typ string
		require.NoError(t, plain.Raw(`SELECT data_type FROM information_schema.columns WHERE table_name = ? AND column_name = ?`, table, column).Scan(&typ).Error)
		return typ
	}
	assert.Equal(t, "json", columnType("payload"), "new tables keep the text as written")
	require.NoError(t, plain.Exec(`ALTER TABLE `+table+` ALTER COLUMN payload TYPE jsonb, ALTER COLUMN headers TYPE jsonb`).Error)
	require.NoError(t, outboxplugin.AutoMigrate(db))
	assert.Equal(t, "jsonb", columnType("payload"))
	assert.Equal(t, "jsonb", columnType("headers"))
	require.NoError(t, db.Create(&[]OrderLine{{OrderID: 1, LineNo: 1}, {OrderID: 1, LineNo: 2}}).Error)
	var payloads []string
	require.NoError(t, plain.Raw(`SELECT payload::text FROM `+table+` ORDER BY id`).Scan(&payloads).Error)
	assert.Equal(t, []string{`{"line_no": 1, "order_id": 1}`, `{"line_no": 2, "order_id": 1}`}, payloads, "jsonb's own text")
}

// A RETURNING of the application's own still hands it the rows it asked for, and the events are
// those of the rows written.
func TestApplicationReturningClauses(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		if d.name == "mysql_noreturning" {
			t.Skip("GORM builds no RETURNING for this dialector")
		}
		db := setupAccounts(t, d)
		require.NoError(t, db.Create(&[]Account{{Email: "a@x", Ver: 1}, {Email: "b@x", Ver: 2}, {Email: "c@x", Ver: 3}}).Error)
		var deleted []Account
		got := assertEventsMatchTable(t, db, func() error {
			return db.Clauses(clause.Returning{}).Where("ver >= ?", 2).Delete(&deleted).Error
		})
		assert.Len(t, got, 2)
		require.Len(t, deleted, 2, "GORM read the deleted rows back")
		assert.ElementsMatch(t, []string{"b@x", "c@x"}, []string{deleted[0].Email, deleted[1].Email})
		if d.server() == "mysql" {
			return // MariaDB has no UPDATE … RETURNING (which a soft delete is)
		}
		// A soft delete is an UPDATE; GORM builds it with the RETURNING asked for.
		require.NoError(t, db.Create(&[]SoftUser{{Name: "s1"}, {Name: "s2"}}).Error)
		before := len(loadEvents(t, db))
		var gone []SoftUser
		require.NoError(t, db.Clauses(clause.Returning{}).Where("name IN ?", []string{"s1", "s2"}).Delete(&gone).Error)
		require.Len(t, gone, 2)
		assert.True(t, gone[0].DeletedAt.Valid, "GORM read the soft-deleted rows back")
		assert.Equal(t, want("SoftUser_delete", gone[0].ID, gone[1].ID), eventKeys(t, loadEvents(t, db)[before:]))

		var updated []Account
		got = assertEventsMatchTable(t, db, func() error {
			return db.Model(&updated).Clauses(clause.Returning{Columns: []clause.Column{{Name: "name"}, {Name: "ver"}}}).
				Where("ver = ?", 1).Update("name", "renamed").Error
		})
		assert.Len(t, got, 1)
		require.Len(t, updated, 1)
		assert.Equal(t, "renamed", updated[0].Name)
	})
}

// Upserts of maps: the keys come from the database all the same.
func TestUpsertOfMaps(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setupAccounts(t, d)
		require.NoError(t, db.Create(&Account{Email: "a@x", Name: "a"}).Error)
		onEmail := clause.OnConflict{Columns: []clause.Column{{Name: "email"}}, DoUpdates: clause.AssignmentColumns([]string{"name"})}
		got := assertEventsMatchTable(t, db, func() error {
			return db.Model(&Account{}).Clauses(onEmail).Create(map[string]any{"email": "a@x", "name": "a2"}).Error
		})
		assert.Len(t, got, 1)
		assertEventsMatchTable(t, db, func() error {
			// A pointer: GORM cannot scan RETURNING into a []map passed by value, plugin or not.
			return db.Model(&Account{}).Clauses(onEmail).Create(&[]map[string]any{{"email": "a@x", "name": "a3"}, {"email": "n@x", "name": "n"}}).Error
		})
	})
}
