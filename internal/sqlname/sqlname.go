// Package sqlname checks and quotes the table names the outbox and the inbox write into their SQL:
// one rule for what a name may be, shared by the capture, the relay, the Admin, the migration and the
// inbox, so that none of them owns it.
package sqlname

import (
	"regexp"
	"strings"
)

// identifier is a plain or schema-qualified SQL identifier of at most 63 characters a part (the
// length PostgreSQL keeps).
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// Valid reports whether name is a plain or schema-qualified SQL identifier ("outbox_events",
// "audit.events"). Anything else (quotes, spaces, semicolons, a third part) is refused, so that a
// valid name can be written into SQL as it is.
func Valid(name string) bool { return identifier.MatchString(name) }

// PGIdent quotes name as one PostgreSQL identifier (a LISTEN channel, one part of a table name).
func PGIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// PG quotes each part of a (possibly schema-qualified) table name for PostgreSQL.
func PG(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = PGIdent(p)
	}
	return strings.Join(parts, ".")
}
