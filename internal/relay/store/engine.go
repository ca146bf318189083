package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The relay's claim takes rows with FOR UPDATE SKIP LOCKED: two relays never take the same row, and
// neither waits for the other. Some engines accept the words and do something else: TiDB parses SKIP
// LOCKED and does not skip locked rows. Others lack it: MySQL before 8.0.1, MariaDB before 10.6,
// PostgreSQL before 9.5. A relay on such an engine would publish rows twice, queue behind its peers or
// fail every claim, so it is refused at start, saying why.

// ErrUnsupportedEngine is the error for a database engine whose claim would not skip locked rows.
var ErrUnsupportedEngine = errors.New("the database engine cannot run the relay's claim (FOR UPDATE SKIP LOCKED)")

// CheckEngine reads the server's version once and refuses an engine that would not skip locked rows
// (ErrUnsupportedEngine). Another error (the database is away) is not remembered: the check runs
// again at the next call.
func (q *Store) CheckEngine(ctx context.Context) error {
	q.engineMu.Lock()
	defer q.engineMu.Unlock()
	if q.engineChecked {
		return q.engineErr
	}
	version := q.versionStandIn
	if version == "" {
		var query string
		switch q.d.(type) {
		case *pgRelay:
			query = `SELECT version()`
		case *mysqlRelay:
			query = `SELECT VERSION()`
		default:
			q.engineChecked = true // SQLite: one writer at a time, no SKIP LOCKED needed
			return nil
		}
		if err := q.db.QueryRowContext(ctx, query).Scan(&version); err != nil {
			return fmt.Errorf("read the server's version: %w", err)
		}
	}
	q.engineErr = checkEngine(q.Dialect(), version)
	q.engineChecked = true
	return q.engineErr
}

// SetServerVersion has CheckEngine take version as the server's answer; for tests of engines not on
// this machine.
func (q *Store) SetServerVersion(version string) {
	q.engineMu.Lock()
	defer q.engineMu.Unlock()
	q.versionStandIn, q.engineChecked, q.engineErr = version, false, nil
}

// Dialect is the database the store runs on: "postgres", "mysql" or "sqlite".
func (q *Store) Dialect() string {
	switch q.d.(type) {
	case *pgRelay:
		return "postgres"
	case *mysqlRelay:
		return "mysql"
	}
	return "sqlite"
}

// checkEngine refuses version (the server's answer to VERSION() or version()) when the engine would
// not skip locked rows.
func checkEngine(dialect, version string) error {
	refuse := func(why string) error {
		return fmt.Errorf("%w: the server is %q: %s", ErrUnsupportedEngine, version, why)
	}
	switch dialect {
	case "postgres":
		rest, ok := strings.CutPrefix(version, "PostgreSQL ")
		if !ok {
			return nil // an engine that speaks PostgreSQL's protocol under another name: not judged here
		}
		major, minor, _, ok := versionNumbers(rest)
		if ok && (major < 9 || major == 9 && minor < 5) {
			return refuse("FOR UPDATE SKIP LOCKED came with PostgreSQL 9.5; upgrade the server")
		}
		return nil
	case "mysql":
		if strings.Contains(strings.ToLower(version), "tidb") {
			return refuse("TiDB accepts FOR UPDATE SKIP LOCKED and ignores it, so relays would take the same rows or wait for each other; run the relay on MySQL 8.0.1 or later, MariaDB 10.6 or later, or PostgreSQL")
		}
		// MariaDB's replication prefix ("5.5.5-10.11.6-MariaDB") is not its version.
		v := strings.TrimPrefix(version, "5.5.5-")
		major, minor, patch, ok := versionNumbers(v)
		if !ok {
			return nil // a version this check cannot read: the claim's own errors will say
		}
		if strings.Contains(v, "MariaDB") {
			if major < 10 || major == 10 && minor < 6 {
				return refuse("MariaDB has FOR UPDATE SKIP LOCKED from 10.6; upgrade the server")
			}
			return nil
		}
		// Aurora MySQL writes "8.0.mysql_aurora.3.05.2": version 3 and later are MySQL 8.0.23 and
		// later (patch -1: not a number).
		if major < 8 || major == 8 && minor == 0 && patch >= 0 && patch < 1 {
			return refuse("MySQL has FOR UPDATE SKIP LOCKED from 8.0.1; upgrade the server")
		}
		return nil
	}
	return nil
}

// versionNumbers reads "major.minor[.patch]" at the start of v; patch is -1 when absent or not a number.
func versionNumbers(v string) (major, minor, patch int, ok bool) {
	end := strings.IndexFunc(v, func(r rune) bool { return r != '.' && (r < '0' || r > '9') })
	head := v
	if end >= 0 {
		head = v[:end]
	}
	parts := strings.Split(strings.Trim(head, "."), ".")
	if len(parts) < 2 {
		// "17beta1", "15" (PostgreSQL 10 and later have two numbers, or one before a suffix).
		if n, err := strconv.Atoi(parts[0]); err == nil && parts[0] != "" {
			return n, 0, -1, true
		}
		return 0, 0, -1, false
	}
	var err1, err2 error
	major, err1 = strconv.Atoi(parts[0])
	minor, err2 = strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return 0, 0, -1, false
	}
	patch = -1
	if len(parts) > 2 {
		if p, err := strconv.Atoi(parts[2]); err == nil {
			patch = p
		}
	}
	return major, minor, patch, true
}

// Statement is a statement with its arguments.
type Statement struct {
	SQL  string
	Args []any
}

// ClaimReads are the statements of a claim that find its rows, as a claim by owner at now would send
// them, for EXPLAIN: PostgreSQL's one claim statement, MySQL's and MariaDB's probe of the two runs.
// SQLite has none (its claim takes the database's write lock).
func (q *Store) ClaimReads(ctx context.Context, owner string, now time.Time) ([]Statement, error) {
	if err := q.ready(ctx); err != nil {
		return nil, err
	}
	switch d := q.d.(type) {
	case *pgRelay:
		return []Statement{{d.claimUpdate, q.claimArgs(owner, now)}}, nil
	case *mysqlRelay:
		query, args := d.literal(d.probe, q.clock.args(d.clock(now), d.probeArgs))
		return []Statement{{query, args}}, nil
	}
	return nil, nil
}
