-- outboxplugin schema version 5 (dead_index) of table outbox_events.
-- The dead index, partial, for the Admin's counts and lists of dead events (PostgreSQL and
-- SQLite: MySQL and MariaDB, without partial indexes, use the claim index's leading columns).
-- CONCURRENTLY cannot run in a transaction: the statement is alone in its file.
DROP INDEX CONCURRENTLY IF EXISTS "idx_outbox_events_dead";
