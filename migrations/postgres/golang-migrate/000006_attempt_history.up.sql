-- outboxplugin schema version 6 (attempt_history) of table outbox_events.
-- attempt_history, each event's last failed attempts: nullable without a default, so that adding
-- it is a change of the catalog, not a rewrite of the rows. A worker keeping a history
-- (the default) refuses a table without it.
ALTER TABLE "outbox_events" ADD COLUMN IF NOT EXISTS attempt_history jsonb;
