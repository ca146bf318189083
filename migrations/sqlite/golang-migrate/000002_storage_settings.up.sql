-- outboxplugin schema version 2 (storage_settings) of table outbox_events.
-- PostgreSQL's storage settings for the relay's claims (fillfactor for in-place updates,
-- autovacuum at a fixed number of dead rows): a change of the catalog, which writes do not wait
-- for. It overwrites a value you set yourself; AutoMigrate keeps yours.
-- Nothing to change on this database.
SELECT 1;
