package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/gorm-outbox/outboxplugin"
)

// ready returns the status and body of /readyz.
func ready(t *testing.T, addr string) (int, string) {
	t.Helper()
	code, body, err := get(addr, "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	return code, body
}

// spentAttempts is the number of events of db's outbox that spent an attempt or are dead.
func spentAttempts(t *testing.T, d *testDB) int64 {
	t.Helper()
	var n int64
	if err := d.db.Table(outboxplugin.DefaultTableName).Where("attempts > 0 OR dead_at IS NOT NULL").Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// The classic deploy-order mistake — a relay into NATS before the stream that captures its subjects
// exists — spends no attempt and kills no event (even with --max-attempts 2), /readyz fails naming
// the subject while it lasts, and once the stream is created the events are published and /readyz
// recovers.
func TestRelayNATSWithoutStream(t *testing.T) {
	nc, err := nats.Connect(natsURL(), nats.Timeout(3*time.Second))
	if err != nil {
		brokerUnreachable(t, "NATS", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	// A top-level token of its own: no stream, of this test or another user, captures it.
	prefix := "cfg" + randomHex()
	if _, err := js.StreamNameBySubject(ctx, prefix+".>"); err != jetstream.ErrStreamNotFound {
		nc.Close()
		t.Fatalf("a stream already captures %s.>: %v", prefix, err)
	}
	stream := testName("cfg")
	t.Cleanup(func() {
		// Before the connection it needs is closed; a stream never created is no error.
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		if err := js.DeleteStream(dctx, stream); err != nil && err != jetstream.ErrStreamNotFound {
			t.Errorf("delete stream %s: %v", stream, err)
		}
		nc.Close()
	})

	d := newSQLiteDB(t)
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}
	const n = 30
	if err := emitEvents(t, d.db, 0, n); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := startRelay(t, nil, "relay", "--db", d.dsn, "--broker", natsURL(), "--subject-prefix", prefix,
		"--http", addr, "--poll-interval", "100ms", "--max-attempts", "2")
	eventually(t, 30*time.Second, "/readyz not ready, naming the subject", p, func() bool {
		code, body := ready(t, addr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, prefix)
	})
	// Long enough for --max-attempts 2 to have killed every event as refusals did.
	eventually(t, 30*time.Second, "publishes refused for the configuration", p, func() bool {
		return strings.Contains(p.stderr.String(), "outboxplugin: the broker did not take the events: a configuration error")
	})
	time.Sleep(time.Second)
	if spent := spentAttempts(t, d); spent != 0 {
		t.Fatalf("%d events spent an attempt or died\nstderr: %s", spent, p.stderr.String())
	}
	if pending := pendingCount(t, d.db); pending != n {
		t.Fatalf("%d events pending, want %d", pending, n)
	}
	out := p.stderr.String()
	for _, want := range []string{"relay started", "outboxplugin: worker started", "the publisher's start check found a configuration error"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "every event published once the stream exists", p, func() bool {
		return pendingCount(t, d.db) == 0
	})
	eventually(t, 30*time.Second, "/readyz ready again", p, func() bool {
		code, _ := ready(t, addr)
		return code == http.StatusOK
	})
	if code := p.stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM", code)
	}
	if !strings.Contains(p.stderr.String(), "outboxplugin: worker stopped") {
		t.Errorf("no stop line:\n%s", p.stderr.String())
	}
}

// Claims that fail — the outbox table dropped under a running relay — make /readyz fail, naming the
// claim; it recovers once the table is back.
func TestRelayReadyzWhenTheTableIsDropped(t *testing.T) {
	opts, err := redis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		brokerUnreachable(t, "Redis", err)
	}
	key := testName("cfgkey")
	t.Cleanup(func() {
		// Before the client it needs is closed.
		if err := rdb.Del(context.Background(), key).Err(); err != nil {
			t.Errorf("delete %s: %v", key, err)
		}
		rdb.Close()
	})
	d := newSQLiteDB(t)
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := startRelay(t, nil, "relay", "--db", d.dsn, "--broker", redisURL(), "--stream", key, "--http", addr, "--poll-interval", "100ms")
	eventually(t, 30*time.Second, "/readyz ready", p, func() bool {
		code, _ := ready(t, addr)
		return code == http.StatusOK
	})
	if err := d.db.Migrator().DropTable(outboxplugin.DefaultTableName); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "/readyz not ready, naming the claim", p, func() bool {
		code, body := ready(t, addr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "claim")
	})
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "/readyz ready again", p, func() bool {
		code, _ := ready(t, addr)
		return code == http.StatusOK
	})
	if code := p.stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM", code)
	}
}

// A RabbitMQ password the broker refuses is said as such — not "not reachable" — /readyz names it,
// and the password is never printed.
func TestRelayRabbitMQWrongPassword(t *testing.T) {
	const password = "Wr0ngPassw0rdX"
	u := rabbitURL()
	scheme, rest, _ := strings.Cut(u, "://")
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		t.Skip("OUTBOX_RABBITMQ_URL has no credentials to spoil")
	}
	user, _, _ := strings.Cut(rest[:at], ":")
	broker := scheme + "://" + user + ":" + password + "@" + rest[at+1:]
	d := newSQLiteDB(t)
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := startRelay(t, nil, "relay", "--db", d.dsn, "--broker", broker, "--http", addr)
	eventually(t, 30*time.Second, "the refused credentials logged", p, func() bool {
		return strings.Contains(p.stderr.String(), "RabbitMQ: broker refused the credentials")
	})
	code, body := ready(t, addr)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "refused the credentials") {
		t.Errorf("/readyz: %d %s", code, body)
	}
	if code := p.stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM", code)
	}
	if out := p.stdout.String() + p.stderr.String() + body; strings.Contains(out, password) {
		t.Errorf("the password was printed:\n%s", out)
	}
	if strings.Contains(p.stderr.String(), "not reachable") {
		t.Errorf("a refused login logged as unreachable:\n%s", p.stderr.String())
	}
}
