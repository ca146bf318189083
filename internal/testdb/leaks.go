package testdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// Nothing of a run stays on the shared servers. A package's tests name every database they make with
// Prefix(pkg) (NewDatabase takes it), unique to the package and the run, so that runs of this and of
// other packages at the same time never see each other's databases; Main fails the run when any is
// left after the tests, naming it, and drops it, so that a leak fails one run and does not pile up.

// Prefix is the start of every database name of pkg's tests in this run: outboxtest_<pkg>_<token>.
func Prefix(pkg string) string { return "outboxtest_" + pkg + "_" + RandomHex()[:8] }

// Main runs the tests of m, then looks on PostgreSQL and MariaDB for databases named with prefix,
// and exits with a failure when it finds any (or cannot look at a server with OUTBOX_REQUIRE_DBS=1).
func Main(m *testing.M, prefix string) {
	code := m.Run()
	if !CheckLeaks(os.Stderr, prefix) && code == 0 {
		code = 1
	}
	os.Exit(code)
}

// CheckLeaks writes to w the databases named with prefix that are left on each server, drops them,
// and returns false when there were any, or when a server could not be looked at and
// OUTBOX_REQUIRE_DBS=1.
func CheckLeaks(w io.Writer, prefix string) bool {
	required := os.Getenv("OUTBOX_REQUIRE_DBS") == "1"
	clean := true
	for _, s := range []*Server{Postgres, MySQL} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		left, err := s.databasesNamed(ctx, prefix)
		switch {
		case err != nil && required:
			fmt.Fprintf(w, "leak check: %s: %v\n", s.Name, err)
			clean = false
		case err != nil:
			fmt.Fprintf(w, "leak check: %s not checked: %v\n", s.Name, err)
		case len(left) > 0:
			clean = false
			fmt.Fprintf(w, "leak check: the tests left on %s: %s\n", s.Name, strings.Join(left, ", "))
			if err := s.drop(ctx, left); err != nil {
				fmt.Fprintf(w, "leak check: removing them failed: %v\n", err)
			} else {
				fmt.Fprintf(w, "leak check: removed them\n")
			}
		}
		cancel()
	}
	return clean
}

// open opens and pings a pool of the server's administrative DSN.
func (s Server) open(ctx context.Context) (*sql.DB, error) {
	db, err := sql.Open(s.Driver, s.DSN)
	if err == nil {
		if err = db.PingContext(ctx); err != nil {
			db.Close()
		}
	}
	return db, err
}

// databasesNamed lists the server's databases whose names start with prefix.
func (s Server) databasesNamed(ctx context.Context, prefix string) ([]string, error) {
	db, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	list := "SHOW DATABASES"
	if s.Driver == "pgx" {
		list = "SELECT datname FROM pg_database"
	}
	rows, err := db.QueryContext(ctx, list)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		if strings.HasPrefix(name, prefix) {
			left = append(left, name)
		}
	}
	return left, rows.Err()
}

// drop drops the databases names.
func (s Server) drop(ctx context.Context, names []string) error {
	db, err := s.open(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	var errs []error
	for _, name := range names {
		drop := "DROP DATABASE IF EXISTS " + name
		if s.Driver == "pgx" {
			drop += " WITH (FORCE)"
		}
		if _, err := db.ExecContext(ctx, drop); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", drop, err))
		}
	}
	return errors.Join(errs...)
}
