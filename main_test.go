package outboxplugin_test

import (
	"fmt"
	"os"
	"testing"
)

// TestMain runs the tests, then drops the databases the run created on the servers (testDatabase),
// so that a run leaves nothing behind on them. It drops them only after every test of the package has
// ended, and only those of this run; then it fails the run if anything of the run is left on the
// servers (checkLeaks).
func TestMain(m *testing.M) {
	code := m.Run()
	if err := dropTestDatabases(); err != nil {
		fmt.Fprintf(os.Stderr, "drop the test databases: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if !checkLeaks(os.Stderr, leakChecks()) && code == 0 {
		code = 1
	}
	os.Exit(code)
}
