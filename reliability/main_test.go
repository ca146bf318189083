package reliability

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// TestMain runs the tests, then drops the databases this process created on the servers: the kill
// tests' (chaosDatabase) and the fault scenarios' of package reliability_test, each registered with
// DropAfterTests when it was created. So a run leaves nothing behind, drops only what it created, and
// only once every test has ended. The processes the kill tests start (TestChaosChild, CHAOS_ROLE set)
// run this binary too, but create no database — they open the one their parent made, named in
// CHAOS_DSN — and so drop none.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := dropRegisteredDatabases(); err != nil {
		fmt.Fprintf(os.Stderr, "drop the test databases: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	// Then nothing of the run may be left on the servers (checkLeaks); a child process created
	// nothing of its own to look for.
	if os.Getenv(chaosEnvRole) == "" && !checkLeaks(os.Stderr, leakChecks()) && code == 0 {
		code = 1
	}
	os.Exit(code)
}

// createdDatabase is a database this process created: the name and the server it is on.
type createdDatabase struct {
	dialect   string // postgres or mysql
	serverDSN string // the server's administrative DSN, as database/sql's driver takes it
	name      string
}

var (
	createdMu sync.Mutex
	created   []createdDatabase
)

// DropAfterTests records that this process created the database name on the server at serverDSN
// (dialect postgres or mysql), for TestMain to drop once every test has ended. Recording one twice
// drops it once. Exported for the scenarios of package reliability_test.
func DropAfterTests(dialect, serverDSN, name string) {
	createdMu.Lock()
	defer createdMu.Unlock()
	d := createdDatabase{dialect: dialect, serverDSN: serverDSN, name: name}
	for _, c := range created {
		if c == d {
			return
		}
	}
	created = append(created, d)
}

// dropRegisteredDatabases drops every database recorded with DropAfterTests.
func dropRegisteredDatabases() error {
	createdMu.Lock()
	defer createdMu.Unlock()
	var errs []error
	for _, d := range created {
		if err := dropDatabase(d); err != nil {
			errs = append(errs, fmt.Errorf("drop %s on %s: %w", d.name, d.dialect, err))
		}
	}
	created = nil
	return errors.Join(errs...)
}

// dropDatabase drops d within a minute.
func dropDatabase(d createdDatabase) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	driver, drop := "pgx", `DROP DATABASE IF EXISTS `+d.name+` WITH (FORCE)`
	if d.dialect == "mysql" {
		driver, drop = "mysql", "DROP DATABASE IF EXISTS "+d.name
	}
	admin, err := sql.Open(driver, d.serverDSN)
	if err != nil {
		return err
	}
	defer admin.Close()
	conn, err := admin.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if d.dialect == "mysql" {
		// A transaction left open (by a killed relay whose connection the server has not yet seen
		// go) holds a metadata lock that DROP DATABASE waits for, by default for a day or more; the
		// server gives up on its own before the context ends.
		if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = 45"); err != nil {
			return err
		}
	}
	// On PostgreSQL, WITH (FORCE) ends the sessions still connected to it (a relay killed a moment
	// ago, a pool a test left open), which would otherwise make the drop fail.
	_, err = conn.ExecContext(ctx, drop)
	return err
}
