package outboxotel

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/gorm-outbox/outboxplugin"
)

var (
	_ outboxplugin.BacklogAgeObserver  = (*Observer)(nil)
	_ outboxplugin.ScheduledObserver   = (*Observer)(nil)
	_ outboxplugin.TableHealthObserver = (*Observer)(nil)
)

// Observer records the worker's metrics (README.md lists them with their units and attributes). Pass
// it to outboxplugin.WithObserver. It is safe for concurrent use, and one Observer may serve several
// workers: its counters and histograms add up, and its gauges hold the last measurement of any.
type Observer struct {
	common    []attribute.KeyValue // of every measurement: messaging.system, when set
	commonSet metric.MeasurementOption
	send      []attribute.KeyValue // of the publish's: common and messaging.operation.name

	sent        metric.Int64Counter     // messaging.client.sent.messages
	publishTime metric.Float64Histogram // messaging.client.operation.duration
	dead        metric.Int64Counter     // outbox.events.dead
	leaseLost   metric.Int64Counter     // outbox.lease.lost
	released    metric.Int64Counter     // outbox.events.released
	lag         metric.Float64Histogram // outbox.publish.lag
	batchTime   metric.Float64Histogram // outbox.batch.duration
	claimTime   metric.Float64Histogram // outbox.claim.duration
	finishTime  metric.Float64Histogram // outbox.finish.duration
	batchSize   metric.Int64Histogram   // outbox.batch.size
	backlog     metric.Int64Gauge       // outbox.backlog
	oldestAge   metric.Float64Gauge     // outbox.backlog.oldest_age
	scheduled   metric.Int64Gauge       // outbox.scheduled

	tableSize     metric.Int64Gauge   // outbox.table.size
	indexSize     metric.Int64Gauge   // outbox.table.index_size
	freeSize      metric.Int64Gauge   // outbox.table.free_size
	deadRows      metric.Int64Gauge   // outbox.table.dead_rows
	vacuumAge     metric.Float64Gauge // outbox.table.vacuum_age
	purgeLag      metric.Int64Gauge   // outbox.table.purge_lag
	partitions    metric.Int64Gauge   // outbox.partitions
	defaultRows   metric.Int64Gauge   // outbox.partition.default.rows
	oldestPartAge metric.Float64Gauge // outbox.partition.oldest_age
}

// durationBuckets are the bucket boundaries the semantic conventions give for
// messaging.client.operation.duration, used for every duration of a batch.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// lagBuckets reach further than durationBuckets: an event waits for the poll interval, the batches
// ahead of it, retries and outages.
var lagBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// NewObserver returns an Observer whose instruments are created once, here, with the meter of
// WithMeterProvider (default otel.GetMeterProvider()). WithMessagingSystem adds messaging.system to
// every measurement. It fails only when the provider refuses to create an instrument.
func NewObserver(opts ...Option) (*Observer, error) {
	c := newConfig(opts)
	m := c.meterProvider.Meter(ScopeName)
	o := &Observer{}
	if c.system != "" {
		o.common = []attribute.KeyValue{semconv.MessagingSystemKey.String(c.system)}
	}
	o.commonSet = metric.WithAttributeSet(attribute.NewSet(o.common...))
	o.send = append(with(o.common), semconv.MessagingOperationName(operationName))

	var err error
	create := func(name string, f func() error) {
		if err == nil {
			if e := f(); e != nil {
				err = fmt.Errorf("outboxotel: create %s: %w", name, e)
			}
		}
	}
	create("messaging.client.sent.messages", func() (e error) {
		o.sent, e = m.Int64Counter("messaging.client.sent.messages", metric.WithUnit("{message}"),
			metric.WithDescription("Messages the worker handed to the publisher, by outcome: error.type is absent for those the broker accepted."))
		return
	})
	create("messaging.client.operation.duration", func() (e error) {
		o.publishTime, e = m.Float64Histogram("messaging.client.operation.duration", metric.WithUnit("s"),
			metric.WithDescription("Duration of each batch's publish, from the call to the publisher to its return."),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		return
	})
	create("outbox.events.dead", func() (e error) {
		o.dead, e = m.Int64Counter("outbox.events.dead", metric.WithUnit("{event}"),
			metric.WithDescription("Events given up on after their last attempt."))
		return
	})
	create("outbox.lease.lost", func() (e error) {
		o.leaseLost, e = m.Int64Counter("outbox.lease.lost", metric.WithUnit("{event}"),
			metric.WithDescription("Published events the worker could not mark done because their lease had passed to another worker: they are published twice."))
		return
	})
	create("outbox.events.released", func() (e error) {
		o.released, e = m.Int64Counter("outbox.events.released", metric.WithUnit("{event}"),
			metric.WithDescription("Claimed events handed back unpublished because the worker was stopping."))
		return
	})
	create("outbox.publish.lag", func() (e error) {
		o.lag, e = m.Float64Histogram("outbox.publish.lag", metric.WithUnit("s"),
			metric.WithDescription("Time from an event's created_at to the end of the batch that published it."),
			metric.WithExplicitBucketBoundaries(lagBuckets...))
		return
	})
	create("outbox.batch.duration", func() (e error) {
		o.batchTime, e = m.Float64Histogram("outbox.batch.duration", metric.WithUnit("s"),
			metric.WithDescription("Duration of a batch: claim, publish and recording the outcome."),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		return
	})
	create("outbox.claim.duration", func() (e error) {
		o.claimTime, e = m.Float64Histogram("outbox.claim.duration", metric.WithUnit("s"),
			metric.WithDescription("Duration of a batch's claim."),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		return
	})
	create("outbox.finish.duration", func() (e error) {
		o.finishTime, e = m.Float64Histogram("outbox.finish.duration", metric.WithUnit("s"),
			metric.WithDescription("Duration of recording a batch's outcome (marking events done, failed or dead)."),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		return
	})
	create("outbox.batch.size", func() (e error) {
		o.batchSize, e = m.Int64Histogram("outbox.batch.size", metric.WithUnit("{event}"),
			metric.WithDescription("Events claimed by a batch."),
			metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000))
		return
	})
	create("outbox.backlog", func() (e error) {
		o.backlog, e = m.Int64Gauge("outbox.backlog", metric.WithUnit("{event}"),
			metric.WithDescription("Events to be published: due, leased, or waiting for a retry (dead and scheduled ones excluded), at the last backlog measurement."))
		return
	})
	create("outbox.backlog.oldest_age", func() (e error) {
		o.oldestAge, e = m.Float64Gauge("outbox.backlog.oldest_age", metric.WithUnit("s"),
			metric.WithDescription("Age of the oldest event to be published (scheduled ones excluded; 0 when none is), at the last backlog measurement."))
		return
	})
	create("outbox.scheduled", func() (e error) {
		o.scheduled, e = m.Int64Gauge("outbox.scheduled", metric.WithUnit("{event}"),
			metric.WithDescription("Delayed events whose time has not come (scheduled), at the last backlog measurement."))
		return
	})
	create("outbox.table.size", func() (e error) {
		o.tableSize, e = m.Int64Gauge("outbox.table.size", metric.WithUnit("By"),
			metric.WithDescription("The outbox table's size on disk, indexes included (SQLite: the database file's), at the last table health reading."))
		return
	})
	create("outbox.table.index_size", func() (e error) {
		o.indexSize, e = m.Int64Gauge("outbox.table.index_size", metric.WithUnit("By"),
			metric.WithDescription("The size of the outbox table's indexes (PostgreSQL, MySQL), at the last table health reading."))
		return
	})
	create("outbox.table.free_size", func() (e error) {
		o.freeSize, e = m.Int64Gauge("outbox.table.free_size", metric.WithUnit("By"),
			metric.WithDescription("Space allocated and not in use: InnoDB's DATA_FREE of the outbox table, SQLite's free pages, at the last table health reading."))
		return
	})
	create("outbox.table.dead_rows", func() (e error) {
		o.deadRows, e = m.Int64Gauge("outbox.table.dead_rows", metric.WithUnit("{row}"),
			metric.WithDescription("Dead row versions of the outbox table that VACUUM has not removed yet (PostgreSQL), at the last table health reading."))
		return
	})
	create("outbox.table.vacuum_age", func() (e error) {
		o.vacuumAge, e = m.Float64Gauge("outbox.table.vacuum_age", metric.WithUnit("s"),
			metric.WithDescription("Time since the last vacuum, manual or automatic, that the outbox table's dead rows wait on (PostgreSQL), at the last table health reading."))
		return
	})
	create("outbox.table.purge_lag", func() (e error) {
		o.purgeLag, e = m.Int64Gauge("outbox.table.purge_lag", metric.WithUnit("{transaction}"),
			metric.WithDescription("InnoDB's history list length, server-wide: undo logs purge has not removed yet (MySQL, MariaDB), at the last table health reading."))
		return
	})
	create("outbox.partitions", func() (e error) {
		o.partitions, e = m.Int64Gauge("outbox.partitions", metric.WithUnit("{partition}"),
			metric.WithDescription("Partitions of the outbox table, the default one included (0: not partitioned), at the last table health reading."))
		return
	})
	create("outbox.partition.default.rows", func() (e error) {
		o.defaultRows, e = m.Int64Gauge("outbox.partition.default.rows", metric.WithUnit("{row}"),
			metric.WithDescription("The database's estimate of the rows in the outbox table's default (MAXVALUE) partition: above 0, partitions were not made ahead of time."))
		return
	})
	create("outbox.partition.oldest_age", func() (e error) {
		o.oldestPartAge, e = m.Float64Gauge("outbox.partition.oldest_age", metric.WithUnit("s"),
			metric.WithDescription("Age of the outbox table's oldest partition, from its lower bound, at the last table health reading."))
		return
	})
	if err != nil {
		return nil, err
	}
	return o, nil
}

// BatchDone records a batch: its messages by event type and outcome, the publish lag of each
// published one, the durations of its steps, its size, its lease losses and released events.
func (o *Observer) BatchDone(ctx context.Context, r outboxplugin.BatchResult) {
	now := time.Now()
	// One attribute set per event type and outcome, not per message: a batch of 500 events of three
	// types costs three sets.
	type outcome struct{ eventType, errorType string }
	counts := make(map[outcome]int64)
	for _, m := range r.Published {
		counts[outcome{m.EventType, ""}]++
	}
	for _, f := range r.Failed {
		counts[outcome{f.Message.EventType, ErrorRefused}]++
	}
	for _, f := range r.NotDelivered {
		counts[outcome{f.Message.EventType, ErrorNotDelivered}]++
	}
	for k, n := range counts {
		attrs := append(with(o.send), EventTypeKey.String(k.eventType))
		if k.errorType != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(k.errorType))
		}
		o.sent.Add(ctx, n, metric.WithAttributeSet(attribute.NewSet(attrs...)))
	}
	lagAttrs := make(map[string]metric.MeasurementOption)
	for _, m := range r.Published {
		if m.CreatedAt.IsZero() {
			continue
		}
		attrs, ok := lagAttrs[m.EventType]
		if !ok {
			attrs = metric.WithAttributeSet(attribute.NewSet(append(with(o.common), EventTypeKey.String(m.EventType))...))
			lagAttrs[m.EventType] = attrs
		}
		o.lag.Record(ctx, max(now.Sub(m.CreatedAt), 0).Seconds(), attrs)
	}

	if len(r.Published)+len(r.Failed)+len(r.NotDelivered) > 0 {
		attrs := o.send
		switch {
		case len(r.NotDelivered) > 0:
			attrs = append(with(o.send), semconv.ErrorTypeKey.String(ErrorNotDelivered))
		case len(r.Failed) > 0:
			attrs = append(with(o.send), semconv.ErrorTypeKey.String(ErrorRefused))
		}
		o.publishTime.Record(ctx, r.PublishDuration.Seconds(), metric.WithAttributeSet(attribute.NewSet(attrs...)))
	}
	o.claimTime.Record(ctx, r.ClaimDuration.Seconds(), o.commonSet)
	o.finishTime.Record(ctx, r.FinishDuration.Seconds(), o.commonSet)
	o.batchTime.Record(ctx, (r.ClaimDuration + r.PublishDuration + r.FinishDuration).Seconds(), o.commonSet)
	o.batchSize.Record(ctx, int64(r.Claimed), o.commonSet)
	if r.LeaseLost > 0 {
		o.leaseLost.Add(ctx, int64(r.LeaseLost), o.commonSet)
	}
	if r.Released > 0 {
		o.released.Add(ctx, int64(r.Released), o.commonSet)
	}
}

// Dead counts an event given up on, by event type.
func (o *Observer) Dead(ctx context.Context, m outboxplugin.Message, _ error) {
	o.dead.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(append(with(o.common), EventTypeKey.String(m.EventType))...)))
}

// Backlog records the number of events to be published (dead and scheduled ones excluded).
func (o *Observer) Backlog(ctx context.Context, pending int64) {
	o.backlog.Record(ctx, pending, o.commonSet)
}

// Scheduled records the number of delayed events whose time has not come.
func (o *Observer) Scheduled(ctx context.Context, n int64) {
	o.scheduled.Record(ctx, n, o.commonSet)
}

// OldestPending records the age of the oldest event to be published (scheduled ones excluded): 0
// when none is.
func (o *Observer) OldestPending(ctx context.Context, createdAt time.Time) {
	age := 0.0
	if !createdAt.IsZero() {
		age = max(time.Since(createdAt), 0).Seconds()
	}
	o.oldestAge.Record(ctx, age, o.commonSet)
}

// TableHealth records the outbox table's health. A figure the database did not give is not recorded,
// so that its gauge keeps no value rather than a false 0: outbox.table.free_size and
// outbox.table.purge_lag on PostgreSQL, outbox.table.dead_rows and outbox.table.vacuum_age elsewhere,
// the partition gauges of a table that is not partitioned (outbox.partitions is 0 there).
func (o *Observer) TableHealth(ctx context.Context, h outboxplugin.TableHealth) {
	record := func(g metric.Int64Gauge, v *int64) {
		if v != nil {
			g.Record(ctx, *v, o.commonSet)
		}
	}
	record(o.tableSize, h.TotalBytes)
	record(o.indexSize, h.IndexBytes)
	record(o.freeSize, h.FreeBytes)
	record(o.deadRows, h.DeadRows)
	record(o.purgeLag, h.PurgeLag)
	if h.LastVacuum != nil {
		o.vacuumAge.Record(ctx, max(time.Since(*h.LastVacuum), 0).Seconds(), o.commonSet)
	}
	if h.TotalBytes != nil { // the catalog was read: the partitions are known, none included
		o.partitions.Record(ctx, int64(len(h.Partitions)), o.commonSet)
	}
	var oldest *time.Duration
	for _, p := range h.Partitions {
		if p.Default {
			record(o.defaultRows, p.Rows)
		}
		if p.Age != nil && (oldest == nil || *p.Age > *oldest) {
			oldest = p.Age
		}
	}
	if oldest != nil {
		o.oldestPartAge.Record(ctx, oldest.Seconds(), o.commonSet)
	}
}

// with returns a copy of attrs with room for two more, for the caller to append to.
func with(attrs []attribute.KeyValue) []attribute.KeyValue {
	return append(make([]attribute.KeyValue, 0, len(attrs)+2), attrs...)
}
