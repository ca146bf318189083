package outboxnats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
)

// A subject no stream captures — the stream not created yet, the classic deploy-order mistake — is a
// configuration error, not a refusal: the start check says so, naming the subject and the server;
// however many batches fail, the events spend no attempt and none dies, and the worker's Health names
// the cause. Once the stream exists, the check passes, the events go out on their first attempt and
// Health is nil again.
func TestNoStreamForTheSubject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, js := connect(t, natsURL(), nil)
	// A top-level token of its own: no stream of another test or user captures it.
	prefix := "cfg" + suffix()
	_, err := js.StreamNameBySubject(ctx, prefix+".>")
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound, "no stream may capture the test's subjects yet")
	pub, err := outboxnats.New(js, outboxnats.WithSubject(func(m outboxplugin.Message) string { return prefix + "." + m.EventType }),
		outboxnats.WithCheckSubjects(prefix+".>"))
	require.NoError(t, err)

	err = pub.Check(ctx)
	require.ErrorIs(t, err, outboxplugin.ErrMisconfigured)
	assert.Contains(t, err.Error(), prefix+".>", "names the subject")
	assert.Contains(t, err.Error(), "127.0.0.1:4222", "names the server")

	db := openDB(t)
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		for range 5 {
			if err := outboxplugin.Emit(tx, "Placed", map[string]int{"n": 1}); err != nil {
				return err
			}
		}
		return nil
	}))
	w := mustWorker(t, db, pub, outboxplugin.WithoutListen(), outboxplugin.WithMaxAttempts(2))
	for range 3 { // more rounds than attempts
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Order("id").Find(&rows).Error)
	require.Len(t, rows, 5)
	for _, r := range rows {
		assert.False(t, r.Processed)
		assert.Nil(t, r.DeadAt, "not dead")
		assert.Zero(t, r.Attempts, "no attempt spent")
	}
	health := w.Health()
	require.ErrorIs(t, health, outboxplugin.ErrMisconfigured)
	assert.Contains(t, health.Error(), `subject "`+prefix+`.Placed"`)
	assert.Contains(t, health.Error(), "127.0.0.1:4222")

	stream := newStream(t, js, prefix+".>")
	require.NoError(t, pub.Check(ctx))
	n, err := w.ProcessOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, 5, n)
	assert.NoError(t, w.Health())
	require.NoError(t, db.Order("id").Find(&rows).Error)
	for _, r := range rows {
		assert.True(t, r.Processed)
		assert.Equal(t, 1, r.Attempts, "published on its first attempt")
	}
	readStream(t, stream, 5)
}

// The start check of WithExpectedStream fails, as a configuration error naming the stream, while the
// stream does not exist; and a message the named stream does not capture is a configuration error.
func TestExpectedStreamMissing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js := connect(t, natsURL(), nil)
	prefix := "cfg" + suffix()
	newStream(t, js, prefix+".>")
	missing := "OUTBOXTEST_MISSING_" + suffix()
	pub, err := outboxnats.New(js, outboxnats.WithSubject(func(m outboxplugin.Message) string { return prefix + "." + m.EventType }),
		outboxnats.WithExpectedStream(missing))
	require.NoError(t, err)
	err = pub.Check(ctx)
	require.ErrorIs(t, err, outboxplugin.ErrMisconfigured)
	assert.Contains(t, err.Error(), missing)

	msgs := []outboxplugin.Message{message("Placed", "Order", "1", `{}`)}
	err = pub.Publish(ctx, msgs)
	var perr *outboxplugin.PublishError
	require.True(t, errors.As(err, &perr), "%v", err)
	assert.ErrorIs(t, perr.Failed[msgs[0].ID], outboxplugin.ErrMisconfigured)
	assert.Contains(t, perr.Failed[msgs[0].ID].Error(), missing)
}
