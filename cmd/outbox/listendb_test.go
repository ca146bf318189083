package main

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gorm-outbox/outboxplugin"
)

// `outbox relay --listen-db`: the LISTEN connections on the PostgreSQL server itself, when --db goes
// through a transaction pooler. .ci/run runs this package a second time through its PgBouncer in
// transaction mode (OUTBOX_POSTGRES_POOLER=transaction, OUTBOX_POSTGRES_DSN the pooler's), which is
// where TestRelayListenDB checks what the flag is for; straight to PostgreSQL it checks that the flag
// changes nothing there.

// postgresDirectDSN is the DSN of the PostgreSQL server itself, not through a pooler
// (OUTBOX_POSTGRES_DIRECT_DSN, or the server's default address).
func postgresDirectDSN() string {
	if dsn := os.Getenv("OUTBOX_POSTGRES_DIRECT_DSN"); dsn != "" {
		return dsn
	}
	return "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"
}

// directDSN is the DSN of d's database on the PostgreSQL server itself: the same database as d.dsn,
// which may go through the pooler.
func directDSN(t *testing.T, d *testDB) string {
	t.Helper()
	dbname := dbnameRE.FindString(d.dsn)
	if dbname == "" {
		t.Fatalf("no dbname= in the test database's DSN %q", d.dsn)
	}
	if dsn := postgresDirectDSN(); dbnameRE.MatchString(dsn) {
		return dbnameRE.ReplaceAllString(dsn, dbname)
	}
	return postgresDirectDSN() + " " + dbname
}

// TestRelayListenDB runs the relay with a poll of ten minutes, longer than the test waits, so that
// only a notification can get an event committed after the start published in time. Without
// --listen-db, through a transaction pooler, the workers' self-test finds that notifications do not
// reach their LISTEN connection and says so (straight to PostgreSQL it passes): that case shows the
// pooler is really in the way. With --listen-db on the server itself every worker's self-test passes
// — each gets a connection of the pool the relay sizes — and a commit through --db wakes the relay.
func TestRelayListenDB(t *testing.T) {
	const (
		passed  = "LISTEN self-test passed"
		failed  = "notifications do not reach the LISTEN connection"
		workers = 2
	)
	nc, err := nats.Connect(natsURL(), nats.Timeout(3*time.Second))
	if err != nil {
		brokerUnreachable(t, "NATS", err)
	}
	// Closed after the streams' deletion below: cleanups run last first.
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	d := newServerDB(t, servers[0])
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}
	behindPooler := os.Getenv("OUTBOX_POSTGRES_POOLER") != ""

	for _, c := range []struct {
		name     string
		listenDB bool
		woken    bool // the self-test passes, and a commit wakes the relay
	}{
		{"without --listen-db", false, !behindPooler},
		{"with --listen-db", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			prefix, streamName := testName("subject"), testName("stream")
			stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{prefix + ".>"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := js.DeleteStream(ctx, streamName); err != nil {
					t.Errorf("delete stream %s: %v", streamName, err)
				}
			})

			args := []string{"relay", "--db", d.dsn, "--broker", natsURL(), "--subject-prefix", prefix, "--stream", streamName,
				"--workers", strconv.Itoa(workers), "--poll-interval", "10m", "--log-level", "debug", "--http", ""}
			if c.listenDB {
				args = append(args, "--listen-db", directDSN(t, d))
			}
			p := startRelay(t, nil, args...)
			// The self-test waits up to 10 s for its notification before it gives up.
			eventually(t, 45*time.Second, "every worker's LISTEN self-test", p, func() bool {
				out := p.stderr.String()
				return strings.Count(out, passed)+strings.Count(out, failed) >= workers
			})
			out := p.stderr.String()
			if n := strings.Count(out, passed); c.woken && n != workers {
				t.Fatalf("%d of %d workers' LISTEN self-tests passed, want all\nstderr: %s", n, workers, out)
			}
			if n := strings.Count(out, failed); !c.woken && n != workers {
				t.Fatalf("%d of %d workers said notifications do not reach them, want all (is OUTBOX_POSTGRES_DSN the pooler's?)\nstderr: %s",
					n, workers, out)
			}
			if strings.Contains(out, "listen_db=") != c.listenDB {
				t.Errorf("the start line names listen_db: %v, want %v\nstderr: %s", !c.listenDB, c.listenDB, out)
			}
			if c.woken {
				if err := emitEvents(t, d.db, 0, 1); err != nil {
					t.Fatal(err)
				}
				eventually(t, 20*time.Second, "the event committed after the start published (the next poll is 10 minutes away)", p, func() bool {
					info, err := stream.Info(ctx)
					return err == nil && info.State.Msgs == 1
				})
			}
			if code := p.stop(t); code != 0 {
				t.Fatalf("relay after SIGTERM: exit %d\nstderr: %s", code, p.stderr.String())
			}
		})
	}
}

// TestRelayListenDBCredentialsNeverPrinted: the password of --listen-db, given on the command line,
// by its variable or in a file, is printed nowhere — not in the start line, which names the LISTEN
// DSN, nor where the LISTEN connection's failures are logged, nor in /readyz.
func TestRelayListenDBCredentialsNeverPrinted(t *testing.T) {
	// Characters a URL has to encode: the redaction takes out the encoded form too.
	const password = "S3cretListen/P@ss"
	d := newServerDB(t, servers[0])
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}
	// Nothing listens on port 1: the LISTEN connection fails, and its error is logged.
	keyValue := "host=127.0.0.1 port=1 user=u password='" + password + "' dbname=x sslmode=disable"
	listenFile := filepath.Join(t.TempDir(), "listen")
	if err := os.WriteFile(listenFile, []byte(keyValue+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
		args []string
	}{
		{"URL", nil, []string{"--listen-db", "postgres://u:" + url.QueryEscape(password) + "@127.0.0.1:1/x?sslmode=disable"}},
		{"key=value", nil, []string{"--listen-db", keyValue}},
		{"OUTBOX_LISTEN_DB", []string{"OUTBOX_LISTEN_DB=" + keyValue}, nil},
		{"--listen-db-file", nil, []string{"--listen-db-file", listenFile}},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := freeAddr(t)
			p := startRelay(t, c.env, append([]string{"relay", "--db", d.dsn, "--broker", "nats://127.0.0.1:1", "--http", addr,
				"--workers", "1"}, c.args...)...)
			eventually(t, 20*time.Second, "the LISTEN connection's failure logged", p, func() bool {
				out := p.stderr.String()
				return strings.Contains(out, "relay started") && strings.Contains(out, "LISTEN connection lost")
			})
			if out := p.stderr.String(); !strings.Contains(out, "listen_db=") || !strings.Contains(out, redacted) {
				t.Errorf("the start line does not name the redacted LISTEN DSN:\n%s", out)
			}
			code, body, err := get(addr, "/readyz")
			if err != nil || code != http.StatusServiceUnavailable {
				t.Errorf("/readyz with NATS down: %d %q %v", code, body, err)
			}
			if strings.Contains(body, "S3cret") {
				t.Errorf("/readyz printed the password: %s", body)
			}
			if code := p.stop(t); code != 0 {
				t.Errorf("exit %d after SIGTERM", code)
			}
			if out := p.stdout.String() + p.stderr.String(); strings.Contains(out, "S3cret") {
				t.Errorf("the password was printed:\n%s", out)
			}
		})
	}
}

// TestRelayListenDBUsageErrors: a --listen-db the relay cannot use is a usage error, before anything
// is opened, that says what to do and quotes no password.
func TestRelayListenDBUsageErrors(t *testing.T) {
	const password = "S3cretPassw0rd"
	// Nothing listens on port 1: a relay that went past the usage errors would retry the database
	// until the test's timeout, not exit 2.
	pg := "postgres://u:" + password + "@127.0.0.1:1/x"
	listen := "host=127.0.0.1 port=1 user=u password=" + password + " dbname=x"
	sqlite := filepath.Join(t.TempDir(), "outbox.db")
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	listenFile := filepath.Join(t.TempDir(), "listen")
	if err := os.WriteFile(listenFile, []byte(listen), 0o600); err != nil {
		t.Fatal(err)
	}
	const notPostgres = "--listen-db: not a PostgreSQL DSN: give a postgres:// URL or a key=value DSN"
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string // in the error
	}{
		{"with --without-listen", nil, []string{"--db", pg, "--listen-db", listen, "--without-listen"},
			"--listen-db and --without-listen are exclusive"},
		{"OUTBOX_LISTEN_DB with --without-listen", []string{"OUTBOX_LISTEN_DB=" + listen}, []string{"--db", pg, "--without-listen"},
			"--listen-db and --without-listen are exclusive"},
		{"--listen-db-file with --without-listen", nil, []string{"--db", pg, "--listen-db-file", listenFile, "--without-listen"},
			"--listen-db and --without-listen are exclusive"},
		{"a SQLite --db", nil, []string{"--db", sqlite, "--listen-db", listen},
			"--listen-db is for PostgreSQL, and --db is sqlite, which has no LISTEN wake-up: remove --listen-db"},
		{"a MySQL --db", nil, []string{"--db", "u:" + password + "@tcp(127.0.0.1:1)/x", "--listen-db", listen},
			"--listen-db is for PostgreSQL, and --db is mysql"},
		{"a MySQL --listen-db", nil, []string{"--db", pg, "--listen-db", "u:" + password + "@tcp(127.0.0.1:1)/x"}, notPostgres},
		{"a mysql:// --listen-db", nil, []string{"--db", pg, "--listen-db", "mysql://u:" + password + "@127.0.0.1:1/x"}, notPostgres},
		{"a SQLite --listen-db", nil, []string{"--db", pg, "--listen-db", "listen.db"}, notPostgres},
		{"a --listen-db of no database", nil, []string{"--db", pg, "--listen-db", "user=u password=" + password}, notPostgres},
		{"a postgres:// URL pgx cannot read", nil, []string{"--db", pg, "--listen-db", "postgres://u:" + password + "@127.0.0.1:bad/x"},
			"--listen-db: "},
		{"a key=value DSN pgx cannot read", nil, []string{"--db", pg, "--listen-db", "host=127.0.0.1 port=bad password=" + password},
			"--listen-db: "},
		{"--listen-db and --listen-db-file", nil, []string{"--db", pg, "--listen-db", listen, "--listen-db-file", listenFile},
			"--listen-db and --listen-db-file are exclusive: give one"},
		{"a missing --listen-db-file", nil, []string{"--db", pg, "--listen-db-file", filepath.Join(t.TempDir(), "missing")},
			"--listen-db-file: "},
		{"an empty --listen-db-file", nil, []string{"--db", pg, "--listen-db-file", empty}, "--listen-db-file " + empty + " is empty"},
		{"an empty OUTBOX_LISTEN_DB_FILE", []string{"OUTBOX_LISTEN_DB_FILE=" + empty}, []string{"--db", pg}, "is empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := cli(t, c.env, nil, append([]string{"relay", "--broker", "nats://127.0.0.1:1", "--http", ""}, c.args...)...)
			if r.code != exitUsage || !strings.HasPrefix(r.stderr, "outbox: ") || !strings.Contains(r.stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and an error containing %q", r.code, r.stderr, exitUsage, c.want)
			}
			if strings.Contains(r.stdout+r.stderr, "S3cret") {
				t.Errorf("the password was printed: %s", r.stderr)
			}
		})
	}
	if _, err := os.Stat(sqlite); err == nil {
		t.Error("a usage error opened (and created) the SQLite database")
	}
}
