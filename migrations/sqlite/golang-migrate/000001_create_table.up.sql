-- outboxplugin schema version 1 (create_table) of table outbox_events.
-- The outbox table as the first version of the plugin created it: the reference design's
-- columns, the relay's bookkeeping, the reference index for cleanup and the pending index that
-- later versions replace with the claim index. (On PostgreSQL the first versions typed payload and
-- headers jsonb; a table made then keeps them: the plugin reads and writes both.)
CREATE TABLE `outbox_events` (
	id integer PRIMARY KEY AUTOINCREMENT,
	message_id text NOT NULL,
	event_type text NOT NULL,
	aggregate_type text NOT NULL DEFAULT '',
	aggregate_id text NOT NULL DEFAULT '',
	payload text NOT NULL,
	headers text,
	created_at datetime NOT NULL,
	processed numeric NOT NULL DEFAULT false,
	processed_at datetime,
	attempts integer NOT NULL DEFAULT 0,
	next_attempt_at datetime,
	last_error text,
	dead_at datetime,
	locked_by text,
	locked_until datetime
);

CREATE INDEX `idx_outbox_events_processed_created_at` ON `outbox_events` (processed, created_at) WHERE processed = true;

CREATE INDEX `idx_outbox_events_pending` ON `outbox_events` (created_at, id) WHERE processed = false;
