-- outboxplugin schema version 5 (dead_index) of table outbox_events.
-- The dead index, partial, for the Admin's counts and lists of dead events (PostgreSQL and
-- SQLite: MySQL and MariaDB, without partial indexes, use the claim index's leading columns).

-- +goose Up
-- Nothing to change on this database.
DO 0;

-- +goose Down
-- Nothing to change on this database.
DO 0;
