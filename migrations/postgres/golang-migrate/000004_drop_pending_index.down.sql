-- outboxplugin schema version 4 (drop_pending_index) of table outbox_events.
-- Drops the pending index (created_at, id), whose work the claim index does: every insert paid
-- for it.
-- CONCURRENTLY cannot run in a transaction: the statement is alone in its file.
CREATE INDEX CONCURRENTLY IF NOT EXISTS "idx_outbox_events_pending" ON "outbox_events" (created_at, id) WHERE processed = false;
