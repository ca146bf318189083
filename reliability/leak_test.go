package reliability

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// Nothing of a run stays on the shared servers. Every name a test of this package gives a thing it
// creates on a server — database, NATS stream and subject, Redis key, RabbitMQ exchange and queue —
// starts with testPrefix: this package's prefix and a token of this run, so that runs of this and
// of other packages at the same time never see each other's names. Tests delete what they create;
// after the tests, TestMain looks on every server for what is left under testPrefix (checkLeaks) and
// fails the run if anything is, naming it (and then removes it, so that a leak fails one run and
// does not pile up).

// testPrefix starts every name this run creates on a server.
var testPrefix = "outboxtest_rel_" + leakToken(4) + "_"

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
		databaseLeaks("PostgreSQL databases", "pgx", leakEnv("OUTBOX_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"), os.Getenv("OUTBOX_REQUIRE_DBS") == "1"),
		databaseLeaks("MariaDB databases", "mysql", leakEnv("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/"), os.Getenv("OUTBOX_REQUIRE_DBS") == "1"),
		mariaDBUserLeaks(leakEnv("OUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/"), os.Getenv("OUTBOX_REQUIRE_DBS") == "1"),
		natsLeaks(leakEnv("OUTBOX_NATS_URL", "nats://127.0.0.1:4222"), os.Getenv("OUTBOX_REQUIRE_BROKERS") == "1"),
		redisLeaks("redis://"+chaosRedisAddr(), os.Getenv("OUTBOX_REQUIRE_BROKERS") == "1"),
		rabbitLeaks(leakEnv("OUTBOX_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"), os.Getenv("OUTBOX_REQUIRE_BROKERS") == "1"),
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

// redisLeaks looks for Redis keys that start with testPrefix.
func redisLeaks(url string, required bool) leakCheck {
	connect := func() (*redis.Client, error) {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, err
		}
		return redis.NewClient(opts), nil
	}
	return leakCheck{server: "Redis keys", required: required,
		find: func(ctx context.Context) ([]string, error) {
			c, err := connect()
			if err != nil {
				return nil, err
			}
			defer c.Close()
			var left []string
			iter := c.Scan(ctx, 0, testPrefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				left = append(left, iter.Val())
			}
			slices.Sort(left)
			return slices.Compact(left), iter.Err()
		},
		remove: func(ctx context.Context, keys []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			defer c.Close()
			return c.Del(ctx, keys...).Err()
		},
	}
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

// leakEnv is the environment variable k, or def.
func leakEnv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// RunPrefix is testPrefix, for the scenarios of package reliability_test.
func RunPrefix() string { return testPrefix }

// RunName is testName, for the scenarios of package reliability_test.
func RunName(what string) string { return testName(what) }

// RabbitName is rabbitName, for the scenarios of package reliability_test.
func RabbitName(what string) string { return rabbitName(what) }

// mariaDBUserLeaks looks for MariaDB/MySQL accounts whose user name starts with testPrefix.
func mariaDBUserLeaks(dsn string, required bool) leakCheck {
	open := func(ctx context.Context) (*sql.DB, error) {
		db, err := sql.Open("mysql", dsn)
		if err == nil {
			if err = db.PingContext(ctx); err != nil {
				db.Close()
			}
		}
		return db, err
	}
	return leakCheck{server: "MariaDB accounts", required: required,
		find: func(ctx context.Context) ([]string, error) {
			db, err := open(ctx)
			if err != nil {
				return nil, err
			}
			defer db.Close()
			rows, err := db.QueryContext(ctx, "SELECT CONCAT(QUOTE(User), '@', QUOTE(Host)) FROM mysql.user WHERE LEFT(User, ?) = ?",
				len(testPrefix), testPrefix)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var left []string
			for rows.Next() {
				var account string
				if err := rows.Scan(&account); err != nil {
					return nil, err
				}
				left = append(left, account)
			}
			return left, rows.Err()
		},
		remove: func(ctx context.Context, accounts []string) error {
			db, err := open(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			var errs []error
			for _, account := range accounts {
				if _, err := db.ExecContext(ctx, "DROP USER IF EXISTS "+account); err != nil {
					errs = append(errs, fmt.Errorf("drop user %s: %w", account, err))
				}
			}
			return errors.Join(errs...)
		},
	}
}
