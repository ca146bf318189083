package outboxredis_test

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestMain fails the run when goroutines started by the tests (workers, pipelines Publish abandoned,
// proxies, clients) outlive them, or when the tests left keys on Redis (checkLeaks).
func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			fmt.Fprintf(os.Stderr, "%d goroutines left running (%d before the tests):\n%s\n", n-before, before, buf[:runtime.Stack(buf, true)])
			code = 1
		}
	}
	if !checkLeaks(os.Stderr, leakChecks()) && code == 0 {
		code = 1
	}
	os.Exit(code)
}
