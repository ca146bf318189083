-- outboxplugin schema version 9 (mysql_lease_defaults) of table outbox_events.
-- MySQL and MariaDB: gives the lease columns defaults (locked_by 32 spaces, locked_until
-- 1970-01-01), so that a new row holds values of the size a claim stamps and InnoDB updates it
-- in place: from NULL, every claim made its rows longer, and a relay spent about half its time
-- making room for them. A change of the catalog (ALGORITHM=INSTANT); rows written before keep
-- NULL, which the relay reads as it reads the defaults: no lease. Run it after the relays are
-- upgraded: a relay of an earlier version reads the placeholder as a lease's owner, and would
-- publish every new event alone as a delivery that did not finish, with a false history entry.
ALTER TABLE `outbox_events` ALTER COLUMN locked_by SET DEFAULT NULL, ALTER COLUMN locked_until SET DEFAULT NULL, ALGORITHM=INSTANT;
