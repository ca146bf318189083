package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// The relay tests run `outbox relay` against real brokers: NATS (OUTBOX_NATS_URL, default
// nats://127.0.0.1:4222) and Redis (OUTBOX_REDIS_URL, default redis://127.0.0.1:6379/0). An
// unreachable broker skips its test, or fails it with OUTBOX_REQUIRE_BROKERS=1.

func natsURL() string {
	if u := os.Getenv("OUTBOX_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

func redisURL() string {
	if u := os.Getenv("OUTBOX_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// brokerUnreachable skips the test, or fails it with OUTBOX_REQUIRE_BROKERS=1.
func brokerUnreachable(t *testing.T, name string, err error) {
	t.Helper()
	if os.Getenv("OUTBOX_REQUIRE_BROKERS") == "1" {
		t.Fatalf("%s unreachable (OUTBOX_REQUIRE_BROKERS=1): %v", name, err)
	}
	t.Skipf("%s unreachable: %v", name, err)
}

// syncBuffer is a buffer the process writes to while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// relayProc is a running `outbox relay`.
type relayProc struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{}
	code           int
}

// startRelay starts the binary with args, the environment of the test less every OUTBOX_
// variable plus env; it is killed when t ends if still running.
func startRelay(t *testing.T, env []string, args ...string) *relayProc {
	t.Helper()
	p := &relayProc{done: make(chan struct{})}
	p.cmd = exec.Command(binary, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.cmd.Wait()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			p.code = exitErr.ExitCode()
		} else if err != nil {
			p.code = -1
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit code, failing the test if the process does not end in
// time.
func (p *relayProc) stop(t *testing.T) int {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.code
	case <-time.After(20 * time.Second):
		t.Fatalf("relay did not stop after SIGTERM\nstderr: %s", p.stderr.String())
	}
	return -1
}

// freeAddr returns a local address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// eventually polls cond every 50 ms until it returns true, and fails the test after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, p *relayProc, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if p != nil {
			select {
			case <-p.done:
				t.Fatalf("%s: relay exited %d\nstderr: %s", what, p.code, p.stderr.String())
			default:
			}
		}
		if time.Now().After(deadline) {
			stderr := ""
			if p != nil {
				stderr = p.stderr.String()
			}
			t.Fatalf("%s: not within %v\nstderr: %s", what, timeout, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// get returns the status and body of GET http://addr/path, or an error.
func get(addr, path string) (int, string, error) {
	client := http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// sentMessages returns the messages the relay reported published in /metrics: the sum of
// messaging_client_sent_messages without an error_type.
func sentMessages(addr string) (int64, error) {
	code, body, err := get(addr, "/metrics")
	if err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("/metrics: %d %w", code, err)
	}
	var sum int64
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "messaging_client_sent_messages") || strings.Contains(line, "error_type") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("/metrics line %q: %w", line, err)
		}
		sum += int64(v)
	}
	return sum, sc.Err()
}

// emitEvents writes n events with the core package, in transactions of 50.
func emitEvents(t *testing.T, db *gorm.DB, from, n int) error {
	for i := from; i < from+n; i += 50 {
		err := db.Transaction(func(tx *gorm.DB) error {
			for j := i; j < min(i+50, from+n); j++ {
				if err := outboxplugin.Emit(tx, "OrderPlaced", map[string]any{"order_id": j},
					outboxplugin.WithAggregate("order", strconv.Itoa(j%17))); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// pendingCount is the number of unprocessed events of db's outbox.
func pendingCount(t *testing.T, db *gorm.DB) int64 {
	t.Helper()
	var n int64
	if err := db.Table(outboxplugin.DefaultTableName).Where("processed = ?", false).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// messageIDs is the set of message ids in db's outbox.
func messageIDs(t *testing.T, db *gorm.DB) map[string]bool {
	t.Helper()
	var ids []string
	if err := db.Table(outboxplugin.DefaultTableName).Pluck("message_id", &ids).Error; err != nil {
		t.Fatal(err)
	}
	set := make(map[string]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return set
}

func TestRelayNATSPostgres(t *testing.T) {
	const n = 2000
	nc, err := nats.Connect(natsURL(), nats.Timeout(3*time.Second))
	if err != nil {
		brokerUnreachable(t, "NATS", err)
	}
	// Closed after the stream's deletion below: cleanups run last first.
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	d := newServerDB(t, servers[0])
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}

	prefix, streamName := testName("subject"), testName("stream")
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{prefix + ".>"},
		Duplicates: 10 * time.Minute})
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

	if err := emitEvents(t, d.db, 0, n); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	args := []string{"relay", "--db", d.dsn, "--broker", natsURL(), "--workers", "2", "--http", addr,
		"--subject-prefix", prefix, "--stream", streamName, "--publish-timeout", "5s", "--log-level", "warn"}
	p := startRelay(t, nil, args...)
	eventually(t, 30*time.Second, "the first events published", p, func() bool {
		sent, err := sentMessages(addr)
		return err == nil && sent >= n
	})
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body, err := get(addr, path); err != nil || code != http.StatusOK {
			t.Errorf("%s: %d %q %v", path, code, body, err)
		}
	}

	// SIGTERM while events are being written: the relay stops cleanly, and the rest are drained by
	// the next run.
	inserted := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		var once sync.Once
		var err error
		for i := n; i < 2*n && err == nil; i += 100 {
			err = emitEvents(t, d.db, i, 100)
			once.Do(func() { close(started) })
		}
		inserted <- err
	}()
	<-started
	if code := p.stop(t); code != 0 {
		t.Fatalf("relay after SIGTERM: exit %d\nstderr: %s", code, p.stderr.String())
	}
	if err := <-inserted; err != nil {
		t.Fatal(err)
	}

	p = startRelay(t, nil, args...)
	eventually(t, 30*time.Second, "the outbox drained", p, func() bool { return pendingCount(t, d.db) == 0 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("second relay after SIGTERM: exit %d\nstderr: %s", code, p.stderr.String())
	}

	want := messageIDs(t, d.db)
	if len(want) != 2*n {
		t.Fatalf("%d events in the outbox, want %d", len(want), 2*n)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(2*n) {
		t.Errorf("%d messages in the stream, want %d (one per event: Nats-Msg-Id dedup)", info.State.Msgs, 2*n)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[string]bool, 2*n)
	for uint64(len(got)) < info.State.Msgs {
		batch, err := cons.FetchNoWait(1000)
		if err != nil {
			t.Fatal(err)
		}
		count := 0
		for m := range batch.Messages() {
			got[m.Headers().Get(jetstream.MsgIDHeader)] = true
			count++
		}
		if count == 0 {
			break
		}
	}
	for id := range want {
		if !got[id] {
			t.Errorf("event %s is not in the stream", id)
			break
		}
	}
	if pending := pendingCount(t, d.db); pending != 0 {
		t.Errorf("%d events pending after the drain", pending)
	}
}

// smallRun writes n events to a SQLite outbox, runs `outbox relay` with args until the outbox is
// drained, checks /readyz and a clean stop, and returns the message ids of the events and what the
// relay printed.
func smallRun(t *testing.T, n int, args ...string) (map[string]bool, string) {
	t.Helper()
	d := newSQLiteDB(t)
	if err := outboxplugin.AutoMigrate(d.db); err != nil {
		t.Fatal(err)
	}
	if err := emitEvents(t, d.db, 0, n); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := startRelay(t, nil, append([]string{"relay", "--db", d.dsn, "--http", addr, "--poll-interval", "100ms",
		"--log-format", "json"}, args...)...)
	eventually(t, 20*time.Second, "the outbox drained", p, func() bool { return pendingCount(t, d.db) == 0 })
	if code, body, err := get(addr, "/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("/readyz: %d %q %v", code, body, err)
	}
	if sent, err := sentMessages(addr); err != nil || sent != int64(n) {
		t.Errorf("/metrics: %d messages sent, want %d (%v)", sent, n, err)
	}
	// The table health the workers read as they start: the SQLite file's size, no partition.
	if _, body, err := get(addr, "/metrics"); err != nil ||
		!regexp.MustCompile(`(?m)^outbox_table_size_bytes(\{[^}]*\})? [1-9][0-9.e+]*$`).MatchString(body) ||
		!regexp.MustCompile(`(?m)^outbox_partitions(\{[^}]*\})? 0$`).MatchString(body) {
		t.Errorf("/metrics has no table size or partition count (%v):\n%s", err, body)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("relay after SIGTERM: exit %d\nstderr: %s", code, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), `"msg":"relay started"`) {
		t.Errorf("--log-format json: stderr %q", p.stderr.String())
	}
	return messageIDs(t, d.db), p.stdout.String() + p.stderr.String()
}

// checkAll fails the test unless every id of want is in got.
func checkAll(t *testing.T, want, got map[string]bool, where string) {
	t.Helper()
	for id := range want {
		if !got[id] {
			t.Errorf("event %s is not in %s (%d there, %d events)", id, where, len(got), len(want))
			return
		}
	}
}

func TestRelayRedisSQLite(t *testing.T) {
	opts, err := redis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	// Closed after the key's deletion below: cleanups run last first.
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		brokerUnreachable(t, "Redis", err)
	}
	key := testName("stream")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rdb.Del(ctx, key).Err(); err != nil {
			t.Errorf("delete stream %s: %v", key, err)
		}
	})

	want, _ := smallRun(t, 200, "--broker", redisURL(), "--stream", key)
	entries, err := rdb.XRange(ctx, key, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, e := range entries {
		id, _ := e.Values[outboxplugin.HeaderID].(string)
		got[id] = true
	}
	checkAll(t, want, got, "the stream "+key)
}

func TestRelayRabbitMQSQLite(t *testing.T) {
	url := rabbitURL()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		brokerUnreachable(t, "RabbitMQ", err)
	}
	// Closed after the exchange's and the queue's deletion below: cleanups run last first.
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	exchange, queue := rabbitName("exchange"), rabbitName("queue")
	t.Cleanup(func() {
		// On a channel of its own: the test's may have been closed by an error. Deleting what does
		// not exist succeeds.
		admin, err := conn.Channel()
		if err == nil {
			if _, err = admin.QueueDelete(queue, false, false, false); err == nil {
				err = admin.ExchangeDelete(exchange, false, false)
			}
		}
		if err != nil {
			t.Errorf("delete queue and exchange %s, %s: %v", queue, exchange, err)
		}
	})
	// Declared as the publisher declares it: durable, of kind topic.
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare(queue, false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}

	want, _ := smallRun(t, 200, "--broker", url, "--exchange", exchange)
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for len(got) < len(want) {
		select {
		case d := <-deliveries:
			got[d.MessageId] = true
		case <-timeout:
			checkAll(t, want, got, "the queue")
			return
		}
	}
	checkAll(t, want, got, "the queue")
}

func rabbitURL() string {
	if u := os.Getenv("OUTBOX_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// newKafka starts franz-go's in-process Kafka (kfake), which needs no server, with two brokers,
// opts and a topic of its own; it is closed when t ends.
func newKafka(t *testing.T, opts ...kfake.Opt) (cluster *kfake.Cluster, topic string) {
	t.Helper()
	topic = "outboxcli." + randomHex()
	cluster, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(2), kfake.SeedTopics(1, topic)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	return cluster, topic
}

// kafkaIDs reads topic from its start with a client of opts and returns the outbox message ids of its
// records, once it has want of them or after 10 s.
func kafkaIDs(t *testing.T, cluster *kfake.Cluster, topic string, want int, opts ...kgo.Opt) map[string]bool {
	t.Helper()
	client, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got := map[string]bool{}
	for len(got) < want && ctx.Err() == nil {
		client.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == outboxplugin.HeaderID {
					got[string(h.Value)] = true
				}
			}
		})
	}
	return got
}

func TestRelayKafkaSQLite(t *testing.T) {
	cluster, topic := newKafka(t)
	broker := "kafka://" + strings.Join(cluster.ListenAddrs(), ",")

	want, _ := smallRun(t, 200, "--broker", broker, "--topic", topic)
	checkAll(t, want, kafkaIDs(t, cluster, topic, len(want)), "the topic")
}

// selfSignedTLS returns the server configuration of a new self-signed certificate of 127.0.0.1, and
// the path of a PEM file of the certificate.
func selfSignedTLS(t *testing.T) (*tls.Config, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kfake"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, path
}

// TestRelayKafkaAuth runs the relay against kfake with SASL, TLS or both: every event is delivered
// with the mechanism the URL names (SCRAM-SHA-512 when it names none), and the password is never
// printed.
func TestRelayKafkaAuth(t *testing.T) {
	// Characters a URL has to encode, in the user and the password: decoded, they log in.
	const user, password = "relay@outbox", "S3cretPassw0rd,:/?#@%+"
	creds := url.QueryEscape(user) + ":" + url.QueryEscape(password) + "@"
	for _, c := range []struct {
		name   string
		method string // kfake's SASL mechanism; "" without SASL
		tls    bool
		broker func(addrs []string) string
	}{
		{"SCRAM-SHA-512 by default", "SCRAM-SHA-512", false, func(a []string) string {
			return "kafka://" + creds + a[0] + "," + a[1]
		}},
		{"SCRAM-SHA-256, credentials repeated", "SCRAM-SHA-256", false, func(a []string) string {
			return "kafka://" + creds + a[0] + ",kafka://" + creds + a[1] + "?sasl=scram-sha-256"
		}},
		{"PLAIN", "PLAIN", false, func(a []string) string {
			return "kafka://" + creds + a[0] + "," + a[1] + "?sasl=PLAIN"
		}},
		{"TLS and PLAIN", "PLAIN", true, func(a []string) string {
			return "kafkas://" + creds + a[0] + "/?sasl=plain," + a[1]
		}},
		{"TLS and SCRAM-SHA-512", "SCRAM-SHA-512", true, func(a []string) string {
			return "kafkas://" + creds + a[0] + "," + a[1] + "?sasl=scram-sha-512"
		}},
		{"TLS without SASL", "", true, func(a []string) string {
			return "kafkas://" + a[0] + ",kafkas://" + a[1]
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var kopts []kfake.Opt
			var copts []kgo.Opt // the test's consumer
			var args []string
			switch c.method {
			case "PLAIN":
				copts = append(copts, kgo.SASL(plain.Auth{User: user, Pass: password}.AsMechanism()))
			case "SCRAM-SHA-256":
				copts = append(copts, kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha256Mechanism()))
			case "SCRAM-SHA-512":
				copts = append(copts, kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha512Mechanism()))
			}
			if c.method != "" {
				kopts = append(kopts, kfake.EnableSASL(), kfake.Superuser(c.method, user, password))
			}
			if c.tls {
				serverTLS, caPath := selfSignedTLS(t)
				kopts = append(kopts, kfake.TLS(serverTLS))
				pool := x509.NewCertPool()
				pemBytes, err := os.ReadFile(caPath)
				if err != nil || !pool.AppendCertsFromPEM(pemBytes) {
					t.Fatalf("the test's CA: %v", err)
				}
				copts = append(copts, kgo.DialTLSConfig(&tls.Config{RootCAs: pool}))
				args = append(args, "--kafka-ca-file", caPath)
			}
			cluster, topic := newKafka(t, kopts...)

			want, out := smallRun(t, 100, append(args, "--broker", c.broker(cluster.ListenAddrs()), "--topic", topic)...)
			checkAll(t, want, kafkaIDs(t, cluster, topic, len(want), copts...), "the topic")
			if strings.Contains(out, "S3cret") {
				t.Errorf("the password was printed:\n%s", out)
			}
			if warned := strings.Contains(out, "SASL PLAIN without TLS"); warned != (c.method == "PLAIN" && !c.tls) {
				t.Errorf("warning of PLAIN without TLS: %v, want %v:\n%s", warned, !warned, out)
			}
		})
	}
}

// TestRelayKafkaWrongPassword: a login the broker refuses delivers nothing, /readyz says the broker is
// not connected, and the password is printed nowhere.
func TestRelayKafkaWrongPassword(t *testing.T) {
	const password = "S3cretPassw0rd"
	for _, mechanism := range []string{"SCRAM-SHA-512", "PLAIN"} {
		t.Run(mechanism, func(t *testing.T) {
			cluster, topic := newKafka(t, kfake.EnableSASL(), kfake.Superuser(mechanism, "relay", "the-right-one"))
			d := newSQLiteDB(t)
			if err := outboxplugin.AutoMigrate(d.db); err != nil {
				t.Fatal(err)
			}
			const n = 20
			if err := emitEvents(t, d.db, 0, n); err != nil {
				t.Fatal(err)
			}
			addrs := cluster.ListenAddrs()
			broker := "kafka://relay:" + password + "@" + addrs[0] + "," + addrs[1] + "?sasl=" + strings.ToLower(mechanism)
			addr := freeAddr(t)
			p := startRelay(t, nil, "relay", "--db", d.dsn, "--broker", broker, "--topic", topic, "--http", addr,
				"--poll-interval", "100ms", "--publish-timeout", "2s")
			eventually(t, 20*time.Second, "a publish that failed", p, func() bool {
				out := p.stderr.String()
				return strings.Contains(out, "outboxplugin: publish refused") || strings.Contains(out, "outboxplugin: the broker did not take")
			})
			code, body, err := get(addr, "/readyz")
			if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "broker") {
				t.Errorf("/readyz: %d %q %v", code, body, err)
			}
			if strings.Contains(body, password) {
				t.Errorf("/readyz printed the password: %s", body)
			}
			if pending := pendingCount(t, d.db); pending != n {
				t.Errorf("%d events pending, want all %d", pending, n)
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

func TestRelayCredentialsNeverPrinted(t *testing.T) {
	const password = "S3cretPassw0rd"
	sqlite := filepath.Join(t.TempDir(), "outbox.db")
	d := openTestDB(t, sqlite)
	if err := outboxplugin.AutoMigrate(d); err != nil {
		t.Fatal(err)
	}
	closeDB(d)
	for _, c := range []struct {
		name, db, broker string
		// waitFor is the line of stderr the test waits for before it reads /readyz and stops the relay.
		waitFor string
	}{
		{"database down", "postgres://u:" + password + "@127.0.0.1:1/x", "nats://u:" + password + "@127.0.0.1:1", "retrying"},
		{"NATS down", sqlite, "nats://u:" + password + "@127.0.0.1:1", "relay started"},
		{"Redis down", sqlite, "redis://u:" + password + "@127.0.0.1:1/0", "relay started"},
		{"RabbitMQ down", sqlite, "amqp://u:" + password + "@127.0.0.1:1/", "retrying"},
		{"Kafka down", sqlite, "kafka://u:" + password + "@127.0.0.1:1,127.0.0.1:2", "relay started"},
		{"Kafka over TLS down", sqlite, "kafkas://u:" + password + "@127.0.0.1:1,u:" + password + "@127.0.0.1:2?sasl=plain", "relay started"},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := freeAddr(t)
			p := startRelay(t, nil, "relay", "--db", c.db, "--broker", c.broker, "--http", addr)
			eventually(t, 15*time.Second, "the line "+c.waitFor, p, func() bool { return strings.Contains(p.stderr.String(), c.waitFor) })
			code, body, err := get(addr, "/readyz")
			if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, `"reason"`) {
				t.Errorf("/readyz: %d %q %v", code, body, err)
			}
			if strings.Contains(body, password) {
				t.Errorf("/readyz printed the password: %s", body)
			}
			if code := p.stop(t); code != 0 {
				t.Errorf("exit %d after SIGTERM", code)
			}
			if out := p.stdout.String() + p.stderr.String(); strings.Contains(out, password) || strings.Contains(out, "S3cret") {
				t.Errorf("the password was printed:\n%s", out)
			}
		})
	}
	// The broker URL from a file: redacted the same way, and its content never quoted by a usage error.
	brokerFile := filepath.Join(t.TempDir(), "broker")
	if err := os.WriteFile(brokerFile, []byte("amqp://u:"+password+"@127.0.0.1:1/\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startRelay(t, nil, "relay", "--db", sqlite, "--broker-file", brokerFile, "--http", "")
	eventually(t, 15*time.Second, "the line retrying", p, func() bool { return strings.Contains(p.stderr.String(), "retrying") })
	if code := p.stop(t); code != 0 {
		t.Errorf("--broker-file: exit %d after SIGTERM", code)
	}
	if out := p.stdout.String() + p.stderr.String(); strings.Contains(out, password) || !strings.Contains(out, "RabbitMQ") {
		t.Errorf("--broker-file: the password was printed, or the broker not named:\n%s", out)
	}
	for _, args := range [][]string{
		{"--broker-file", brokerFile, "--broker", "nats://127.0.0.1:1"},
		{"--broker-file", filepath.Join(t.TempDir(), "missing")},
	} {
		r := wantCode(t, exitUsage, append([]string{"relay", "--db", sqlite, "--http", ""}, args...)...)
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Errorf("%v: the password was printed: %s", args, r.stderr)
		}
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantCode(t, exitUsage, "relay", "--db", sqlite, "--http", "", "--broker-file", empty)
	// The file is taken from OUTBOX_BROKER_FILE too.
	r := cli(t, []string{"OUTBOX_BROKER_FILE=" + empty}, nil, "relay", "--db", sqlite, "--http", "")
	if r.code != exitUsage || !strings.Contains(r.stderr, "empty") {
		t.Errorf("OUTBOX_BROKER_FILE of an empty file: exit %d: %s", r.code, r.stderr)
	}

	r = cli(t, []string{"OUTBOX_BROKER=nats://u:" + password + "@127.0.0.1:1"}, nil, "relay", "--help")
	if r.code != 0 || strings.Contains(r.stdout+r.stderr, password) {
		t.Errorf("relay --help with OUTBOX_BROKER: exit %d, printed the password: %v", r.code, strings.Contains(r.stdout, password))
	}
	// An error message of a bad URL does not quote it.
	r = wantCode(t, exitUsage, "relay", "--db", sqlite, "--http", "", "--broker", "redis://u:"+password+"@127.0.0.1:bad/0")
	if strings.Contains(r.stdout+r.stderr, password) {
		t.Errorf("bad redis URL: the password was printed: %s", r.stderr)
	}
}

func TestRelayUsageErrors(t *testing.T) {
	db := filepath.Join(t.TempDir(), "outbox.db")
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--broker", "mqtt://127.0.0.1:1883"},
		{"--broker", "kafka://127.0.0.1"},
		{"--broker", "kafka://127.0.0.1:9092", "--kafka-ca-file", filepath.Join(t.TempDir(), "missing.pem")},
		{"--broker", "kafkas://127.0.0.1:9092", "--kafka-ca-file", notPEM},
		{"--broker", "amqp://guest:guest@127.0.0.1:5672/", "--exchange", ""},
		{"--broker", "127.0.0.1:4222"},
		{},
		{"--broker", "nats://127.0.0.1:1", "--workers", "0"},
		{"--broker", "nats://127.0.0.1:1", "--workers", "-1"},
		{"--broker", "nats://127.0.0.1:1", "--poll-interval", "-1s"},
		{"--broker", "nats://127.0.0.1:1", "--log-format", "xml"},
		{"--broker", "nats://127.0.0.1:1", "--log-level", "loud"},
		{"--broker", "nats://127.0.0.1:1", "--subject-prefix", "a.*"},
		{"--broker", "nats://127.0.0.1:1", "extra"},
	} {
		r := wantCode(t, exitUsage, append([]string{"relay", "--db", db, "--http", ""}, args...)...)
		if !strings.HasPrefix(r.stderr, "outbox: ") {
			t.Errorf("%v: stderr %q", args, r.stderr)
		}
	}
	// Kafka URLs the relay refuses, without printing their password.
	const password = "S3cretPassw0rd"
	for _, broker := range []string{
		"kafka://127.0.0.1:9092,u:" + password + "@127.0.0.1:9093",                            // credentials on a later seed only
		"kafka://u:" + password + "@127.0.0.1:9092,kafka://v:" + password + "@127.0.0.1:9093", // two logins
		"kafka://u:" + password + "@127.0.0.1:9092?sasl=gssapi",                               // a mechanism not supported
		"kafka://u:" + password + "@127.0.0.1:9092?sasl=plain&sasl=scram-sha-512",             // two mechanisms
		"kafka://u:" + password + "@127.0.0.1:9092?mechanism=plain",                           // an unknown parameter
		"kafkas://u:" + password + "@127.0.0.1:9092,kafka://127.0.0.1:9093",                   // TLS to one broker only
		"kafka://:" + password + "@127.0.0.1:9092",                                            // no user
		"kafka://u:" + password + "%zz@127.0.0.1:9092",                                        // not URL-encoded
		"kafka://u:" + password + ",x@127.0.0.1:9092",                                         // a comma not URL-encoded
		"kafka://127.0.0.1:9092?sasl=plain",                                                   // a mechanism without credentials
		"kafka://u@127.0.0.1:9092",                                                            // no password
	} {
		r := wantCode(t, exitUsage, "relay", "--db", db, "--http", "", "--broker", broker)
		if !strings.HasPrefix(r.stderr, "outbox: --broker: ") || strings.Contains(r.stdout+r.stderr, "S3cret") {
			t.Errorf("--broker %s: stderr %q, want a usage error that does not quote the URL", broker, r.stderr)
		}
	}
	if _, err := os.Stat(db); err == nil {
		t.Error("a usage error opened (and created) the SQLite database")
	}
	r := wantCode(t, exitUsage, "relay", "--db", db, "--http", "", "--broker", "mqtt://127.0.0.1:1883")
	if !strings.Contains(r.stderr, "unknown scheme") || !strings.Contains(r.stderr, "kafka://") {
		t.Errorf("mqtt:// refusal does not name the schemes: %q", r.stderr)
	}
	// The core's own validation (a lease under its minimum) is a usage error too.
	sqlite := filepath.Join(t.TempDir(), "migrated.db")
	d := openTestDB(t, sqlite)
	if err := outboxplugin.AutoMigrate(d); err != nil {
		t.Fatal(err)
	}
	closeDB(d)
	wantCode(t, exitUsage, "relay", "--db", sqlite, "--http", "", "--broker", "nats://127.0.0.1:1", "--lease", "100ms")
	// Roots for TLS the URL does not ask for.
	_, caPath := selfSignedTLS(t)
	r = wantCode(t, exitUsage, "relay", "--db", sqlite, "--http", "", "--broker", "kafka://127.0.0.1:1", "--kafka-ca-file", caPath)
	if !strings.Contains(r.stderr, "kafkas://") {
		t.Errorf("--kafka-ca-file with kafka://: stderr %q", r.stderr)
	}
	// --kafka-ca-file is read from OUTBOX_KAFKA_CA_FILE too.
	r = cli(t, []string{"OUTBOX_KAFKA_CA_FILE=" + notPEM}, nil, "relay", "--db", db, "--http", "", "--broker", "kafkas://127.0.0.1:1")
	if r.code != exitUsage || !strings.Contains(r.stderr, "OUTBOX_KAFKA_CA_FILE") || !strings.Contains(r.stderr, "no PEM certificate") {
		t.Errorf("OUTBOX_KAFKA_CA_FILE of a file without a certificate: exit %d: %s", r.code, r.stderr)
	}
}
