-- +goose NO TRANSACTION
-- outboxplugin schema version 5 (dead_index) of table outbox_events.
-- The dead index, partial, for the Admin's counts and lists of dead events (PostgreSQL and
-- SQLite: MySQL and MariaDB, without partial indexes, use the claim index's leading columns).
-- CONCURRENTLY cannot run in a transaction: the statement is alone in its file.

-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS "idx_outbox_events_dead" ON "outbox_events" (dead_at, id) WHERE dead_at IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS "idx_outbox_events_dead";
