// Package txsql reads what a statement does to the transaction it is sent in: a savepoint set,
// released or rolled back to, a rollback, a commit, or (MySQL, MariaDB) a statement the server commits
// the transaction before. The capture's transaction watch (internal/capture's txwatch.go) acts on it,
// so that events held for a transaction follow its savepoints and end with it. It also remembers the
// transaction statements prepared as *sql.Stmt (GORM's PrepareStmt), whose text is not seen again when
// they run.
package txsql

import (
	"database/sql"
	"runtime"
	"strings"
	"sync"
	"weak"
)

// What a statement sent inside a watched transaction does to the transaction itself. The watch
// (internal/capture's txwatch.go) reads the text of every statement that reaches the transaction's connection — through
// Exec, Raw(...).Row/Rows/Scan, the connection's ExecContext/QueryContext/QueryRowContext, or a
// prepared statement — and acts on those that mark a savepoint, undo work or end the transaction.

// Kind is what a statement does to its transaction.
type Kind int

const (
	// Other: a statement that leaves the transaction as it is (SELECT, INSERT, UPDATE, DELETE, …).
	Other Kind = iota
	// Savepoint: SAVEPOINT name.
	Savepoint
	// Release: RELEASE [SAVEPOINT] name.
	Release
	// RollbackTo: ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name.
	RollbackTo
	// Rollback: ROLLBACK or ABORT of the whole transaction, with or without AND CHAIN.
	Rollback
	// Commit: COMMIT, END or PREPARE TRANSACTION: the transaction's work is committed (or prepared
	// for a two-phase commit) and its savepoints are gone.
	Commit
	// MayCommit: a statement MySQL and MariaDB commit the open transaction before (DDL, BEGIN,
	// START TRANSACTION, LOCK TABLES, SET autocommit = 1, …). Held events are written before it. On
	// the other databases, where such statements leave the transaction open, and for a SET that
	// assigns something else, writing them early costs a round trip and changes nothing else; the
	// savepoints are kept, since the statement may not have committed.
	MayCommit
)

// Statement is a statement's effect on its transaction, with the savepoint it names.
type Statement struct {
	Kind Kind
	// savepoint is the name as the database compares it: unquoted names folded to lower case, quoted
	// ones kept as written on PostgreSQL (see sqlScanner.name).
	Savepoint string
	// Chain: a COMMIT or ROLLBACK AND CHAIN, which begins a new transaction at once.
	Chain bool
}

// implicitCommitWords are the first words of statements that MySQL and MariaDB commit the open
// transaction before (the server manual's "statements that cause an implicit commit"), beyond COMMIT
// itself. SET is there for SET autocommit = 1.
var implicitCommitWords = map[string]bool{
	"BEGIN": true, "START": true, "CREATE": true, "ALTER": true, "DROP": true, "RENAME": true,
	"TRUNCATE": true, "LOCK": true, "UNLOCK": true, "GRANT": true, "REVOKE": true, "ANALYZE": true,
	"OPTIMIZE": true, "REPAIR": true, "FLUSH": true, "INSTALL": true, "UNINSTALL": true, "LOAD": true,
	"CACHE": true, "RESET": true, "XA": true, "SET": true,
}

// Parse reads what query does to its transaction. Leading blanks and comments (/* … */,
// -- …, # …) are skipped and keywords are matched in any letter case, so that a statement carrying
// an application's comment or written in lower case is recognised as the database recognises it.
func Parse(query string, pg bool) Statement {
	s := sqlScanner{src: query}
	switch s.keyword() {
	case "SAVEPOINT":
		return Statement{Kind: Savepoint, Savepoint: s.name(pg)}
	case "RELEASE":
		s.optional("SAVEPOINT")
		return Statement{Kind: Release, Savepoint: s.name(pg)}
	case "ROLLBACK", "ABORT":
		if !s.optional("WORK") {
			s.optional("TRANSACTION")
		}
		if s.optional("PREPARED") {
			return Statement{} // ROLLBACK PREPARED 'id': another, prepared transaction
		}
		if s.optional("TO") {
			s.optional("SAVEPOINT")
			return Statement{Kind: RollbackTo, Savepoint: s.name(pg)}
		}
		return Statement{Kind: Rollback, Chain: s.andChain()}
	case "COMMIT", "END":
		if s.optional("PREPARED") {
			return Statement{}
		}
		if !s.optional("WORK") {
			s.optional("TRANSACTION")
		}
		return Statement{Kind: Commit, Chain: s.andChain()}
	case "PREPARE":
		if s.optional("TRANSACTION") {
			return Statement{Kind: Commit}
		}
		return Statement{}
	case "":
		return Statement{}
	default:
		if implicitCommitWords[s.last] {
			return Statement{Kind: MayCommit}
		}
		return Statement{}
	}
}

// LeadingKeyword is the first word of query in upper case, after blanks and comments: "UPDATE".
func LeadingKeyword(query string) string {
	s := sqlScanner{src: query}
	return s.keyword()
}

// sqlScanner reads the leading words of a statement.
type sqlScanner struct {
	src  string
	pos  int
	last string // the last keyword read, in upper case
}

// skip moves past blanks, comments and opening parentheses.
func (s *sqlScanner) skip() {
	for s.pos < len(s.src) {
		switch c := s.src[s.pos]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '(' || c == ';':
			s.pos++
		case c == '-' && strings.HasPrefix(s.src[s.pos:], "--"), c == '#':
			if i := strings.IndexByte(s.src[s.pos:], '\n'); i >= 0 {
				s.pos += i + 1
			} else {
				s.pos = len(s.src)
			}
		case c == '/' && strings.HasPrefix(s.src[s.pos:], "/*"):
			if i := strings.Index(s.src[s.pos+2:], "*/"); i >= 0 {
				s.pos += i + 4
			} else {
				s.pos = len(s.src)
			}
		default:
			return
		}
	}
}

// keyword reads the next word (letters and underscores) in upper case, "" when none follows.
func (s *sqlScanner) keyword() string {
	s.skip()
	start := s.pos
	for s.pos < len(s.src) && isWordByte(s.src[s.pos], false) {
		s.pos++
	}
	s.last = strings.ToUpper(s.src[start:s.pos])
	return s.last
}

// optional reads the next word when it is kw (in any case), and reports whether it was.
func (s *sqlScanner) optional(kw string) bool {
	save := s.pos
	if s.keyword() == kw {
		return true
	}
	s.pos = save
	return false
}

// andChain reads AND CHAIN (not AND NO CHAIN) and reports whether it was there.
func (s *sqlScanner) andChain() bool {
	if !s.optional("AND") {
		return false
	}
	return s.optional("CHAIN")
}

// name reads an identifier: a quoted one ("…", `…`, […]) or a bare word. Bare names are folded to
// lower case, as the databases compare savepoint names: PostgreSQL folds unquoted names and keeps
// quoted ones as written; MySQL, MariaDB and SQLite compare savepoint names without regard to case.
func (s *sqlScanner) name(pg bool) string {
	s.skip()
	if s.pos >= len(s.src) {
		return ""
	}
	var closing byte
	switch s.src[s.pos] {
	case '"':
		closing = '"'
	case '`':
		closing = '`'
	case '[':
		closing = ']'
	}
	if closing != 0 {
		var b strings.Builder
		i := s.pos + 1
		for i < len(s.src) {
			if s.src[i] == closing {
				if i+1 < len(s.src) && s.src[i+1] == closing && closing != ']' {
					b.WriteByte(closing) // a doubled quote stands for itself
					i += 2
					continue
				}
				i++
				break
			}
			b.WriteByte(s.src[i])
			i++
		}
		s.pos = i
		if pg {
			return b.String()
		}
		return strings.ToLower(b.String())
	}
	start := s.pos
	for s.pos < len(s.src) && isWordByte(s.src[s.pos], true) {
		s.pos++
	}
	return strings.ToLower(s.src[start:s.pos])
}

// isWordByte reports whether c continues a keyword, or with ident an unquoted identifier (which may
// hold digits and $ as well; bytes of multi-byte UTF-8 letters count as letters).
func isWordByte(c byte, ident bool) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_':
		return true
	case ident && (c >= '0' && c <= '9' || c == '$' || c >= 0x80):
		return true
	}
	return false
}

// Prepared are the transaction statements prepared on a pool or in its transactions, by
// prepared statement: GORM's PrepareStmt runs a statement as a *sql.Stmt, whose text the transaction
// no longer sees when it runs. An entry lives as long as its statement.
type Prepared struct{ m StmtMap[Statement] }

// Remember records what stmt does, when it is a transaction statement.
func (r *Prepared) Remember(stmt *sql.Stmt, s Statement) {
	if s.Kind == Other || stmt == nil {
		return
	}
	r.m.Remember(stmt, s)
}

// Lookup returns what stmt does, when it is a transaction statement.
func (r *Prepared) Lookup(stmt *sql.Stmt) (Statement, bool) { return r.m.Lookup(stmt) }

// StmtMap keeps a value per prepared statement, as long as the statement lives: the entry goes
// when the garbage collector takes the statement.
type StmtMap[V any] struct {
	m sync.Map // weak.Pointer[sql.Stmt] -> V
}

// Remember keeps v for stmt; a value kept already stays.
func (r *StmtMap[V]) Remember(stmt *sql.Stmt, v V) {
	key := weak.Make(stmt)
	if _, loaded := r.m.LoadOrStore(key, v); !loaded {
		runtime.AddCleanup(stmt, func(k weak.Pointer[sql.Stmt]) { r.m.Delete(k) }, key)
	}
}

// Lookup returns the value kept for stmt.
func (r *StmtMap[V]) Lookup(stmt *sql.Stmt) (V, bool) {
	v, ok := r.m.Load(weak.Make(stmt))
	if !ok {
		var zero V
		return zero, false
	}
	return v.(V), true
}
