package outboxui_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// Nothing of a run stays on the shared servers. Every name a test of this package gives a thing it
// creates on a server — database, NATS stream and subject, Redis key, RabbitMQ exchange and queue —
// starts with testPrefix: this package's prefix and a token of this run, so that runs of this and
// of other packages at the same time never see each other's names. Tests delete what they create;
// after the tests, TestMain looks on every server for what is left under testPrefix (checkLeaks) and
// fails the run if anything is, naming it (and then removes it, so that a leak fails one run and
// does not pile up).

// testPrefix starts every name this run creates on a server.
var testPrefix = "outboxtest_ui_" + leakToken(4) + "_"

// testName returns a name of this run for what: testPrefix, what and a random suffix.
func testName(what string) string { return testPrefix + what + "_" + leakToken(6) }

// leakToken returns n random bytes in lower-case hexadecimal, which can end an unquoted name.
func leakToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// leakCheck is one server's look for leftovers of this run.
type leakCheck struct {
	server   string
	required bool // unreachable is a failure (OUTBOX_REQUIRE_DBS/OUTBOX_REQUIRE_BROKERS=1), not a skip
	// find returns what is left; remove deletes it.
	find   func(ctx context.Context) ([]string, error)
	remove func(ctx context.Context, names []string) error
}

// leakChecks are the servers this package's tests create things on.
func leakChecks() []leakCheck {
	return []leakCheck{
		databaseLeaks("PostgreSQL databases", "pgx", postgresServerDSN(), os.Getenv("OUTBOX_REQUIRE_DBS") == "1"),
		databaseLeaks("MariaDB databases", "mysql", mysqlServerDSN(), os.Getenv("OUTBOX_REQUIRE_DBS") == "1"),
	}
}

// checkLeaks runs every check and writes to w what each found (and whether it could remove it),
// and returns false if anything was left or a required server could not be looked at.
func checkLeaks(w io.Writer, checks []leakCheck) bool {
	clean := true
	for _, c := range checks {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		left, err := c.find(ctx)
		switch {
		case err != nil && c.required:
			fmt.Fprintf(w, "leak check: %s: %v\n", c.server, err)
			clean = false
		case err != nil:
			fmt.Fprintf(w, "leak check: %s not checked: %v\n", c.server, err)
		case len(left) > 0:
			clean = false
			fmt.Fprintf(w, "leak check: the tests left on %s: %s\n", c.server, strings.Join(left, ", "))
			if err := c.remove(ctx, left); err != nil {
				fmt.Fprintf(w, "leak check: removing them failed: %v\n", err)
			} else {
				fmt.Fprintf(w, "leak check: removed them\n")
			}
		}
		cancel()
	}
	return clean
}

// databaseLeaks looks for databases named with testPrefix on the server at dsn.
func databaseLeaks(server, driver, dsn string, required bool) leakCheck {
	open := func(ctx context.Context) (*sql.DB, error) {
		db, err := sql.Open(driver, dsn)
		if err == nil {
			if err = db.PingContext(ctx); err != nil {
				db.Close()
			}
		}
		return db, err
	}
	return leakCheck{server: server, required: required,
		find: func(ctx context.Context) ([]string, error) {
			db, err := open(ctx)
			if err != nil {
				return nil, err
			}
			defer db.Close()
			list := "SHOW DATABASES"
			if driver == "pgx" {
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
				if strings.HasPrefix(name, testPrefix) {
					left = append(left, name)
				}
			}
			return left, rows.Err()
		},
		remove: func(ctx context.Context, names []string) error {
			db, err := open(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			var errs []error
			for _, name := range names {
				drop := "DROP DATABASE IF EXISTS " + name
				if driver == "pgx" {
					drop += " WITH (FORCE)"
				}
				if _, err := db.ExecContext(ctx, drop); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", drop, err))
				}
			}
			return errors.Join(errs...)
		},
	}
}

// TestMain runs the tests, then fails the run if they left anything on the servers (checkLeaks).
func TestMain(m *testing.M) {
	code := m.Run()
	if !checkLeaks(os.Stderr, leakChecks()) && code == 0 {
		code = 1
	}
	os.Exit(code)
}
