package outboxplugin

import (
	"encoding/json"
	"unicode/utf8"
)

// Helpers that the capture side (plugin, events, encoding) and the relay side (worker, its SQL, the
// table's migration) both use, kept here so that neither reaches into the other's files (table names:
// internal/sqlname; message ids: internal/msgid).

// isJSON reports whether b is a JSON document in UTF-8. json.Valid alone accepts invalid UTF-8
// inside strings (the decoder would replace it), which PostgreSQL's jsonb and MySQL's json refuse and
// SQLite would store and the relay publish as it is; JSON exchanged between systems must be UTF-8
// (RFC 8259, section 8.1).
func isJSON(b []byte) bool {
	return utf8.Valid(b) && json.Valid(b)
}
