-- outboxplugin schema version 1 (create_table) of table outbox_events.
-- The outbox table as the first version of the plugin created it: the reference design's
-- columns, the relay's bookkeeping, the reference index for cleanup and the pending index that
-- later versions replace with the claim index. (On PostgreSQL the first versions typed payload and
-- headers jsonb; a table made then keeps them: the plugin reads and writes both.)
CREATE TABLE `outbox_events` (
	id bigint AUTO_INCREMENT,
	message_id varchar(36) NOT NULL,
	event_type varchar(255) NOT NULL,
	aggregate_type varchar(255) NOT NULL DEFAULT '',
	aggregate_id varchar(255) NOT NULL DEFAULT '',
	payload json NOT NULL,
	headers json,
	created_at datetime(6) NOT NULL,
	processed boolean NOT NULL DEFAULT false,
	processed_at datetime(6) NULL,
	attempts bigint NOT NULL DEFAULT 0,
	next_attempt_at datetime(6) NULL,
	last_error text,
	dead_at datetime(6) NULL,
	locked_by varchar(64),
	locked_until datetime(6) NULL,
	PRIMARY KEY (id),
	INDEX `idx_outbox_events_processed_created_at` (processed, created_at),
	INDEX `idx_outbox_events_pending` (created_at, id)
);
