package outboxplugin_test

// Reliability suite, bad input (docs/reliability.md): each bad input gets a clear error and leaves
// nothing half-written — never a business row without its event, never an event without its row —
// or, where the code accepts it, the relay publishes what was stored, intact. What other files
// already cover is not repeated here: unencodable payloads (badinput_test.go), Emit's refusals
// (emit_test.go), the plugin's options (options_test.go), the worker's options
// (worker_test.go: TestWorkerInvalidOptions).

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// BigDoc carries a text column large enough for multi-megabyte rows.
type BigDoc struct {
	ID   uint
	Body string
}

// assertUTF8JSON fails unless b is one JSON document in valid UTF-8: what a consumer in any language
// can parse.
func assertUTF8JSON(t *testing.T, b []byte, what string) {
	t.Helper()
	assert.True(t, utf8.Valid(b) && json.Valid(b), "%s: not UTF-8 JSON: %.200q", what, b)
}

// relayAll publishes every pending event with one worker and returns what it published, in order.
func relayAll(t *testing.T, db *gorm.DB, want int) []outboxplugin.Message {
	t.Helper()
	rec := newRecorder()
	n, err := newWorker(t, db, rec, outboxplugin.WithBatchSize(1000)).ProcessOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, want, n, "events published")
	msgs := rec.published()
	for _, m := range msgs {
		assertUTF8JSON(t, m.Payload, m.EventType)
	}
	return msgs
}

// decodeField reads one string member of a JSON payload.
func decodeField(t *testing.T, payload []byte, name string) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(payload, &m), "%.200s", payload)
	s, _ := m[name].(string)
	return s
}

// A 10 MB row and a 10 MB explicit event are written on every database and published intact. On
// MySQL/MariaDB an event larger than max_allowed_packet is refused by the server: the error says so
// and the write rolls back whole, its business row included.
func TestTenMegabytePayload(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil, outboxplugin.WithPayloadMode(outboxplugin.PayloadRow))
		resetTables(t, db, &BigDoc{})
		body := strings.Repeat("0123456789abcdef", 10<<20/16) // 10 MiB, ASCII: stored as it is

		doc := BigDoc{Body: body}
		require.NoError(t, db.Create(&doc).Error, "10 MB row through capture")
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "BigEmitted", map[string]string{"body": body})
		}), "10 MB payload through Emit")

		msgs := relayAll(t, db, 2)
		assert.Equal(t, "BigDoc_create", msgs[0].EventType)
		assert.Equal(t, body, decodeField(t, msgs[0].Payload, "body"), "captured 10 MB body published intact")
		assert.Equal(t, "BigEmitted", msgs[1].EventType)
		assert.Equal(t, body, decodeField(t, msgs[1].Payload, "body"), "emitted 10 MB body published intact")
		for _, e := range loadEvents(t, db) {
			assert.True(t, e.Processed, "marked after publishing")
		}

		if d.server() != "mysql" {
			return
		}
		var maxPacket int
		require.NoError(t, db.Raw("SELECT @@max_allowed_packet").Scan(&maxPacket).Error)
		if maxPacket > 64<<20 {
			t.Skipf("max_allowed_packet is %d bytes: too large to exceed in a test", maxPacket)
		}
		before := len(loadEvents(t, db))

		// The server answers a packet over max_allowed_packet with error 1153 and closes the
		// connection; the driver reports the error, or the closed connection ("invalid connection",
		// or "bad connection" when the reset reaches it while writing), whichever it meets first.
		tooLarge := `max_allowed_packet|invalid connection|bad connection`
		// '<' takes 6 bytes in JSON (\u003c): the row fits in a packet, its event does not.
		escaped := BigDoc{Body: strings.Repeat("<", maxPacket/6+64<<10)}
		err := db.Create(&escaped).Error
		require.Error(t, err, "an event larger than max_allowed_packet (%d bytes)", maxPacket)
		assert.Regexp(t, tooLarge, err.Error())
		assert.Contains(t, err.Error(), "outboxplugin: create BigDoc: insert into outbox_events", "the error names the plugin's step")
		assert.EqualValues(t, 1, count(t, db, &BigDoc{}), "the business row rolled back with its event")

		err = db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&BigDoc{Body: "small"}).Error; err != nil {
				return err
			}
			return outboxplugin.Emit(tx, "TooBig", map[string]string{"body": strings.Repeat("x", maxPacket)})
		})
		require.Error(t, err)
		assert.Regexp(t, tooLarge, err.Error())
		assert.EqualValues(t, 1, count(t, db, &BigDoc{}), "the transaction rolled back whole")
		assert.Len(t, loadEvents(t, db), before, "no event written")

		require.NoError(t, db.Create(&BigDoc{Body: "after"}).Error, "the pool recovers from the dropped connection")
	})
}

// inputCase is a write with bad input. Accepted writes must be relayed, valid UTF-8 JSON, with what
// check expects; refused ones must fail with the error given and change nothing.
type inputCase struct {
	name  string
	write func(tx *gorm.DB) error
	// refusedOn maps a dialect ("*" for all) to a substring of the expected error; absent: accepted.
	refusedOn map[string]string
	is        error // an error the refusal must wrap (checked with errors.Is), if any
	events    int   // events an accepted write adds
	check     func(t *testing.T, msgs []outboxplugin.Message)
}

// withUser prefixes a write with a captured business row, so that a refusal after it must roll it
// back.
func withUser(name string, fn func(tx *gorm.DB) error) func(tx *gorm.DB) error {
	return func(tx *gorm.DB) error {
		if err := tx.Create(&User{Name: name}).Error; err != nil {
			return err
		}
		return fn(tx)
	}
}

// Invalid UTF-8 and NUL bytes in captured columns, in Emit's payload, headers, type and aggregate,
// and in hand-written outbox rows. The rules the code follows, asserted here:
//   - strings encoded by the plugin (captured columns, Emit payload values, headers) are coerced to
//     valid UTF-8, each invalid byte replaced by U+FFFD (encoding/json's rule);
//   - raw JSON (json.RawMessage, JSON, []byte, OutboxEvent.Payload) must be valid UTF-8 JSON and is
//     refused with ErrInvalidJSON before anything reaches the database;
//   - text columns are the database's business: PostgreSQL refuses invalid UTF-8 and NUL, MySQL
//     refuses invalid UTF-8 (strict mode), SQLite stores any bytes — and the relay publishes them;
//   - \u0000 (a NUL encoded in JSON) is stored and published intact everywhere: PostgreSQL's json
//     column keeps the text (jsonb, which earlier tables may still have, refuses it with "unsupported
//     Unicode escape sequence", and the transaction rolls back).
func TestInvalidUTF8AndNULInput(t *testing.T) {
	bad := "a\xffb"
	replaced := "a\ufffdb"
	nul := "a\x00b"
	cases := []inputCase{
		{
			name:      "captured column with invalid UTF-8",
			write:     func(tx *gorm.DB) error { return tx.Create(&User{Name: bad}).Error },
			refusedOn: map[string]string{"postgres": `invalid byte sequence for encoding "UTF8": 0xff`, "mysql": "Incorrect string value"},
			events:    1,
			check: func(t *testing.T, msgs []outboxplugin.Message) {
				assert.Equal(t, replaced, decodeField(t, msgs[0].Payload, "name"))
			},
		},
		{
			name:      "captured column with NUL",
			write:     func(tx *gorm.DB) error { return tx.Create(&User{Name: nul}).Error },
			refusedOn: map[string]string{"postgres": `invalid byte sequence for encoding "UTF8": 0x00`},
			events:    1,
			check: func(t *testing.T, msgs []outboxplugin.Message) {
				assert.Equal(t, nul, decodeField(t, msgs[0].Payload, "name"))
			},
		},
		{
			name: "Emit payload with invalid UTF-8",
			write: withUser("emit-bad-payload", func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Bad", map[string]string{"s": bad})
			}),
			events: 2,
			check: func(t *testing.T, msgs []outboxplugin.Message) {
				assert.Equal(t, replaced, decodeField(t, msgs[1].Payload, "s"))
			},
		},
		{
			name: "Emit headers with invalid UTF-8",
			write: withUser("emit-bad-header", func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Bad", nil, outboxplugin.WithHeaders(map[string]string{"h" + bad: bad}))
			}),
			events: 2,
			check: func(t *testing.T, msgs []outboxplugin.Message) {
				assert.Equal(t, map[string]string{"h" + replaced: replaced}, msgs[1].Headers)
			},
		},
		{
			name: "Emit raw JSON with invalid UTF-8",
			write: withUser("emit-raw", func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Raw", json.RawMessage(`{"s":"`+bad+`"}`))
			}),
			refusedOn: map[string]string{"*": "invalid JSON"},
			is:        outboxplugin.ErrInvalidJSON,
		},
		{
			// Refused before any statement: on PostgreSQL a failed statement would abort the
			// transaction, and the caller could not go on.
			name: "transaction usable after a refused raw payload",
			write: func(tx *gorm.DB) error {
				if err := outboxplugin.Emit(tx, "Raw", []byte(bad)); !errors.Is(err, outboxplugin.ErrInvalidJSON) {
					return fmt.Errorf("want ErrInvalidJSON, got %v", err)
				}
				return tx.Create(&User{Name: "after-refusal"}).Error
			},
			events: 1,
		},
		{
			name: "Emit payload with NUL",
			write: withUser("emit-nul", func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Nul", map[string]string{"s": nul})
			}),
			events: 2,
			check: func(t *testing.T, msgs []outboxplugin.Message) {
				assert.Equal(t, nul, decodeField(t, msgs[1].Payload, "s"))
			},
		},
		{
			name: "Emit header with NUL",
			write: withUser("emit-nul-header", func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Nul", nil, outboxplugin.WithHeaders(map[string]string{"h": nul}))
			}),
			events: 2,
			check: func(t *testing.T, msgs []outboxplugin.Message) {
				assert.Equal(t, map[string]string{"h": nul}, msgs[1].Headers)
			},
		},
		{
			name: "Emit event type with invalid UTF-8",
			write: withUser("emit-bad-type", func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Type"+bad, nil)
			}),
			refusedOn: map[string]string{"postgres": "0xff", "mysql": "Incorrect string value"},
			events:    2,
			check: func(t *testing.T, msgs []outboxplugin.Message) {
				assert.Equal(t, "Type"+bad, msgs[1].EventType, "stored and published as written")
				_, event := outboxplugin.RouteTokens(msgs[1])
				assert.Equal(t, "Typea_b", event, "routing names never carry the bad byte")
			},
		},
		{
			name: "Emit aggregate with invalid UTF-8 and NUL",
			write: withUser("emit-bad-aggregate", func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Agg", nil, outboxplugin.WithAggregate("Acc"+bad, "1"+nul))
			}),
			refusedOn: map[string]string{"postgres": "invalid byte sequence", "mysql": "Incorrect string value"},
			events:    2,
			check: func(t *testing.T, msgs []outboxplugin.Message) {
				assert.Equal(t, "Acc"+bad+":1"+nul, msgs[1].Key, "stored and published as written")
			},
		},
		{
			name: "hand-written row with invalid UTF-8 payload",
			write: withUser("hand-payload", func(tx *gorm.DB) error {
				return tx.Create(&outboxplugin.OutboxEvent{EventType: "Hand", Payload: outboxplugin.JSON(`"` + bad + `"`)}).Error
			}),
			refusedOn: map[string]string{"*": "payload: invalid JSON"},
			is:        outboxplugin.ErrInvalidJSON,
		},
		{
			// The relay reads headers as a map of strings: such a row, once committed, would fail
			// every claim that reaches it.
			name: "hand-written row with headers that are not strings",
			write: withUser("hand-headers", func(tx *gorm.DB) error {
				return tx.Create(&outboxplugin.OutboxEvent{EventType: "Hand", Payload: outboxplugin.JSON(`{}`), Headers: outboxplugin.JSON(`{"retries":3}`)}).Error
			}),
			refusedOn: map[string]string{"*": "headers must be a JSON object of strings"},
			is:        outboxplugin.ErrInvalidJSON,
		},
		{
			name: "hand-written row with headers that are not an object",
			write: withUser("hand-headers-array", func(tx *gorm.DB) error {
				return tx.Create(&outboxplugin.OutboxEvent{EventType: "Hand", Payload: outboxplugin.JSON(`{}`), Headers: outboxplugin.JSON(`["a"]`)}).Error
			}),
			refusedOn: map[string]string{"*": "headers must be a JSON object of strings"},
			is:        outboxplugin.ErrInvalidJSON,
		},
	}
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil, outboxplugin.WithPayloadMode(outboxplugin.PayloadRow))
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				users, events := count(t, db, &User{}), len(loadEvents(t, db))
				err := db.Transaction(c.write)
				want, refused := c.refusedOn[d.name]
				if !refused {
					want, refused = c.refusedOn["*"]
				}
				if refused {
					require.Error(t, err, "refused on %s", d.name)
					assert.Contains(t, err.Error(), want)
					if c.is != nil {
						assert.ErrorIs(t, err, c.is)
					}
					assert.Equal(t, users, count(t, db, &User{}), "no business row")
					assert.Len(t, loadEvents(t, db), events, "no event")
					return
				}
				require.NoError(t, err, "accepted on %s", d.name)
				require.Len(t, loadEvents(t, db), events+c.events)
				msgs := relayAll(t, db, c.events)
				if c.check != nil {
					c.check(t, msgs)
				}
			})
		}
	})
}

// panicOrError runs fn and returns its error, or the panic it raised as an error.
func panicOrError(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn()
}

// Nil and zero-value models: GORM's own refusals stay refusals with nothing written (GORM panics on
// db.Create(nil) and on a nil map, with or without the plugin: inside a transaction that rolls back
// whole), and a zero value that GORM does write — a row with a generated key, or with zero keys of
// its own — has exactly one event with that key.
func TestNilAndZeroValueModels(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		refusals := []struct {
			name  string
			write func(tx *gorm.DB) error
			is    error // nil: any error or panic
		}{
			{"Create(nil)", func(tx *gorm.DB) error { return tx.Create(nil).Error }, nil},
			{"Create(typed nil pointer)", func(tx *gorm.DB) error { var u *User; return tx.Create(u).Error }, gorm.ErrInvalidValue},
			{"Create(nil slice)", func(tx *gorm.DB) error { var us []User; return tx.Create(&us).Error }, gorm.ErrEmptySlice},
			{"Create(empty slice)", func(tx *gorm.DB) error { return tx.Create(&[]User{}).Error }, gorm.ErrEmptySlice},
			{"Create(slice with a nil element)", func(tx *gorm.DB) error { return tx.Create(&[]*User{nil, {Name: "x"}}).Error }, nil},
			{"Create(nil map)", func(tx *gorm.DB) error { return tx.Model(&User{}).Create(map[string]any(nil)).Error }, nil},
			{"Create(empty map slice)", func(tx *gorm.DB) error { return tx.Model(&User{}).Create([]map[string]any{}).Error }, gorm.ErrEmptySlice},
			{"Save(empty slice)", func(tx *gorm.DB) error { return tx.Save(&[]User{}).Error }, gorm.ErrEmptySlice},
			{"Delete(nil)", func(tx *gorm.DB) error { return tx.Delete(nil).Error }, nil},
			{"Delete(zero value)", func(tx *gorm.DB) error { return tx.Delete(&User{}).Error }, gorm.ErrMissingWhereClause},
			{"Delete(nil slice)", func(tx *gorm.DB) error { var us []User; return tx.Delete(&us).Error }, gorm.ErrMissingWhereClause},
			{"Update on zero value", func(tx *gorm.DB) error { return tx.Model(&User{}).Update("name", "z").Error }, gorm.ErrMissingWhereClause},
		}
		existing := User{Name: "existing"}
		require.NoError(t, db.Create(&existing).Error)
		for _, r := range refusals {
			t.Run(r.name, func(t *testing.T) {
				users, events := count(t, db, &User{}), len(loadEvents(t, db))
				err := panicOrError(func() error {
					return db.Transaction(withUser("before-"+r.name, r.write))
				})
				require.Error(t, err)
				if r.is != nil {
					assert.ErrorIs(t, err, r.is)
				}
				assert.Equal(t, users, count(t, db, &User{}), "rolled back whole, the row before it included")
				assert.Len(t, loadEvents(t, db), events)
			})
		}

		before := len(loadEvents(t, db))
		zero := User{}
		require.NoError(t, db.Create(&zero).Error)
		require.NotZero(t, zero.ID)
		saved := User{}
		require.NoError(t, db.Save(&saved).Error, "Save of a zero value inserts")
		line := OrderLine{} // a composite key of its own, both parts zero: a valid key
		require.NoError(t, db.Create(&line).Error)
		lang := Language{} // a string key, empty
		require.NoError(t, db.Create(&lang).Error)
		require.NoError(t, db.Model(&existing).Updates(User{}).Error, "zero-value Updates: only updated_at")

		evs := loadEvents(t, db)[before:]
		require.Len(t, evs, 5, "one event per row written")
		got := make([]string, len(evs))
		for i, e := range evs {
			got[i] = e.EventType + " " + e.AggregateID + " " + canonicalJSON(t, e.Payload)
		}
		assert.Equal(t, []string{
			fmt.Sprintf(`User_create %d {"id":%d}`, zero.ID, zero.ID),
			fmt.Sprintf(`User_create %d {"id":%d}`, saved.ID, saved.ID),
			`OrderLine_create [0,0] {"line_no":0,"order_id":0}`,
			`Language_create  {"code":""}`,
			fmt.Sprintf(`User_update %d {"id":%d}`, existing.ID, existing.ID),
		}, got)
		msgs := relayAll(t, db, len(loadEvents(t, db)))
		assert.Equal(t, "Language:", msgs[len(msgs)-2].Key, "an empty key value still names its aggregate")
	})
}

// canonicalJSON re-encodes a document compactly with sorted keys: PostgreSQL's jsonb and MySQL's json
// hand documents back in their own spacing and order.
func canonicalJSON(t *testing.T, doc []byte) string {
	t.Helper()
	return strings.TrimPrefix(normalizeJSON(t, []string{"_ " + string(doc)})[0], "_ ")
}

// injectionNames are outbox table names that try to break out of an identifier.
var injectionNames = []string{
	"x; DROP TABLE users --",
	"x; DROP TABLE users; --",
	`x"; DROP TABLE users; --`,
	"x`; DROP TABLE users; --",
	"x'); DROP TABLE users; --",
	"users --",
	"users\n",
	"outbox events",
	"outbøx",
	"public.",
	".users",
	"a..b",
	strings.Repeat("t", 64),
	"",
}

// An outbox table name that tries SQL injection is refused by the plugin, the worker and AutoMigrate — with
// ErrInvalidTableName, which is also an ErrInvalidOption but for AutoMigrate — before any SQL runs: the business table
// and the outbox keep their rows. Names that are valid but need quoting (reserved words) are quoted
// everywhere the plugin and the worker write them.
func TestOutboxTableNameInjection(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&[]User{{Name: "a"}, {Name: "b"}}).Error)
		for _, name := range injectionNames {
			t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
				other := openDB(t, d, nil)
				err := other.Use(outboxplugin.New(outboxplugin.WithTableName(name)))
				assert.ErrorIs(t, err, outboxplugin.ErrInvalidTableName)
				assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)

				w, err := outboxplugin.NewWorker(db, newRecorder(), outboxplugin.WithTable(name))
				assert.Nil(t, w)
				assert.ErrorIs(t, err, outboxplugin.ErrInvalidTableName)
				assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)

				if name != "" { // db.Table("") names no table: AutoMigrate takes the default
					assert.ErrorIs(t, outboxplugin.AutoMigrate(db.Table(name)), outboxplugin.ErrInvalidTableName)
				}
			})
		}
		assert.True(t, db.Migrator().HasTable(&User{}))
		assert.EqualValues(t, 2, count(t, db, &User{}), "the business table is untouched")
		assert.Len(t, loadEvents(t, db), 2, "the outbox is untouched")

	})
}

// A reserved word is a valid outbox table name ("order"): the plugin, AutoMigrate and the worker quote
// it in every statement they run, per-key ordering's index and cleanup included.
func TestReservedWordTableName(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := openDB(t, d, nil)
		resetTables(t, db, captureModels...)
		require.NoError(t, db.Migrator().DropTable("order"))
		t.Cleanup(func() {
			if err := db.Migrator().DropTable("order"); err != nil {
				t.Errorf("drop table: %v", err)
			}
		})
		require.NoError(t, db.Use(outboxplugin.New(outboxplugin.WithTableName("order"))))
		require.NoError(t, outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()))

		require.NoError(t, db.Create(&User{Name: "kw"}).Error)
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Placed", map[string]int{"n": 1}, outboxplugin.WithAggregate("Order", "1"))
		}))
		var stored int64
		require.NoError(t, db.Table("order").Count(&stored).Error)
		assert.EqualValues(t, 2, stored)
		assert.Empty(t, loadEvents(t, db), "nothing in the default table")

		ctx := context.Background()
		rec := newRecorder()
		w := newWorker(t, db, rec, outboxplugin.WithKeyOrdering())
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		_, err = w.RequeueAllDead(ctx)
		require.NoError(t, err)
		removed, err := w.Cleanup(ctx, 0)
		require.NoError(t, err)
		assert.EqualValues(t, 2, removed)
	})
}

// A schema-qualified outbox table on PostgreSQL ("<schema>.events"): AutoMigrate creates it in that
// schema, whether the name comes from the plugin or from db.Table (where GORM keeps only "events" in
// Statement.Table), and the plugin, the worker and the Admin all use it, not a table of that name in
// the search path.
func TestSchemaQualifiedTableName(t *testing.T) {
	var d dialect
	for _, c := range relayDialects() {
		if c.name == "postgres" {
			d = c
		}
	}
	require.Equal(t, "postgres", d.name)
	db := openDB(t, d, nil)
	schema := testName("schema")
	require.NoError(t, db.Exec(`CREATE SCHEMA `+schema).Error)
	t.Cleanup(func() {
		if err := db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`).Error; err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	table := schema + ".events"
	inSchema := func(name string) bool {
		var n int64
		require.NoError(t, db.Raw(`SELECT COUNT(*) FROM pg_tables WHERE schemaname = ? AND tablename = ?`, schema, name).Scan(&n).Error)
		return n == 1
	}

	require.NoError(t, outboxplugin.AutoMigrate(db.Table(schema+".other")))
	assert.True(t, inSchema("other"), "AutoMigrate(db.Table(schema.other)) created it in the schema")

	resetTables(t, db, captureModels...)
	require.NoError(t, db.Use(outboxplugin.New(outboxplugin.WithTableName(table))))
	require.NoError(t, outboxplugin.AutoMigrate(db))
	require.True(t, inSchema("events"))
	require.NoError(t, db.Create(&User{Name: "schema"}).Error)
	assert.Empty(t, loadEvents(t, db), "nothing in the default table")

	ctx := context.Background()
	adm, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable(table))
	require.NoError(t, err)
	st, err := adm.Stats(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, st.Pending)

	rec := newRecorder()
	n, err := newWorker(t, db, rec, outboxplugin.WithTable(table)).ProcessOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, 1, rec.distinct())
}

// Options the worker refuses that TestWorkerInvalidOptions does not list, each checked on every
// method (RequeueDead included), and the boundaries that are accepted.
func TestWorkerOptionBoundaries(t *testing.T) {
	db := setup(t, dialects[0], nil)
	require.NoError(t, db.Create(&User{Name: "a"}).Error)
	ctx := context.Background()
	pub := newRecorder()
	refused := map[string][]outboxplugin.WorkerOption{
		"batch size 10001":         {outboxplugin.WithBatchSize(10001)},
		"batch size -1":            {outboxplugin.WithBatchSize(-1)},
		"negative poll":            {outboxplugin.WithPollInterval(-time.Second)},
		"zero publish timeout":     {outboxplugin.WithPublishTimeout(0)},
		"zero lease":               {outboxplugin.WithLease(0)},
		"lease below the minimum":  {outboxplugin.WithLease(outboxplugin.MinLease - time.Millisecond)},
		"zero cleanup interval":    {outboxplugin.WithCleanup(0)},
		"negative retention":       {outboxplugin.WithRetention(-time.Hour)},
		"zero backlog interval":    {outboxplugin.WithBacklogInterval(0)},
		"negative health interval": {outboxplugin.WithTableHealthInterval(-time.Minute)},
		"max attempts -1":          {outboxplugin.WithMaxAttempts(-1)},
		"second option invalid":    {outboxplugin.WithBatchSize(5), outboxplugin.WithMaxAttempts(0)},
	}
	for name, opts := range refused {
		t.Run(name, func(t *testing.T) {
			w, err := outboxplugin.NewWorker(db, pub, opts...)
			assert.Nil(t, w)
			assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption)
			assert.ErrorContains(t, err, "outboxplugin: NewWorker")
		})
	}
	assert.Empty(t, pub.published(), "a refused worker publishes nothing")
	assert.Empty(t, loadEvents(t, db)[0].LeaseOwner(), "nor claims anything")

	accepted := map[string][]outboxplugin.WorkerOption{
		"batch size 1":                {outboxplugin.WithBatchSize(1)},
		"batch size 10000":            {outboxplugin.WithBatchSize(10000)},
		"minimum lease, long publish": {outboxplugin.WithLease(outboxplugin.MinLease), outboxplugin.WithPublishTimeout(time.Minute)},
		"max attempts 1":              {outboxplugin.WithMaxAttempts(1)},
		"nil option skipped":          {nil},
	}
	for name, opts := range accepted {
		t.Run(name, func(t *testing.T) {
			_, err := newWorker(t, db, pub, opts...).ProcessOnce(ctx)
			require.NoError(t, err)
		})
	}
	_, err := newWorker(t, db, pub).Cleanup(ctx, -time.Second)
	assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption, "a negative cleanup age")
	require.NoError(t, openDB(t, dialects[0], nil).Use(outboxplugin.New(nil)), "a nil plugin option is skipped")
}

// Without an outbox table the worker fails clearly — every method names the table — and does not
// panic; Run fails at once, saying what to run, instead of logging a failed claim every few seconds.
func TestWorkerWithoutOutboxTable(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Migrator().DropTable(&outboxplugin.OutboxEvent{}))
		ctx := context.Background()
		w := newWorker(t, db, newRecorder())
		_, err := w.ProcessOnce(ctx)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "outboxplugin: claim")
		assert.Contains(t, err.Error(), "outbox_events")
		_, err = w.Cleanup(ctx, time.Hour)
		assert.ErrorContains(t, err, "outbox_events")
		_, err = w.RequeueDead(ctx, "x")
		assert.ErrorContains(t, err, "outbox_events")
		_, err = w.RequeueAllDead(ctx)
		assert.ErrorContains(t, err, "outbox_events")
		_, err = newWorker(t, db, newRecorder(), outboxplugin.WithKeyOrdering()).ProcessOnce(ctx)
		assert.ErrorContains(t, err, "outbox_events") // from the key index (MySQL, SQLite) or the claim

		runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = w.Run(runCtx)
		require.Error(t, err, "Run fails fast")
		assert.NoError(t, runCtx.Err(), "at once, not when its context ends")
		assert.ErrorContains(t, err, "outbox_events")
		assert.ErrorContains(t, err, "AutoMigrate")

		// Once the table exists, a Run publishes.
		require.NoError(t, db.AutoMigrate(&outboxplugin.OutboxEvent{}))
		require.NoError(t, db.Create(&User{Name: "after"}).Error)
		rec := newRecorder()
		stop := runWorkers(t, 1, func() *outboxplugin.Worker {
			return newWorker(t, db, rec, outboxplugin.WithPollInterval(10*time.Millisecond))
		})
		require.Eventually(t, func() bool { return rec.distinct() == 1 }, 10*time.Second, 10*time.Millisecond,
			"published once the table exists")
		stop()
	})
}

// An outbox table of the wrong shape: capture fails with the database's error naming the column and
// rolls the business row back; the worker reports the error and leaves the rows as they were. SQLite
// has no column types to get wrong (any column stores any value): there the wrongly typed tables work.
func TestWrongOutboxSchema(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		plain := db.Session(&gorm.Session{NewDB: true})
		ctx := context.Background()
		recreate := func(t *testing.T) {
			t.Helper()
			require.NoError(t, plain.Migrator().DropTable(&outboxplugin.OutboxEvent{}))
			require.NoError(t, plain.AutoMigrate(&outboxplugin.OutboxEvent{}))
		}
		retype := func(t *testing.T, column, sqlType string) {
			t.Helper()
			recreate(t)
			require.NoError(t, plain.Migrator().DropColumn(&outboxplugin.OutboxEvent{}, column))
			require.NoError(t, plain.Exec("ALTER TABLE outbox_events ADD COLUMN "+column+" "+sqlType).Error)
			if !plain.Migrator().HasIndex(&outboxplugin.OutboxEvent{}, "idx_outbox_events_claim") {
				// SQLite drops a column by copying the table, without its indexes.
				require.NoError(t, plain.Migrator().CreateIndex(&outboxplugin.OutboxEvent{}, "idx_outbox_events_claim"))
			}
			dropIdleConnections(t, db)
		}
		t.Cleanup(func() { dropIdleConnections(t, db) })

		t.Run("missing columns", func(t *testing.T) {
			require.NoError(t, plain.Migrator().DropTable(&outboxplugin.OutboxEvent{}))
			require.NoError(t, plain.Exec("CREATE TABLE outbox_events (id bigint PRIMARY KEY, event_type varchar(255), payload text)").Error)
			users := count(t, db, &User{})
			err := db.Create(&User{Name: "lost?"}).Error
			require.Error(t, err)
			assert.Contains(t, err.Error(), "outboxplugin: create User: insert into outbox_events")
			assert.Contains(t, err.Error(), "message_id")
			assert.Equal(t, users, count(t, db, &User{}), "no business row without its event")
			err = db.Transaction(func(tx *gorm.DB) error { return outboxplugin.Emit(tx, "E", nil) })
			assert.ErrorContains(t, err, "message_id")

			require.NoError(t, plain.Exec("INSERT INTO outbox_events (id, event_type, payload) VALUES (1, 'Old', '{}')").Error)
			_, err = newWorker(t, db, newRecorder()).ProcessOnce(ctx)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "outboxplugin: claim")
			assert.Regexp(t, `processed|message_id|locked_by|aggregate_type`, err.Error(), "names a missing column")
			err = newWorker(t, db, newRecorder()).Run(ctx)
			require.Error(t, err, "Run fails fast")
			assert.Regexp(t, `processed|message_id|locked_by|attempts`, err.Error(), "names a missing column")
			assert.ErrorContains(t, err, "AutoMigrate")
		})

		t.Run("payload column of the wrong type", func(t *testing.T) {
			retype(t, "payload", "integer")
			users := count(t, db, &User{})
			err := db.Create(&User{Name: "typed"}).Error
			if d.name == "sqlite" {
				require.NoError(t, err)
				msgs := relayAll(t, db, 1)
				assert.JSONEq(t, fmt.Sprintf(`{"id":%d}`, users+1), string(msgs[0].Payload), "stored as text and published intact")
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "outboxplugin: create User: insert into outbox_events")
			assert.Contains(t, err.Error(), "payload")
			assert.Equal(t, users, count(t, db, &User{}), "rolled back")
			assert.Empty(t, loadEvents(t, db))
		})

		t.Run("lease column of the wrong type", func(t *testing.T) {
			retype(t, "locked_until", "integer")
			require.NoError(t, db.Create(&[]User{{Name: "x"}, {Name: "y"}}).Error, "capture does not write the lease")
			rec := newRecorder()
			n, err := newWorker(t, db, rec).ProcessOnce(ctx)
			if d.name == "sqlite" {
				require.NoError(t, err)
				assert.Equal(t, 2, n)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "outboxplugin: claim")
			assert.Regexp(t, `locked_until|integer`, err.Error())
			assert.Empty(t, rec.published())
			for _, e := range loadEvents(t, db) {
				assert.False(t, e.Processed)
				assert.Empty(t, e.LeaseOwner(), "the failed claim leased nothing")
				assert.Zero(t, e.Attempts, "and counted no attempt")
			}
		})
		recreate(t)
	})
}

// dropIdleConnections closes the pool's idle connections. pgx caches prepared statements per
// connection, and PostgreSQL refuses to run a cached SELECT * whose result columns changed
// ("cached plan must not change result type"): after a test changes the outbox's columns, other
// tests must not inherit those caches.
func dropIdleConnections(t *testing.T, db *gorm.DB) {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxIdleConns(0)
	sqlDB.SetMaxIdleConns(2) // database/sql's default
}

// midWriteCanceller is a callback placed in GORM's create chain at a given point, before the commit:
// when armed, it records what the transaction holds so far and cancels the call's context, so that
// the rest of the call runs with its context cancelled.
type midWriteCanceller struct {
	mu          sync.Mutex
	cancel      context.CancelFunc
	users, evts int // rows the transaction held when it cancelled
}

func (c *midWriteCanceller) arm(cancel context.CancelFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancel, c.users, c.evts = cancel, -1, -1
}

func (c *midWriteCanceller) callback(db *gorm.DB) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel == nil || db.Statement.Schema == nil || db.Statement.Schema.Table != "users" {
		return
	}
	pool := db.Statement.ConnPool // the transaction
	_ = pool.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM users").Scan(&c.users)
	_ = pool.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM outbox_events").Scan(&c.evts)
	c.cancel()
	c.cancel = nil
}

// A context cancelled in the middle of a write — after the business INSERT and before its events are
// made, or after they are handed to the transaction (which holds them until commit) and before the
// commit, in GORM's transaction or in the plugin's own (SkipDefaultTransaction) — fails the call with
// the context's error, and neither the row nor its event is committed. Random deadlines over a large write keep rows and events equal: one event per
// committed row.
func TestContextCancelledDuringWrite(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		// Registered with Before only (see callbacks.go): after the business INSERT, before the
		// plugin's; and after the plugin's, before the commit.
		afterRow, afterEvent := &midWriteCanceller{}, &midWriteCanceller{}
		require.NoError(t, db.Callback().Create().Before("outbox:after_create").Register("test:cancel_after_row", afterRow.callback))
		require.NoError(t, db.Callback().Create().Before("outbox:commit").Register("test:cancel_after_event", afterEvent.callback))
		for _, c := range []struct {
			name      string
			at        *midWriteCanceller
			skip      bool
			wantEvent int // events in the outbox table when cancelled
		}{
			{"after the business insert", afterRow, false, 0},
			{"after the events are held", afterEvent, false, 0},
			{"after the business insert, plugin's transaction", afterRow, true, 0},
			{"after the events are held, plugin's transaction", afterEvent, true, 0},
		} {
			t.Run(c.name, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				c.at.arm(cancel)
				tx := db.WithContext(ctx)
				if c.skip {
					tx = tx.Session(&gorm.Session{SkipDefaultTransaction: true})
				}
				err := tx.Create(&User{Name: "cancelled"}).Error
				require.Error(t, err)
				assert.True(t, errors.Is(err, context.Canceled) || errors.Is(err, sql.ErrTxDone), "the context's error: %v", err)
				assert.Equal(t, 1, c.at.users, "cancelled with the business row written")
				assert.Equal(t, c.wantEvent, c.at.evts, "cancelled with this many events written")
				assert.Zero(t, count(t, db, &User{}), "no business row committed")
				assert.Empty(t, loadEvents(t, db), "no event committed")
			})
		}

		// Random deadlines across a write of 200 rows in one transaction.
		batch := func(tag string) []User {
			users := make([]User, 200)
			for i := range users {
				users[i] = User{Name: fmt.Sprint(tag, i)}
			}
			return users
		}
		start := time.Now()
		calibrate := batch("calibrate")
		require.NoError(t, db.CreateInBatches(&calibrate, 100).Error)
		full := time.Since(start)
		cut := 0
		const writes = 10
		for i := range writes {
			users := batch(fmt.Sprint("r", i, "-"))
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.Int64N(int64(full/2)+1)))
			if db.WithContext(ctx).CreateInBatches(&users, 100).Error != nil {
				cut++
			}
			cancel()
		}
		t.Logf("%d of %d writes cut by their deadline (a full write takes %v)", cut, writes, full)
		assert.Positive(t, cut, "deadlines under half a write cut some writes")
		var ids []string
		require.NoError(t, db.Model(&User{}).Order("id").Pluck("id", &ids).Error)
		var aggIDs []string
		for _, e := range loadEvents(t, db) {
			require.Equal(t, "User_create", e.EventType)
			aggIDs = append(aggIDs, e.AggregateID)
		}
		assert.Equal(t, ids, aggIDs, "one event per committed row, none for a cut write")
	})
}

// A batch cut short by its context: what the publisher confirmed is marked done, the rest is handed
// back unmarked — no lease, the attempt not counted, no error recorded — and published by the next
// batch; a context already ended claims nothing.
func TestContextCancelledDuringBatch(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		assertHandedBack := func(t *testing.T, e outboxplugin.OutboxEvent) {
			t.Helper()
			assert.False(t, e.Processed, "event %d not marked", e.ID)
			assert.Empty(t, e.LeaseOwner(), "event %d: lease cleared", e.ID)
			assert.Nil(t, e.LockedUntil)
			assert.Zero(t, e.Attempts, "event %d: the interrupted attempt is not counted", e.ID)
			assert.Nil(t, e.LastError)
			assert.Nil(t, e.NextAttemptAt, "event %d: due at once", e.ID)
		}

		t.Run("already cancelled", func(t *testing.T) {
			resetTables(t, db, captureModels...)
			require.NoError(t, db.Create(&User{Name: "a"}).Error)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			called := false
			_, err := newWorker(t, db, outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error {
				called = true
				return nil
			})).ProcessOnce(ctx)
			assert.ErrorIs(t, err, context.Canceled)
			assert.False(t, called, "nothing published")
			assertHandedBack(t, loadEvents(t, db)[0])
		})

		t.Run("publisher confirms part, then the context ends", func(t *testing.T) {
			resetTables(t, db, captureModels...)
			require.NoError(t, db.Create(&[]User{{Name: "1"}, {Name: "2"}, {Name: "3"}, {Name: "4"}, {Name: "5"}}).Error)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			partial := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
				cancel() // the worker is stopping while the broker has taken the first two
				<-ctx.Done()
				failed := map[string]error{}
				for _, m := range msgs[2:] {
					failed[m.ID] = ctx.Err()
				}
				return outboxplugin.FailedMessages(failed)
			})
			n, err := newWorker(t, db, partial).ProcessOnce(ctx)
			require.NoError(t, err)
			assert.Equal(t, 2, n)
			evs := loadEvents(t, db)
			for _, e := range evs[:2] {
				assert.True(t, e.Processed, "confirmed before the end: marked")
			}
			for _, e := range evs[2:] {
				assertHandedBack(t, e)
			}
			rec := newRecorder()
			n, err = newWorker(t, db, rec).ProcessOnce(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 3, n, "the handed-back events go out with the next batch")
			for i, m := range rec.published() {
				assert.Equal(t, evs[2+i].MessageID, m.ID)
				assert.Equal(t, 1, m.Attempt, "their first counted delivery")
			}
		})

		t.Run("publisher blocks until the context ends", func(t *testing.T) {
			resetTables(t, db, captureModels...)
			require.NoError(t, db.Create(&[]User{{Name: "1"}, {Name: "2"}, {Name: "3"}}).Error)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			blocking := outboxplugin.PublisherFunc(func(ctx context.Context, _ []outboxplugin.Message) error {
				time.AfterFunc(20*time.Millisecond, cancel)
				<-ctx.Done()
				return ctx.Err()
			})
			n, err := newWorker(t, db, blocking).ProcessOnce(ctx)
			require.NoError(t, err)
			assert.Zero(t, n)
			for _, e := range loadEvents(t, db) {
				assertHandedBack(t, e)
			}
		})

		t.Run("publisher accepts everything although the context ended", func(t *testing.T) {
			resetTables(t, db, captureModels...)
			require.NoError(t, db.Create(&[]User{{Name: "1"}, {Name: "2"}}).Error)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			n, err := newWorker(t, db, outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error {
				cancel()
				return nil // the broker took the batch: its word is final
			})).ProcessOnce(ctx)
			require.NoError(t, err)
			assert.Equal(t, 2, n)
			for _, e := range loadEvents(t, db) {
				assert.True(t, e.Processed, "marked with a context of its own")
				assert.Empty(t, e.LeaseOwner())
			}
		})
	})
}

// A worker that started before its table existed finds it once it does, also when its name has
// capitals; it runs no DDL: the storage settings are AutoMigrate's to give (PostgreSQL).
func TestWorkerPreparesTableCreatedAfterItStarted(t *testing.T) {
	d := dialects[1]
	if _, err := d.pool(); err != nil {
		if requireDBs() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	db := openDB(t, d, nil)
	const table = "OutboxLater"
	plain := db.Session(&gorm.Session{NewDB: true})
	require.NoError(t, plain.Migrator().DropTable(table))
	t.Cleanup(func() {
		if err := plain.Migrator().DropTable(table); err != nil {
			t.Errorf("drop table: %v", err)
		}
	})
	w := newWorker(t, db, newRecorder(), outboxplugin.WithTable(table))
	_, err := w.ProcessOnce(context.Background())
	require.Error(t, err, "no table yet")

	require.NoError(t, plain.Table(table).AutoMigrate(&outboxplugin.OutboxEvent{}))
	_, err = w.ProcessOnce(context.Background())
	require.NoError(t, err)
	options := func() string {
		var s string
		require.NoError(t, plain.Raw(`SELECT COALESCE(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = to_regclass('"OutboxLater"')`).Scan(&s).Error)
		return s
	}
	assert.Empty(t, options(), "the worker alters nothing")
	require.NoError(t, outboxplugin.AutoMigrate(plain.Table(table)))
	assert.Contains(t, options(), "fillfactor=50")
	assert.Contains(t, options(), "autovacuum_vacuum_threshold=10000")
}
