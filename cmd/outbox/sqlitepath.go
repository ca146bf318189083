package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
)

// errNoSQLiteFile: a SQLite --db names a file that does not exist, for a command that does not create
// one.
var errNoSQLiteFile = errors.New("no SQLite database")

// sqliteMustExist refuses a SQLite DSN whose file does not exist. SQLite creates a missing file on
// open, so a mistyped path would otherwise leave an empty database behind and end in a "no such
// table" error that does not say why. Only migrate creates the file (and its table): every other
// command works on a table that must be there already. A DSN without a file (:memory:,
// mode=memory) passes.
func sqliteMustExist(kind, driverDSN string) error {
	if kind != kindSQLite {
		return nil
	}
	path, ok := sqliteFile(driverDSN)
	if !ok {
		return nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w at %s: the file does not exist, and only outbox migrate creates one: check --db, "+
			"or run outbox migrate --db %s to create it with the outbox table", errNoSQLiteFile, path, path)
	}
	return nil
}

// sqliteFile returns the file of a SQLite DSN as the driver reads it: a path, or a file: URI, either
// with ?parameters; false for an in-memory database.
func sqliteFile(dsn string) (string, bool) {
	path, query, _ := strings.Cut(dsn, "?")
	if rest, ok := strings.CutPrefix(path, "file:"); ok {
		if q, err := url.ParseQuery(query); err == nil && q.Get("mode") == "memory" {
			return "", false
		}
		// file://host/path and file:///path name /path; file:path is relative.
		if after, ok := strings.CutPrefix(rest, "//"); ok {
			if i := strings.IndexByte(after, '/'); i >= 0 {
				rest = after[i:]
			} else {
				rest = ""
			}
		}
		if p, err := url.PathUnescape(rest); err == nil {
			rest = p
		}
		path = rest
	}
	if path == "" || path == ":memory:" {
		return "", false
	}
	return path, true
}
