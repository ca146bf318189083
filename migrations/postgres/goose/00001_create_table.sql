-- outboxplugin schema version 1 (create_table) of table outbox_events.
-- The outbox table as the first version of the plugin created it: the reference design's
-- columns, the relay's bookkeeping, the reference index for cleanup and the pending index that
-- later versions replace with the claim index. (On PostgreSQL the first versions typed payload and
-- headers jsonb; a table made then keeps them: the plugin reads and writes both.)

-- +goose Up
CREATE TABLE "outbox_events" (
	id bigserial,
	message_id varchar(36) NOT NULL,
	event_type varchar(255) NOT NULL,
	aggregate_type varchar(255) NOT NULL DEFAULT '',
	aggregate_id varchar(255) NOT NULL DEFAULT '',
	payload json NOT NULL,
	headers json,
	created_at timestamptz(6) NOT NULL,
	processed boolean NOT NULL DEFAULT false,
	processed_at timestamptz(6),
	attempts bigint NOT NULL DEFAULT 0,
	next_attempt_at timestamptz(6),
	last_error text,
	dead_at timestamptz(6),
	locked_by varchar(64),
	locked_until timestamptz(6),
	PRIMARY KEY (id)
);

CREATE INDEX "idx_outbox_events_processed_created_at" ON "outbox_events" (processed, created_at) WHERE processed = true;

CREATE INDEX "idx_outbox_events_pending" ON "outbox_events" (created_at, id) WHERE processed = false;

-- +goose Down
DROP TABLE "outbox_events";
