package outboxotel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	outboxotel "github.com/gorm-outbox/outboxplugin/otel"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
)

// metrics reads what reader holds, by instrument name.
type metrics map[string]metricdata.Aggregation

func collect(t *testing.T, reader sdkmetric.Reader) metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != outboxotel.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// sum is the value of the counter name at the data point whose attributes are exactly attrs (0 when
// there is none).
func (m metrics) sum(name string, attrs ...attribute.KeyValue) int64 {
	s, _ := m[name].(metricdata.Sum[int64])
	want := attribute.NewSet(attrs...)
	for _, p := range s.DataPoints {
		if p.Attributes.Equals(&want) {
			return p.Value
		}
	}
	return 0
}

// count is the number of measurements of the histogram name, over all its data points.
func (m metrics) count(name string) uint64 {
	var n uint64
	switch h := m[name].(type) {
	case metricdata.Histogram[float64]:
		for _, p := range h.DataPoints {
			n += p.Count
		}
	case metricdata.Histogram[int64]:
		for _, p := range h.DataPoints {
			n += p.Count
		}
	}
	return n
}

// gauge is the value of the gauge name (its only data point), and whether it has one.
func gauge[N int64 | float64](m metrics, name string) (N, bool) {
	g, ok := m[name].(metricdata.Gauge[N])
	if !ok || len(g.DataPoints) != 1 {
		return 0, false
	}
	return g.DataPoints[0].Value, true
}

var (
	natsSystem   = attribute.String("messaging.system", "nats")
	publish      = attribute.String("messaging.operation.name", "publish")
	refused      = attribute.String("error.type", outboxotel.ErrorRefused)
	notDelivered = attribute.String("error.type", outboxotel.ErrorNotDelivered)
)

func eventType(s string) attribute.KeyValue { return outboxotel.EventTypeKey.String(s) }

// batchCounter counts the batches the worker reports, passing them on to the Observer it embeds.
type batchCounter struct {
	*outboxotel.Observer
	mu      sync.Mutex
	batches int
}

func (b *batchCounter) BatchDone(ctx context.Context, r outboxplugin.BatchResult) {
	b.Observer.BatchDone(ctx, r)
	b.mu.Lock()
	b.batches++
	b.mu.Unlock()
}

func (b *batchCounter) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.batches
}

// The Observer's metrics for a worker that first cannot reach its broker, then publishes to JetStream
// all events but one, which the broker refuses and which is dead after its only attempt.
func TestObserverRecordsTheWorker(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := openDB(t, d)
			js, _, subject := jetStream(t)
			natsPub, err := outboxnats.New(js, outboxnats.WithSubject(subject))
			require.NoError(t, err)

			// An event written an hour ago, waiting while the broker is away.
			require.NoError(t, db.Create(&outboxplugin.OutboxEvent{EventType: "Old", Payload: outboxplugin.JSON(`{}`),
				CreatedAt: time.Now().UTC().Add(-time.Hour)}).Error)

			t.Run("broker away", func(t *testing.T) {
				reader := sdkmetric.NewManualReader()
				obs, err := outboxotel.NewObserver(outboxotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
					outboxotel.WithMessagingSystem("nats"))
				require.NoError(t, err)
				away := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error {
					return errors.New("connection refused")
				})
				stop := runWorker(t, db, away, outboxplugin.WithObserver(obs), outboxplugin.WithBacklogInterval(10*time.Millisecond))
				var m metrics
				require.Eventually(t, func() bool {
					m = collect(t, reader)
					backlog, ok := gauge[int64](m, "outbox.backlog")
					return ok && backlog == 1 && m.sum("messaging.client.sent.messages", natsSystem, publish, eventType("Old"), notDelivered) >= 1
				}, 10*time.Second, 10*time.Millisecond, "the waiting event is counted, and its failed delivery")
				stop()
				m = collect(t, reader)
				age, ok := gauge[float64](m, "outbox.backlog.oldest_age")
				require.True(t, ok)
				assert.GreaterOrEqual(t, age, time.Hour.Seconds(), "the waiting event is an hour old")
				assert.Less(t, age, (time.Hour + time.Minute).Seconds())
				assert.Zero(t, m.sum("messaging.client.sent.messages", natsSystem, publish, eventType("Old")), "nothing published")
				assert.Zero(t, m.count("outbox.publish.lag"))
			})

			t.Run("publishing", func(t *testing.T) {
				reader := sdkmetric.NewManualReader()
				otelObs, err := outboxotel.NewObserver(outboxotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
					outboxotel.WithMessagingSystem("nats"))
				require.NoError(t, err)
				obs := &batchCounter{Observer: otelObs}

				require.NoError(t, db.Create(&[]Order{{Total: 1}, {Total: 2}}).Error)
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					return outboxplugin.Emit(tx, "Poison", map[string]int{"n": 1})
				}))
				// The broker refuses Poison; the others go to JetStream.
				pub := outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
					var pass []outboxplugin.Message
					failed := map[string]error{}
					for _, m := range msgs {
						if m.EventType == "Poison" {
							failed[m.ID] = errors.New("message too large")
						} else {
							pass = append(pass, m)
						}
					}
					if err := natsPub.Publish(ctx, pass); err != nil {
						return err
					}
					return outboxplugin.FailedMessages(failed)
				})
				stop := runWorker(t, db, pub, outboxplugin.WithObserver(obs), outboxplugin.WithMaxAttempts(1),
					outboxplugin.WithBacklogInterval(10*time.Millisecond))
				var m metrics
				require.Eventually(t, func() bool {
					m = collect(t, reader)
					backlog, ok := gauge[int64](m, "outbox.backlog")
					return ok && backlog == 0 && m.sum("outbox.events.dead", natsSystem, eventType("Poison")) == 1 &&
						m.sum("messaging.client.sent.messages", natsSystem, publish, eventType("Old")) == 1
				}, 10*time.Second, 10*time.Millisecond, "all published or dead")
				stop()
				m = collect(t, reader)
				batches := uint64(obs.count())

				assert.EqualValues(t, 2, m.sum("messaging.client.sent.messages", natsSystem, publish, eventType("Order_create")))
				assert.EqualValues(t, 1, m.sum("messaging.client.sent.messages", natsSystem, publish, eventType("Old")))
				assert.EqualValues(t, 1, m.sum("messaging.client.sent.messages", natsSystem, publish, eventType("Poison"), refused))
				assert.EqualValues(t, 1, m.sum("outbox.events.dead", natsSystem, eventType("Poison")))
				assert.Zero(t, m.sum("outbox.lease.lost", natsSystem))

				assert.EqualValues(t, 3, m.count("outbox.publish.lag"), "one per published event")
				lag := m["outbox.publish.lag"].(metricdata.Histogram[float64])
				for _, p := range lag.DataPoints {
					if et, _ := p.Attributes.Value(outboxotel.EventTypeKey); et.AsString() == "Old" {
						assert.GreaterOrEqual(t, p.Sum, time.Hour.Seconds(), "the old event waited an hour")
					}
				}
				require.NotZero(t, batches)
				for _, name := range []string{"messaging.client.operation.duration", "outbox.claim.duration",
					"outbox.finish.duration", "outbox.batch.duration", "outbox.batch.size"} {
					assert.Equal(t, batches, m.count(name), "%s: one per batch", name)
				}
				size := m["outbox.batch.size"].(metricdata.Histogram[int64])
				var claimed int64
				for _, p := range size.DataPoints {
					claimed += p.Sum
				}
				assert.EqualValues(t, 4, claimed, "each event claimed once")
				age, ok := gauge[float64](m, "outbox.backlog.oldest_age")
				assert.True(t, ok)
				assert.Zero(t, age, "nothing waiting")
			})
		})
	}
}

// The Observer turns a batch's result into its measurements: a pure mapping, checked without a worker.
func TestObserverBatchResult(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := outboxotel.NewObserver(outboxotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	require.NoError(t, err)
	msg := func(eventType string) outboxplugin.Message {
		return outboxplugin.Message{ID: eventType, EventType: eventType, CreatedAt: time.Now().Add(-time.Minute)}
	}
	ctx := context.Background()
	obs.BatchDone(ctx, outboxplugin.BatchResult{
		Claimed:       6,
		Published:     []outboxplugin.Message{msg("A"), msg("A"), msg("B")},
		Failed:        []outboxplugin.FailedMessage{{Message: msg("C"), Err: errors.New("refused"), Dead: true}},
		NotDelivered:  []outboxplugin.FailedMessage{{Message: msg("A"), Err: errors.New("timeout")}},
		Released:      1,
		LeaseLost:     2,
		ClaimDuration: 10 * time.Millisecond, PublishDuration: 20 * time.Millisecond, FinishDuration: 30 * time.Millisecond,
	})
	obs.Dead(ctx, msg("C"), errors.New("refused"))
	obs.Backlog(ctx, 7)
	obs.OldestPending(ctx, time.Time{})

	m := collect(t, reader)
	assert.EqualValues(t, 2, m.sum("messaging.client.sent.messages", publish, eventType("A")))
	assert.EqualValues(t, 1, m.sum("messaging.client.sent.messages", publish, eventType("B")))
	assert.EqualValues(t, 1, m.sum("messaging.client.sent.messages", publish, eventType("C"), refused))
	assert.EqualValues(t, 1, m.sum("messaging.client.sent.messages", publish, eventType("A"), notDelivered))
	assert.EqualValues(t, 1, m.sum("outbox.events.dead", eventType("C")))
	assert.EqualValues(t, 2, m.sum("outbox.lease.lost"))
	assert.EqualValues(t, 1, m.sum("outbox.events.released"))

	sumOf := func(name string) float64 {
		h := m[name].(metricdata.Histogram[float64])
		require.Len(t, h.DataPoints, 1, name)
		return h.DataPoints[0].Sum
	}
	assert.InDelta(t, 0.010, sumOf("outbox.claim.duration"), 1e-9)
	assert.InDelta(t, 0.020, sumOf("messaging.client.operation.duration"), 1e-9)
	assert.InDelta(t, 0.030, sumOf("outbox.finish.duration"), 1e-9)
	assert.InDelta(t, 0.060, sumOf("outbox.batch.duration"), 1e-9)
	publishTime := m["messaging.client.operation.duration"].(metricdata.Histogram[float64])
	et, _ := publishTime.DataPoints[0].Attributes.Value("error.type")
	assert.Equal(t, outboxotel.ErrorNotDelivered, et.AsString(), "a batch with a message not delivered")

	assert.EqualValues(t, 3, m.count("outbox.publish.lag"))
	lag := m["outbox.publish.lag"].(metricdata.Histogram[float64])
	for _, p := range lag.DataPoints {
		assert.GreaterOrEqual(t, p.Sum, float64(p.Count)*60, "each published event is a minute old")
	}
	backlog, _ := gauge[int64](m, "outbox.backlog")
	assert.EqualValues(t, 7, backlog)
	age, ok := gauge[float64](m, "outbox.backlog.oldest_age")
	assert.True(t, ok)
	assert.Zero(t, age)
}

// A delayed event whose time has not come is outbox.scheduled, not part of outbox.backlog, and its
// age does not count in outbox.backlog.oldest_age: a reminder written an hour ago for tomorrow is not
// late.
func TestObserverScheduledEvents(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			db := openDB(t, d)
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
				return outboxplugin.Emit(tx, "Reminder", map[string]int{"id": 1}, outboxplugin.DeliverAfter(24*time.Hour))
			}))
			require.NoError(t, db.Model(&outboxplugin.OutboxEvent{}).Where("event_type = ?", "Reminder").
				Update("created_at", time.Now().UTC().Add(-time.Hour)).Error)
			require.NoError(t, db.Create(&outboxplugin.OutboxEvent{EventType: "Now", Payload: outboxplugin.JSON(`{}`),
				CreatedAt: time.Now().UTC().Add(-time.Minute)}).Error)

			reader := sdkmetric.NewManualReader()
			obs, err := outboxotel.NewObserver(outboxotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
			require.NoError(t, err)
			away := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error {
				return errors.New("connection refused")
			})
			stop := runWorker(t, db, away, outboxplugin.WithObserver(obs), outboxplugin.WithBacklogInterval(10*time.Millisecond))
			var m metrics
			require.Eventually(t, func() bool {
				m = collect(t, reader)
				_, ok := gauge[int64](m, "outbox.scheduled")
				return ok
			}, 10*time.Second, 10*time.Millisecond, "the scheduled event is counted")
			stop()
			m = collect(t, reader)
			scheduled, _ := gauge[int64](m, "outbox.scheduled")
			assert.EqualValues(t, 1, scheduled)
			backlog, _ := gauge[int64](m, "outbox.backlog")
			assert.EqualValues(t, 1, backlog, "the event due now only")
			age, ok := gauge[float64](m, "outbox.backlog.oldest_age")
			require.True(t, ok)
			assert.GreaterOrEqual(t, age, time.Minute.Seconds(), "the due event is a minute old")
			assert.Less(t, age, (30 * time.Minute).Seconds(), "the scheduled event, an hour old, does not count")
		})
	}
}
