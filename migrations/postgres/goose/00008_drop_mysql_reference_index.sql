-- outboxplugin schema version 8 (drop_mysql_reference_index) of table outbox_events.
-- MySQL and MariaDB: drops the reference index (processed, created_at), which covered every row
-- there (no partial indexes): every insert and every mark of a published event paid for it. The
-- claim index serves cleanup and the Admin's reads of processed rows instead. PostgreSQL and
-- SQLite keep theirs, partial (processed rows only).

-- +goose Up
-- Nothing to change on this database.
SELECT 1;

-- +goose Down
-- Nothing to change on this database.
SELECT 1;
