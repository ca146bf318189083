-- outboxplugin schema version 4 (drop_pending_index) of table outbox_events.
-- Drops the pending index (created_at, id), whose work the claim index does: every insert paid
-- for it.
ALTER TABLE `outbox_events` DROP INDEX `idx_outbox_events_pending`, ALGORITHM=INPLACE, LOCK=NONE;
