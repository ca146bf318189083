package outboxkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	outboxkafka "github.com/gorm-outbox/outboxplugin/publishers/kafka"
)

// A topic that does not exist (kfake, with no automatic topic creation) is a configuration error: the
// start check says so, naming the topic and the brokers; the worker's batches spend no attempt and
// kill no event, and its Health names the cause. Once the topic exists, the events go out on their
// first attempt and Health is nil again.
func TestUnknownTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cluster := newCluster(t, nil)
	topic := "missing-" + suffix(t)
	client := newProducer(t, cluster, kgo.UnknownTopicRetries(1))
	pub, err := outboxkafka.New(client, outboxkafka.WithTopic(func(outboxplugin.Message) string { return topic }),
		outboxkafka.WithCheckTopics(topic))
	require.NoError(t, err)

	err = pub.Check(ctx)
	require.ErrorIs(t, err, outboxplugin.ErrMisconfigured)
	assert.ErrorIs(t, err, kerr.UnknownTopicOrPartition)
	assert.ErrorContains(t, err, topic, "names the topic")
	assert.ErrorContains(t, err, cluster.ListenAddrs()[0], "names the brokers")

	db := openDB(t)
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		for range 3 {
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
	for _, r := range rows {
		assert.False(t, r.Processed)
		assert.Nil(t, r.DeadAt, "not dead")
		assert.Zero(t, r.Attempts, "no attempt spent")
	}
	require.ErrorIs(t, w.Health(), outboxplugin.ErrMisconfigured)
	assert.ErrorContains(t, w.Health(), topic)

	create := kmsg.NewPtrCreateTopicsRequest()
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic, ct.NumPartitions, ct.ReplicationFactor = topic, 1, 1
	create.Topics = append(create.Topics, ct)
	resp, err := create.RequestWith(ctx, client)
	require.NoError(t, err)
	require.NoError(t, kerr.ErrorForCode(resp.Topics[0].ErrorCode))
	require.Eventually(t, func() bool { return pub.Check(ctx) == nil }, 20*time.Second, 50*time.Millisecond)
	published := 0
	for round := 0; round < 20 && published < 3; round++ {
		n, err := w.ProcessOnce(ctx)
		require.NoError(t, err)
		published += n
	}
	assert.Equal(t, 3, published)
	assert.NoError(t, w.Health())
	require.NoError(t, db.Order("id").Find(&rows).Error)
	for _, r := range rows {
		assert.True(t, r.Processed)
		assert.Equal(t, 1, r.Attempts, "published on its first attempt")
	}
}
