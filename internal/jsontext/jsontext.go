// Package jsontext tells JSON text the outbox may store from text it may not. The capture checks the
// raw payloads and headers it is given; the model checks rows written by hand.
package jsontext

import (
	"encoding/json"
	"unicode/utf8"
)

// Valid reports whether b is a JSON document in UTF-8. json.Valid alone accepts invalid UTF-8 inside
// strings (the decoder would replace it), which PostgreSQL's jsonb and MySQL's json refuse and SQLite
// would store and the relay publish as it is; JSON exchanged between systems must be UTF-8 (RFC 8259,
// section 8.1).
func Valid(b []byte) bool {
	return utf8.Valid(b) && json.Valid(b)
}
