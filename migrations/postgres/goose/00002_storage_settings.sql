-- outboxplugin schema version 2 (storage_settings) of table outbox_events.
-- PostgreSQL's storage settings for the relay's claims (fillfactor for in-place updates,
-- autovacuum at a fixed number of dead rows): a change of the catalog, which writes do not wait
-- for. It overwrites a value you set yourself; AutoMigrate keeps yours.

-- +goose Up
ALTER TABLE "outbox_events" SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);

-- +goose Down
ALTER TABLE "outbox_events" RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
