-- outboxplugin schema version 7 (processed_next_attempt) of table outbox_events.
-- MySQL and MariaDB: clears the next attempt time of processed rows (a retry or a delay that
-- earlier versions left on the rows they marked), as the mark does now, so that the processed
-- rows are one run of the claim index in creation order. Run it after the relays are upgraded:
-- a relay of an earlier version marks rows the Admin's lists of processed events then miss
-- (cleanup still deletes them). It has nothing to undo.

-- +goose Up
-- Nothing to change on this database.
SELECT 1;

-- +goose Down
-- Nothing to change on this database.
SELECT 1;
