package outboxredis_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
)

// A login Redis refuses (an ACL user that does not exist: WRONGPASS) is a configuration error: the
// start check says so, naming the server and not the password, and the worker's batches spend no
// attempt and its Health names the cause.
func TestWrongPassword(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := streamPrefix(t)
	newClient(t, redisAddr) // skips or fails without Redis
	password := "wrong-" + prefix[len(prefix)-13:len(prefix)-1]
	client := redis.NewClient(&redis.Options{Addr: redisAddr, Username: "outboxtest-nobody", Password: password,
		ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	pub := newPublisher(t, client, prefixed(prefix))

	err := pub.Check(ctx)
	require.ErrorIs(t, err, outboxplugin.ErrMisconfigured)
	assert.ErrorContains(t, err, "WRONGPASS")
	assert.ErrorContains(t, err, redisAddr)
	assert.NotContains(t, err.Error(), password)

	db := openDB(t)
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		return outboxplugin.Emit(tx, "Placed", map[string]int{"n": 1}, outboxplugin.WithAggregate("Order", "1"))
	}))
	w := mustWorker(t, db, pub, outboxplugin.WithoutListen(), outboxplugin.WithMaxAttempts(1),
		outboxplugin.WithLogger(slog.New(slog.DiscardHandler)))
	for range 3 {
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Find(&rows).Error)
	require.Len(t, rows, 1)
	assert.Zero(t, rows[0].Attempts, "no attempt spent")
	assert.Nil(t, rows[0].DeadAt, "not dead")
	assert.ErrorIs(t, w.Health(), outboxplugin.ErrMisconfigured)
}

// A stream key that holds another type is a configuration error, found by the start check of
// WithCheckStreams and at publish; once the key is freed, the events go out on their first attempt
// and Health is nil again.
func TestStreamKeyOfAnotherType(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := streamPrefix(t)
	client := newClient(t, redisAddr)
	key := prefix + "events"
	require.NoError(t, client.Set(ctx, key, "not a stream", 0).Err())
	pub := newPublisher(t, client, outboxredis.WithStream(func(outboxplugin.Message) string { return key }),
		outboxredis.WithCheckStreams(key))
	err := pub.Check(ctx)
	require.ErrorIs(t, err, outboxplugin.ErrMisconfigured)
	assert.ErrorContains(t, err, key)
	assert.ErrorContains(t, err, redisAddr)

	db := openDB(t)
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		for range 3 {
			if err := outboxplugin.Emit(tx, "Placed", map[string]int{"n": 1}); err != nil {
				return err
			}
		}
		return nil
	}))
	w := mustWorker(t, db, pub, outboxplugin.WithoutListen(), outboxplugin.WithMaxAttempts(2),
		outboxplugin.WithLogger(slog.New(slog.DiscardHandler)))
	for range 3 {
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
	}
	var rows []outboxplugin.OutboxEvent
	require.NoError(t, db.Find(&rows).Error)
	for _, r := range rows {
		assert.Zero(t, r.Attempts)
		assert.Nil(t, r.DeadAt)
	}
	require.ErrorIs(t, w.Health(), outboxplugin.ErrMisconfigured)

	require.NoError(t, client.Del(ctx, key).Err())
	require.NoError(t, pub.Check(ctx))
	n, err := w.ProcessOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.NoError(t, w.Health())
	assert.Len(t, readStream(t, client, key), 3)
}
