-- outboxplugin schema version 4 (drop_pending_index) of table outbox_events.
-- Drops the pending index (created_at, id), whose work the claim index does: every insert paid
-- for it.

-- +goose Up
DROP INDEX IF EXISTS `idx_outbox_events_pending`;

-- +goose Down
CREATE INDEX IF NOT EXISTS `idx_outbox_events_pending` ON `outbox_events` (created_at, id) WHERE processed = false;
