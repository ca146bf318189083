-- outboxplugin schema version 4 (drop_pending_index) of table outbox_events.
-- Drops the pending index (created_at, id), whose work the claim index does: every insert paid
-- for it.

-- +goose Up
ALTER TABLE `outbox_events` DROP INDEX `idx_outbox_events_pending`, ALGORITHM=INPLACE, LOCK=NONE;

-- +goose Down
ALTER TABLE `outbox_events` ADD INDEX `idx_outbox_events_pending` (created_at, id), ALGORITHM=INPLACE, LOCK=NONE;
