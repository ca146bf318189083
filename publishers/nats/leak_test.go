package outboxnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Nothing of a run stays on the shared servers. Every name a test of this package gives a thing it
// creates on a server — database, NATS stream and subject, Redis key, RabbitMQ exchange and queue —
// starts with testPrefix: this package's prefix and a token of this run, so that runs of this and
// of other packages at the same time never see each other's names. Tests delete what they create;
// after the tests, TestMain looks on every server for what is left under testPrefix (checkLeaks) and
// fails the run if anything is, naming it (and then removes it, so that a leak fails one run and
// does not pile up).

// testPrefix starts every name this run creates on a server.
var testPrefix = "outboxtest_nats_" + leakToken(4) + "_"

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
		natsLeaks(natsURL(), os.Getenv("OUTBOX_REQUIRE_BROKERS") == "1"),
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

// natsLeaks looks for JetStream streams (key-value and object stores among them) named with
// testPrefix.
func natsLeaks(url string, required bool) leakCheck {
	connect := func() (*nats.Conn, jetstream.JetStream, error) {
		nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
		if err != nil {
			return nil, nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return nc, js, nil
	}
	return leakCheck{server: "NATS JetStream streams", required: required,
		find: func(ctx context.Context) ([]string, error) {
			nc, js, err := connect()
			if err != nil {
				return nil, err
			}
			defer nc.Close()
			names := js.StreamNames(ctx)
			var left []string
			for name := range names.Name() {
				bare := strings.TrimPrefix(strings.TrimPrefix(name, "KV_"), "OBJ_")
				if strings.HasPrefix(bare, testPrefix) {
					left = append(left, name)
				}
			}
			return left, names.Err()
		},
		remove: func(ctx context.Context, names []string) error {
			nc, js, err := connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			var errs []error
			for _, name := range names {
				if err := js.DeleteStream(ctx, name); err != nil {
					errs = append(errs, fmt.Errorf("delete stream %s: %w", name, err))
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
