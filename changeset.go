package outboxplugin

import (
	"context"
	"time"

	"encoding/json"
	"github.com/gorm-outbox/outboxplugin/internal/capture"
	"gorm.io/gorm/schema"
)

// ChangesetType is the kind of change a captured row went through.
type ChangesetType string

// The three kinds of change. Their strings end the default event type: User_create.
const (
	ChangesetCreate ChangesetType = "create"
	ChangesetUpdate ChangesetType = "update"
	ChangesetDelete ChangesetType = "delete"
)

func (t ChangesetType) String() string { return string(t) }

// Changeset is what the capture callbacks see of one row the database wrote: one per row, built after
// the write and before the transaction commits. Its Type is what the database did to the row, not what
// the GORM call suggests: an upsert gives ChangesetCreate for the rows it inserted, ChangesetUpdate for
// those it updated and nothing for those it skipped.
type Changeset struct {
	Type ChangesetType
	// Model is the name of the model's Go type (User); Table the table written.
	Model string
	Table string
	// Schema is GORM's parsed model.
	Schema *schema.Schema
	// Keys holds the primary key of the row written, by column name. A model without a primary key is
	// identified by all its columns, so Keys then holds the whole row, less the columns whose stored
	// value the plugin has not read (a column its INSERT did not write; on MySQL, one its UPDATE
	// assigned).
	Keys map[string]any
	// Row is a pointer to a value of the model for this row: the value GORM holds for it when the call
	// had one (Create(&u), Save(&u), Model(&u).Updates(...), an element of a slice), otherwise the row
	// as read back from the database when the payload mode reads it (PayloadRow, PayloadChanges), and nil
	// otherwise (updates and deletes by condition, creates from maps, in PayloadKey mode).
	Row any
	// Changes holds the columns the statement assigned, by column name: the inserted columns for a
	// create (not the omitted ones), the SET (or DO UPDATE) columns for an update, nothing for a hard
	// delete. In PayloadRow and PayloadChanges modes the values are those the database stored (nil for
	// NULL); in PayloadKey mode they are the values the statement sent, and columns set to an SQL
	// expression are left out.
	Changes map[string]any
	// Context is the context of the GORM call.
	Context context.Context
}

// Event is the outbox event a captured row becomes, as an EventCustomizer sees and may change it.
type Event struct {
	// Type defaults to "<Model>_<create|update|delete>" (or what WithEventType returns) and must
	// not be empty.
	Type string
	// AggregateType and AggregateID identify the aggregate the event belongs to; together they are
	// the message key that keeps one aggregate's events in order. They default to the model name and
	// the primary key (its value for a one-column key, a JSON array of the values for a composite
	// key, empty for a model without a primary key).
	AggregateType string
	AggregateID   string
	// Payload is encoded as JSON. It starts as the payload of the configured PayloadMode, as
	// json.RawMessage. A json.RawMessage, JSON or []byte value is used as it is (it must be valid
	// JSON); anything else is marshalled.
	Payload any
	// Headers start as the headers of WithContextHeaders; the map is never nil.
	Headers map[string]string
	// Skip set to true drops the event: the row is written without one.
	Skip bool
	// DeliverAt delays the event: it is published no earlier than this time (at least once, by the
	// first poll of a worker after it; see DeliverAfter). Zero, or a time already past, publishes it
	// at once.
	DeliverAt time.Time
}

// EventCustomizer is implemented by models that shape or drop their own events. The plugin calls
// CustomizeOutboxEvent once per captured row, on the value Changeset.Row points to (a zero value of
// the model when Row is nil), with the event already filled with its defaults. A returned error fails
// the write and rolls its transaction back.
type EventCustomizer interface {
	CustomizeOutboxEvent(c *Changeset, e *Event) error
}

// publicChangeset is the capture's view of a row as a Changeset.
func publicChangeset(cs *capture.Changeset) Changeset {
	return Changeset{Type: ChangesetType(cs.Type), Model: cs.Model, Table: cs.Table, Schema: cs.Schema,
		Keys: cs.Keys, Row: cs.Row, Changes: cs.Changes, Context: cs.Context}
}

// customize hands a row's event to its model's CustomizeOutboxEvent (capture.Config.Customize):
// model is a pointer to the model value, which implements EventCustomizer.
func customize(model any, cs *capture.Changeset, e *capture.Shape) error {
	c := publicChangeset(cs)
	ev := (*Event)(e) // the same fields, in the same order
	err := model.(EventCustomizer).CustomizeOutboxEvent(&c, ev)
	ev.Payload = rawJSON(ev.Payload)
	return err
}

// rawJSON makes a JSON payload the json.RawMessage it stands for, which the capture's encoder takes as
// JSON text; other payloads are returned as they are.
func rawJSON(payload any) any {
	if j, ok := payload.(JSON); ok {
		return json.RawMessage(j)
	}
	return payload
}
