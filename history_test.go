package outboxplugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// refuser is a publisher that takes pause to refuse every message, with the error errFor gives it.
func refuser(pause time.Duration, errFor func(m outboxplugin.Message) error) outboxplugin.Publisher {
	return outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
		time.Sleep(pause)
		failed := map[string]error{}
		for _, m := range msgs {
			failed[m.ID] = errFor(m)
		}
		return outboxplugin.FailedMessages(failed)
	})
}

// noWait retries a refused event at once.
var noWait = outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: time.Millisecond, Max: time.Millisecond})

// history returns the event's failure history as the Admin shows it.
func history(t *testing.T, db *gorm.DB, messageID string) []outboxplugin.Attempt {
	t.Helper()
	adm, err := outboxplugin.NewAdmin(db)
	require.NoError(t, err)
	e, err := adm.Event(context.Background(), messageID)
	require.NoError(t, err)
	return e.History
}

// failOnce runs one ProcessOnce of w once the event's retry is due, and checks it spent an attempt.
func failOnce(t *testing.T, db *gorm.DB, w *outboxplugin.Worker, messageID string) {
	t.Helper()
	before := outboxRow(t, db, messageID).Attempts
	time.Sleep(5 * time.Millisecond) // past the 1 ms back-off
	n, err := w.ProcessOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, before+1, outboxRow(t, db, messageID).Attempts, "the attempt was made")
}

func numbers(h []outboxplugin.Attempt) []int {
	out := make([]int, len(h))
	for i, a := range h {
		out[i] = a.Number
	}
	return out
}

// Each refused attempt appends an entry to the event's history — when, the worker, the publisher's
// error, how long the publish took — and the history keeps the last N (WithAttemptHistory), oldest
// first, through to the event's death; the Admin reads it with the event.
func TestAttemptHistoryKeepsTheLastFailedAttempts(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&User{Name: "poison"}).Error)
		id := loadEvents(t, db)[0].MessageID
		assert.Nil(t, loadEvents(t, db)[0].AttemptHistory, "NULL until the first failure")
		assert.Nil(t, history(t, db, id))

		const pause = 20 * time.Millisecond
		pub := refuser(pause, func(m outboxplugin.Message) error { return fmt.Errorf("refused at attempt %d", m.Attempt) })
		w := newWorker(t, db, pub, outboxplugin.WithMaxAttempts(5), outboxplugin.WithAttemptHistory(3), noWait)
		for attempt := 1; attempt <= 5; attempt++ {
			before := time.Now()
			failOnce(t, db, w, id)
			h := history(t, db, id)
			var want []int
			for n := max(1, attempt-2); n <= attempt; n++ {
				want = append(want, n)
			}
			require.Equal(t, want, numbers(h), "after attempt %d: the last three, oldest first", attempt)
			last := h[len(h)-1]
			assert.Equal(t, w.Owner(), last.Worker)
			assert.Equal(t, fmt.Sprintf("refused at attempt %d", attempt), last.Error)
			assert.False(t, last.Unfinished())
			assert.GreaterOrEqual(t, last.Duration, pause, "the publish's time")
			assert.Less(t, last.Duration, 10*time.Second)
			assert.False(t, last.At.Before(before), "recorded after the attempt started")
			assert.WithinDuration(t, time.Now(), last.At, 10*time.Second)
			for i := 1; i < len(h); i++ {
				assert.True(t, h[i].At.After(h[i-1].At), "oldest first")
			}
		}
		e := outboxRow(t, db, id)
		require.NotNil(t, e.DeadAt, "dead after its fifth attempt")
		stored, err := e.AttemptHistory.Attempts()
		require.NoError(t, err)
		assert.Equal(t, history(t, db, id), stored, "OutboxEvent.AttemptHistory decodes to what the Admin shows")

		adm, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		page, err := adm.ListEvents(context.Background(), outboxplugin.EventFilter{State: outboxplugin.StateDead})
		require.NoError(t, err)
		require.Len(t, page.Events, 1)
		assert.Equal(t, []int{3, 4, 5}, numbers(page.Events[0].History), "listings carry the history too")
	})
}

// An error text of a megabyte — of multi-byte characters, quotes, control characters and NULs —
// leaves an entry of at most MaxAttemptErrorBytes (JSON-escaped), cut on a rune boundary with a marker,
// and a history of N such entries stays within N times the bound of an entry.
func TestAttemptHistoryIsBoundedWhateverTheErrorTexts(t *testing.T) {
	texts := map[string]string{
		"ascii":    strings.Repeat("x", 1<<20),
		"mixed":    "a" + strings.Repeat("é\"\\\x00\x01\n<€", 1<<20/14),
		"escapes":  strings.Repeat("\x02", 1<<20),
		"too long": strings.Repeat("y", outboxplugin.MaxAttemptErrorBytes+1),
	}
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		for name, text := range texts {
			t.Run(name, func(t *testing.T) {
				resetTables(t, db, &outboxplugin.OutboxEvent{})
				require.NoError(t, db.Create(&User{Name: "loud"}).Error)
				id := loadEvents(t, db)[0].MessageID
				const n = 4
				pub := refuser(0, func(outboxplugin.Message) error { return fmt.Errorf("%s", text) })
				w := newWorker(t, db, pub, outboxplugin.WithAttemptHistory(n), noWait)
				for range n + 2 {
					failOnce(t, db, w, id)
				}
				h := history(t, db, id)
				require.Len(t, h, n)
				for _, a := range h {
					var escaped bytes.Buffer
					enc := json.NewEncoder(&escaped)
					enc.SetEscapeHTML(false) // as the databases write it
					require.NoError(t, enc.Encode(a.Error))
					assert.LessOrEqual(t, escaped.Len()-len("\"\"\n"), outboxplugin.MaxAttemptErrorBytes, "the error as stored")
					assert.True(t, utf8.ValidString(a.Error))
					assert.Contains(t, a.Error, fmt.Sprintf("[cut: %d bytes in all]", len(text)))
					assert.NotContains(t, a.Error, "\x00", "no NUL, which PostgreSQL's jsonb refuses")
				}
				stored := outboxRow(t, db, id).AttemptHistory
				assert.LessOrEqual(t, len(stored), n*(outboxplugin.MaxAttemptErrorBytes+256), "the column: %d bytes", len(stored))
				// The last error too is bounded, and valid text for the database to store.
				le := outboxRow(t, db, id).LastError
				require.NotNil(t, le)
				assert.LessOrEqual(t, len(*le), 2000)
				assert.True(t, utf8.ValidString(*le))
			})
		}
	})
}

// A delivery that never recorded an outcome — its relay crashed holding the lease — becomes an entry
// when another relay takes the event over: the crashed relay's id, when its lease ran out, its attempt
// number, and no duration. The history outlives the event's publication.
func TestAttemptHistoryRecordsADeliveryThatDidNotFinish(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&User{Name: "a"}).Error)
		id := loadEvents(t, db)[0].MessageID
		expired := time.Now().UTC().Add(-2 * time.Second).Truncate(time.Millisecond)
		// As a claim left the row: leased, its attempt counted, and the relay gone.
		require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("message_id = ?", id).
			Updates(map[string]any{"locked_by": "crashed-relay-7", "locked_until": expired, "attempts": 1}).Error)

		rec := newRecorder()
		n, err := newWorker(t, db, rec).ProcessOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n, "published by the relay that took it over")

		h := history(t, db, id)
		require.Len(t, h, 1)
		a := h[0]
		assert.True(t, a.Unfinished(), "error %q", a.Error)
		assert.Equal(t, "crashed-relay-7", a.Worker)
		assert.Equal(t, 1, a.Number)
		assert.WithinDuration(t, expired, a.At, time.Millisecond, "when the lease ran out")
		assert.Zero(t, a.Duration, "nobody saw it end")
		e := outboxRow(t, db, id)
		assert.True(t, e.Processed)
		assert.Equal(t, 2, e.Attempts)
	})
}

// Requeueing keeps the history — by the Worker and by the Admin — and the attempts after it continue
// it, numbered from 1 again. A worker keeping fewer entries than a row has trims it to its own N.
func TestAttemptHistorySurvivesRequeue(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Create(&User{Name: "poison"}).Error)
		id := loadEvents(t, db)[0].MessageID
		pub := refuser(0, func(m outboxplugin.Message) error { return fmt.Errorf("no (%d)", m.Attempt) })
		w := newWorker(t, db, pub, outboxplugin.WithMaxAttempts(2), noWait)
		ctx := context.Background()
		failOnce(t, db, w, id)
		failOnce(t, db, w, id)
		require.NotNil(t, outboxRow(t, db, id).DeadAt)
		dead := history(t, db, id)
		require.Equal(t, []int{1, 2}, numbers(dead))

		n, err := w.RequeueDead(ctx, id)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		assert.Equal(t, dead, history(t, db, id), "Worker.RequeueDead keeps the history")
		failOnce(t, db, w, id)
		failOnce(t, db, w, id)
		require.Equal(t, []int{1, 2, 1, 2}, numbers(history(t, db, id)), "numbered from 1 after the requeue")

		adm, err := outboxplugin.NewAdmin(db)
		require.NoError(t, err)
		before := history(t, db, id)
		n, err = adm.Requeue(ctx, id)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		assert.Equal(t, before, history(t, db, id), "Admin.Requeue keeps the history")

		short := newWorker(t, db, pub, outboxplugin.WithMaxAttempts(2), outboxplugin.WithAttemptHistory(2), noWait)
		failOnce(t, db, short, id)
		h := history(t, db, id)
		assert.Equal(t, []int{2, 1}, numbers(h), "trimmed to the worker's 2")
		assert.Equal(t, before[3], h[0])
	})
}

// WithAttemptHistory(0) writes no history, and lets a worker run on a table of an earlier version
// without the column; a worker that keeps one refuses that table, naming AutoMigrate, which adds the
// column to it.
func TestAttemptHistoryOffAndTheTableOfAnEarlierVersion(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, outboxplugin.AutoMigrate(db))
		require.NoError(t, db.Create(&User{Name: "a"}).Error)
		id := loadEvents(t, db)[0].MessageID
		pub := refuser(0, func(outboxplugin.Message) error { return fmt.Errorf("no") })
		failOnce(t, db, newWorker(t, db, pub, outboxplugin.WithAttemptHistory(0), noWait), id)
		assert.Nil(t, outboxRow(t, db, id).AttemptHistory, "none written")
		assert.Nil(t, history(t, db, id))

		plain := db.Session(&gorm.Session{NewDB: true})
		require.NoError(t, plain.Exec(`ALTER TABLE outbox_events DROP COLUMN attempt_history`).Error)
		require.NoError(t, db.Create(&User{Name: "b"}).Error)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := newWorker(t, db, newRecorder()).Run(ctx)
		require.Error(t, err, "Run refuses the table at once")
		assert.ErrorContains(t, err, "AutoMigrate")
		require.NoError(t, ctx.Err())

		time.Sleep(5 * time.Millisecond)
		rec := newRecorder()
		n, err := newWorker(t, db, rec, outboxplugin.WithAttemptHistory(0)).ProcessOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 2, n, "a worker without a history publishes from the old table")

		require.NoError(t, outboxplugin.AutoMigrate(db))
		assert.True(t, plain.Migrator().HasColumn(&outboxplugin.OutboxEvent{}, "attempt_history"))
		assert.Nil(t, history(t, db, id), "rows of before the column have none")
		require.NoError(t, db.Create(&User{Name: "c"}).Error)
		last := loadEvents(t, db)[2].MessageID
		failOnce(t, db, newWorker(t, db, pub, noWait), last)
		assert.Len(t, history(t, db, last), 1, "and the migrated table keeps one")
	})
}

func TestWithAttemptHistoryIsValidated(t *testing.T) {
	db := openDB(t, dialects[0], nil)
	for _, n := range []int{-1, outboxplugin.MaxAttemptHistory + 1} {
		w, err := outboxplugin.NewWorker(db, newRecorder(), outboxplugin.WithAttemptHistory(n))
		assert.Nil(t, w)
		assert.ErrorIs(t, err, outboxplugin.ErrInvalidOption, "n = %d", n)
	}
	for _, n := range []int{0, 1, outboxplugin.MaxAttemptHistory} {
		_, err := outboxplugin.NewWorker(db, newRecorder(), outboxplugin.WithAttemptHistory(n))
		assert.NoError(t, err, "n = %d", n)
	}
}
