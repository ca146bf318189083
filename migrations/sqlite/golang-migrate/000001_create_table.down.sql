-- outboxplugin schema version 1 (create_table) of table outbox_events.
-- The outbox table as the first version of the plugin created it: the reference design's
-- columns, the relay's bookkeeping, the reference index for cleanup and the pending index that
-- later versions replace with the claim index. (On PostgreSQL the first versions typed payload and
-- headers jsonb; a table made then keeps them: the plugin reads and writes both.)
DROP TABLE `outbox_events`;
