package outboxplugin_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
)

// On MySQL the relay writes the arguments of its statements into their text, so that go-sql-driver
// sends one query instead of preparing a statement: integers, booleans, NULL, plain strings, and times
// when the driver sends them in UTC. Anything else, or a statement it cannot read for certain, goes
// as it was.
func TestMySQLRelayWritesArgumentsAsLiterals(t *testing.T) {
	db := setup(t, dialects[2], nil)
	w := newWorker(t, db, newRecorder())
	at := time.Date(2026, 7, 1, 12, 30, 45, 123456789, time.UTC)
	for _, c := range []struct {
		name  string
		query string
		args  []any
		want  string // "" : left as it was
	}{
		{"integers, booleans, NULL, a time", "UPDATE t SET a = ?, b = ?, c = ? WHERE id IN (?,?) AND at < ?",
			[]any{int64(7), true, nil, int64(1), 2, at}, "UPDATE t SET a = 7, b = TRUE, c = NULL WHERE id IN (1,2) AND at < '2026-07-01 12:30:45.123456'"},
		{"a placeholder inside a quoted literal is text", "SELECT CASE WHEN x THEN 'why?' ELSE ? END",
			[]any{"host-12-ab.c"}, "SELECT CASE WHEN x THEN 'why?' ELSE 'host-12-ab.c' END"},
		{"a string with a quote", "SELECT ?", []any{"o'clock"}, ""},
		{"a string with a backslash", "SELECT ?", []any{`a\b`}, ""},
		{"an error text", "SELECT ?", []any{"connection refused"}, ""},
		{"a type it does not write", "SELECT ?", []any{1.5}, ""},
		{"a query with a backslash", `SELECT 'a\'', ?`, []any{int64(1)}, ""},
		{"fewer arguments than placeholders", "SELECT ?, ?", []any{int64(1)}, ""},
		{"more arguments than placeholders", "SELECT ?", []any{int64(1), int64(2)}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			q, args := outboxplugin.RelayLiteral(w, c.query, c.args...)
			if c.want == "" {
				assert.Equal(t, c.query, q)
				assert.Equal(t, c.args, args)
				return
			}
			assert.Equal(t, c.want, q)
			assert.Empty(t, args)
		})
	}
}

// With a driver that sends times in another zone (loc in the DSN), the relay passes times as
// arguments, and relays exactly as before: the retry and lease times it writes read back as the
// driver wrote them.
func TestMySQLRelayKeepsTimesOfADriverInAnotherZone(t *testing.T) {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Skipf("no zone data: %v", err)
	}
	setup(t, dialects[2], nil) // the tables, in the test database
	require.NotEmpty(t, myDSN)
	pool, err := sql.Open("mysql", myDSN+"&loc=Asia%2FTokyo")
	require.NoError(t, err)
	defer pool.Close()
	db, err := gorm.Open(mysql.New(mysql.Config{Conn: pool}), &gorm.Config{})
	require.NoError(t, err)
	require.NoError(t, db.Use(outboxplugin.New()))

	w := newWorker(t, db, newRecorder())
	at := time.Date(2026, 7, 1, 12, 30, 45, 0, time.UTC)
	q, args := outboxplugin.RelayLiteral(w, "SELECT ?, ?", int64(1), at)
	assert.Equal(t, "SELECT ?, ?", q, "a time is not written as a UTC literal")
	assert.Len(t, args, 2)

	for range 3 {
		require.NoError(t, db.Create(&User{Name: "tokyo"}).Error)
	}
	before := time.Now()
	n, err := w.ProcessOnce(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	var stored []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&stored).Error)
	require.Len(t, stored, 3)
	for _, e := range stored {
		require.True(t, e.Processed)
		require.NotNil(t, e.ProcessedAt)
		assert.WithinDuration(t, before, *e.ProcessedAt, time.Minute, "read through the same driver: %v", e.ProcessedAt.In(tokyo))
	}
}
