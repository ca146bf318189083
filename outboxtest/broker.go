package outboxtest

import (
	"net"
	"os"
	"testing"
	"time"
)

// RequireBroker makes a test depend on a broker listening at addr (host:port): when nothing answers
// there, the test is skipped — or fails, when OUTBOX_REQUIRE_BROKERS=1 (as in CI), so that a missing
// broker cannot pass unnoticed.
func RequireBroker(tb testing.TB, name, addr string) {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		c.Close()
		return
	}
	if os.Getenv("OUTBOX_REQUIRE_BROKERS") == "1" {
		tb.Fatalf("%s is not reachable at %s (OUTBOX_REQUIRE_BROKERS=1): %v", name, addr, err)
	}
	tb.Skipf("%s is not reachable at %s: %v", name, addr, err)
}
