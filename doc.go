// Package outboxplugin is a transactional outbox for GORM.
//
// db.Use(outboxplugin.New()) makes every create, update and delete that GORM runs write one outbox
// event per changed row, in the same database transaction as the row itself: both commit or both
// roll back. Emit writes an explicit domain event inside a transaction.
//
// A Worker (NewWorker) relays committed events to a broker through a Publisher, at least once: it
// claims them with SELECT … FOR UPDATE SKIP LOCKED under a lease, publishes, and marks them done.
// Several workers, in one process or many, may run on one table. An Admin (NewAdmin) shows and
// repairs the outbox without a broker: counts per state, event lists, requeue of failed events.
// DeliverAfter and DeliverAt delay an event. On the consuming side, the inbox package runs a
// handler once per message however often it is delivered.
//
// The guides:
//   - what is captured, for every write path: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/capture.md
//   - the relay, its options and its guarantees: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/relay.md
//   - the publishers: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/publishers.md
//   - consuming, the inbox and de-duplication per broker: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/consuming.md
//   - operating it (the Admin API, states, what each query reads): https://github.com/gorm-outbox/outboxplugin/blob/main/docs/operations.md
//   - reliability tests and their figures: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/reliability.md
//   - benchmarks: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/benchmarks.md
package outboxplugin
