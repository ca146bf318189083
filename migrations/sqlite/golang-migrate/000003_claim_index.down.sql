-- outboxplugin schema version 3 (claim_index) of table outbox_events.
-- The claim index, from which the relay takes each batch; the relay refuses a table without it.
-- Built without holding up writes: CONCURRENTLY on PostgreSQL, in place without a lock on MySQL
-- and MariaDB. On PostgreSQL a build that fails leaves an INVALID index of that name, which IF NOT
-- EXISTS would keep: drop it (DROP INDEX CONCURRENTLY) before running this step again.
DROP INDEX IF EXISTS `idx_outbox_events_claim`;
