package outboxrabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Nothing of a run stays on the shared servers. Every name a test of this package gives a thing it
// creates on a server — database, NATS stream and subject, Redis key, RabbitMQ exchange and queue —
// starts with testPrefix: this package's prefix and a token of this run, so that runs of this and
// of other packages at the same time never see each other's names. Tests delete what they create;
// after the tests, TestMain looks on every server for what is left under testPrefix (checkLeaks) and
// fails the run if anything is, naming it (and then removes it, so that a leak fails one run and
// does not pile up).

// testPrefix starts every name this run creates on a server.
var testPrefix = "outboxtest_rabbitmq_" + leakToken(4) + "_"

// testName returns a name of this run for what: testPrefix, what and a random suffix.
func testName(what string) string { return testPrefix + what + "_" + leakToken(6) }

// leakToken returns n random bytes in lower-case hexadecimal, which can end an unquoted name.
func leakToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// rabbitNames are the exchange and queue names of this run (AMQP cannot list what a broker holds,
// so the check looks up each of these).
var rabbitNames struct {
	sync.Mutex
	names []string
}

// rabbitName returns a name of this run for a RabbitMQ exchange or queue, which checkLeaks looks up.
func rabbitName(what string) string {
	name := testName(what)
	registerRabbit(name)
	return name
}

// registerRabbit records names of exchanges or queues of this run, for checkLeaks to look up.
func registerRabbit(names ...string) {
	rabbitNames.Lock()
	defer rabbitNames.Unlock()
	for _, name := range names {
		if !slices.Contains(rabbitNames.names, name) {
			rabbitNames.names = append(rabbitNames.names, name)
		}
	}
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
		rabbitLeaks(brokerURL(), os.Getenv("OUTBOX_REQUIRE_BROKERS") == "1"),
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

// rabbitLeaks looks up every name of rabbitNames as an exchange and as a queue with a passive
// declare, which the broker answers with 404 (closing the channel) when there is none.
func rabbitLeaks(url string, required bool) leakCheck {
	connect := func() (*amqp.Connection, error) {
		return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	}
	return leakCheck{server: "RabbitMQ exchanges and queues", required: required,
		find: func(context.Context) ([]string, error) {
			rabbitNames.Lock()
			names := slices.Clone(rabbitNames.names)
			rabbitNames.Unlock()
			if len(names) == 0 {
				return nil, nil
			}
			conn, err := connect()
			if err != nil {
				return nil, err
			}
			defer conn.Close()
			var left []string
			for _, name := range names {
				for _, kind := range []string{"exchange", "queue"} {
					ch, err := conn.Channel()
					if err != nil {
						return nil, err
					}
					if kind == "exchange" {
						err = ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil)
					} else {
						_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
					}
					var aerr *amqp.Error
					switch {
					case err == nil:
						left = append(left, kind+" "+name)
						ch.Close()
					case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
					default:
						return nil, fmt.Errorf("look up %s %s: %w", kind, name, err)
					}
				}
			}
			return left, nil
		},
		remove: func(_ context.Context, left []string) error {
			conn, err := connect()
			if err != nil {
				return err
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			for _, kn := range left {
				kind, name, _ := strings.Cut(kn, " ")
				if kind == "exchange" {
					err = ch.ExchangeDelete(name, false, false)
				} else {
					_, err = ch.QueueDelete(name, false, false, false)
				}
				if err != nil { // the channel is closed: stop at the first
					return fmt.Errorf("delete %s: %w", kn, err)
				}
			}
			return nil
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
