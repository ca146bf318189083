package outboxplugin

import (
	"errors"

	"github.com/gorm-outbox/outboxplugin/internal/capture"
)

// Errors a caller can act on. They are returned wrapped, with the operation and the model named;
// match them with errors.Is.
var (
	// ErrInvalidOption is returned by db.Use when an option is out of range.
	ErrInvalidOption = errors.New("invalid option")

	// ErrInvalidTableName is returned by db.Use when WithTableName, by the worker's methods when
	// WithTable, by NewAdmin when WithAdminTable, and by AutoMigrate when db.Table's name, is not a plain
	// SQL identifier (letters, digits and underscores, not starting with a digit, optionally
	// schema-qualified). From the options it comes wrapped together with ErrInvalidOption.
	ErrInvalidTableName = errors.New("invalid outbox table name")

	// ErrNotPartitioned is returned by AutoMigrate with WithPartitions when the outbox table exists
	// and is not partitioned: converting it is a migration of its own (docs/operations.md,
	// "Partitioned outbox").
	ErrNotPartitioned = errors.New("the outbox table exists and is not partitioned")

	// ErrEmptyEventType is returned when an event would have no type.
	ErrEmptyEventType = capture.ErrEmptyEventType

	// ErrInvalidJSON is returned when a payload or headers given as raw JSON are not valid JSON.
	ErrInvalidJSON = capture.ErrInvalidJSON

	// ErrEncodePayload wraps the error of a payload that cannot be encoded as JSON. The write that
	// produced it fails and its transaction rolls back: no business row is committed without its
	// event.
	ErrEncodePayload = capture.ErrEncodePayload

	// ErrNotInTransaction is returned by Emit when tx is not inside a transaction: an event written
	// outside the business transaction could outlive a rollback or be lost by a crash.
	ErrNotInTransaction = errors.New("not inside a transaction")

	// ErrConcurrentChange is returned on MySQL and MariaDB when the count of rows a write affected
	// disagrees with the rows the plugin locked and read around it. With REPEATABLE READ (the default)
	// the locks rule it out; under READ COMMITTED another transaction can insert a key a multi-row upsert
	// then conflicts with. The GORM call fails; roll the transaction back and retry it.
	ErrConcurrentChange = capture.ErrConcurrentChange

	// ErrUnsupportedWrite is returned when the plugin cannot tell exactly which rows a write changes on
	// the database it runs on (docs/capture.md lists the forms): the GORM call fails rather than commit
	// a change with a guessed event. Where the form is known in advance, nothing is written.
	ErrUnsupportedWrite = capture.ErrUnsupportedWrite

	// ErrBrokerUnavailable is for publishers: a Publish error that wraps it — returned for the whole
	// batch, or as the error of a message in a *PublishError — says the broker did not get the
	// message(s) (a lost connection, a timeout waiting for an acknowledgement, no server to answer)
	// rather than refused them. Such a delivery spends no attempt: the events go back to pending as
	// they were, and Run backs off. A whole-batch error that wraps it is not split in halves to look for
	// a message at fault. Any other error of a message in a PublishError is a refusal.
	ErrBrokerUnavailable = errors.New("broker unavailable")

	// ErrMisconfigured is for publishers: a Publish error that wraps it — for the whole batch, or as
	// the error of a message in a *PublishError — says the broker cannot take the message(s) because
	// of how the relay or the broker is configured, not because of the message: a destination that
	// does not exist (a NATS subject no JetStream stream captures, a RabbitMQ exchange that is missing
	// or routes the message to no queue, an unknown Kafka topic, a Redis key of another type) or
	// credentials or permissions the broker refuses. Retrying does not mend it, and neither does
	// spending the event's attempts: such a delivery is handled as an outage — no attempt spent, the
	// events pending again, Run backing off (a whole-batch error is not split in halves) — and
	// reported apart: logged at error, once per cause while it lasts, and by Worker.Health until the
	// broker takes a batch again. The error should name the destination and the broker's address
	// (without credentials). docs/publishers.md lists, per broker, which failures are such.
	ErrMisconfigured = errors.New("broker or destination misconfigured")

	// ErrUnknownTable is returned, under WithStrictTables, for a write through db.Table(name) without a
	// model to a table no model the application uses maps to: a write that would otherwise commit
	// without events.
	ErrUnknownTable = capture.ErrUnknownTable

	// ErrTransactionRolledBack is returned when the database rolled a whole transaction back in the
	// middle of it — a deadlock on MySQL and MariaDB, or a lock wait timeout with
	// innodb_rollback_on_timeout — by the writes, Emits and commit that follow: their rows would each
	// commit on their own, outside the transaction its events belonged to. None of the transaction's
	// events is written. Roll back and run the transaction again.
	ErrTransactionRolledBack = capture.ErrTransactionRolledBack

	// ErrTransactionEnded is returned by a write or Emit in a transaction the application ended with a
	// COMMIT or ROLLBACK statement of its own (tx.Exec("COMMIT")): the write would commit on its own,
	// apart from its event. Begin a new transaction.
	ErrTransactionEnded = capture.ErrTransactionEnded

	// ErrUnknownSavepoint is returned by the commit of a transaction that rolled back to a savepoint
	// the plugin did not see being set (SQL sent on SQLTx's *sql.Tx or SQLConn's *sql.Conn, around GORM) while it held
	// events: which of them the rollback undid cannot be told, so the transaction is rolled back
	// rather than committed with events of rows that are gone or without events of rows that stay.
	ErrUnknownSavepoint = capture.ErrUnknownSavepoint

	// ErrCommitUnknown is returned by the commit of a transaction whose connection failed after the
	// COMMIT was sent and before the database answered (PostgreSQL with pgx, where the outbox INSERT
	// rides on the COMMIT): the transaction's rows and their events either all committed or none
	// did, and which is not known. Read the rows back to tell; an event is never without its row.
	ErrCommitUnknown = capture.ErrCommitUnknown
)
