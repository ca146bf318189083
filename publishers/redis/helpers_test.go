package outboxredis_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// redisAddr is the Redis server the tests and the benchmark write to.
const redisAddr = "127.0.0.1:6379"

// openDB opens a fresh SQLite outbox database in t's temporary directory, with the plugin registered
// (given opts) and the outbox table migrated.
func openDB(t testing.TB, opts ...outboxplugin.Option) *gorm.DB {
	t.Helper()
	dsn := filepath.Join(t.TempDir(), "outbox.db") + "?_busy_timeout=5000&_journal_mode=WAL"
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	t.Cleanup(func() { sqlDB.Close() })
	require.NoError(t, db.Use(outboxplugin.New(opts...)))
	require.NoError(t, outboxplugin.AutoMigrate(db))
	return db
}

// newClient returns a go-redis client of addr, closed when t ends. Context deadlines bound its I/O,
// as the publisher's documentation recommends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	outboxtest.RequireBroker(t, "Redis", redisAddr)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// streamPrefix returns a prefix of Redis keys unique to t and deletes every key under it when t ends.
func streamPrefix(t testing.TB) string {
	t.Helper()
	prefix := testName("keys") + ":"
	admin := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := admin.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("scan test keys: %v", err)
			return
		}
		if len(keys) > 0 {
			if err := admin.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("delete test keys: %v", err)
			}
		}
	})
	return prefix
}

// prefixed routes messages to the default stream under prefix.
func prefixed(prefix string) outboxredis.Option {
	return outboxredis.WithStream(func(m outboxplugin.Message) string {
		return prefix + outboxredis.DefaultStream(m)
	})
}

// newPublisher returns a publisher writing with client, closed when t ends.
func newPublisher(t testing.TB, client redis.UniversalClient, opts ...outboxredis.Option) *outboxredis.Publisher {
	t.Helper()
	pub, err := outboxredis.New(client, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	return pub
}

// entry is a stream entry with its fields in the order Redis keeps them.
type entry struct {
	id     string
	fields [][2]string
}

func (e entry) field(name string) (string, bool) {
	for _, f := range e.fields {
		if f[0] == name {
			return f[1], true
		}
	}
	return "", false
}

// readStream reads every entry of a stream with XRANGE, keeping the order of the fields (go-redis's
// XRange returns them as a map).
func readStream(t testing.TB, c redis.UniversalClient, stream string) []entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := c.Do(ctx, "XRANGE", stream, "-", "+").Slice()
	require.NoError(t, err)
	out := make([]entry, 0, len(raw))
	for _, r := range raw {
		pair := r.([]any)
		kv := pair[1].([]any)
		e := entry{id: pair[0].(string)}
		for i := 0; i+1 < len(kv); i += 2 {
			e.fields = append(e.fields, [2]string{kv[i].(string), kv[i+1].(string)})
		}
		out = append(out, e)
	}
	return out
}

// recorder is a worker observer that keeps the batch results.
type recorder struct {
	outboxplugin.NopObserver
	mu           sync.Mutex
	published    map[string]int
	refused      int // messages in BatchResult.Failed
	notDelivered int // messages in BatchResult.NotDelivered
	dead         int
}

func newRecorder() *recorder { return &recorder{published: map[string]int{}} }

func (r *recorder) BatchDone(_ context.Context, res outboxplugin.BatchResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range res.Published {
		r.published[m.ID]++
	}
	r.refused += len(res.Failed)
	r.notDelivered += len(res.NotDelivered)
}

func (r *recorder) Dead(context.Context, outboxplugin.Message, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dead++
}

// counts returns the distinct messages published, and the failed deliveries: refused, and not
// delivered.
func (r *recorder) counts() (published, refused, notDelivered int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.published), r.refused, r.notDelivered
}

// replyGate is a TCP proxy to Redis that, once armed with Pass(k), lets k more replies reach the
// client and holds back the rest, while Redis still executes every command: a connection that stops
// answering in the middle of a pipeline. It expects XADD replies (bulk strings) once armed.
type replyGate struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	pass  int // replies still let through once armed; -1: not armed, everything passes
	conns []net.Conn
	wg    sync.WaitGroup
}

func newReplyGate(t *testing.T, target string) *replyGate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := &replyGate{ln: ln, target: target, pass: -1}
	g.wg.Add(1)
	go g.accept()
	t.Cleanup(func() {
		ln.Close()
		g.mu.Lock()
		for _, c := range g.conns {
			c.Close()
		}
		g.mu.Unlock()
		g.wg.Wait()
	})
	return g
}

func (g *replyGate) Addr() string { return g.ln.Addr().String() }

// Pass arms the gate: k more replies reach the client, and no more.
func (g *replyGate) Pass(k int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pass = k
}

func (g *replyGate) accept() {
	defer g.wg.Done()
	for {
		client, err := g.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", g.target)
		if err != nil {
			client.Close()
			continue
		}
		g.mu.Lock()
		g.conns = append(g.conns, client, server)
		g.mu.Unlock()
		g.wg.Add(2)
		go func() {
			defer g.wg.Done()
			_, _ = io.Copy(server, client)
			server.Close()
		}()
		go func() {
			defer g.wg.Done()
			g.forwardReplies(client, server)
			client.Close()
		}()
	}
}

// forwardReplies copies server to client: as it comes while the gate is not armed, reply by reply
// once it is, until the replies it may pass are used up; then it reads and drops the rest.
func (g *replyGate) forwardReplies(client, server net.Conn) {
	rd := bufio.NewReader(server)
	for {
		if _, err := rd.Peek(1); err != nil {
			return
		}
		g.mu.Lock()
		pass := g.pass
		g.mu.Unlock()
		switch {
		case pass < 0:
			chunk := make([]byte, rd.Buffered())
			_, _ = io.ReadFull(rd, chunk)
			if _, err := client.Write(chunk); err != nil {
				return
			}
		case pass == 0:
			_, _ = io.Copy(io.Discard, rd)
			return
		default:
			line, err := rd.ReadBytes('\n') // $<length>\r\n
			if err != nil || len(line) < 4 || line[0] != '$' {
				return
			}
			n, err := strconv.Atoi(string(line[1 : len(line)-2]))
			if err != nil {
				return
			}
			body := make([]byte, n+2)
			if _, err := io.ReadFull(rd, body); err != nil {
				return
			}
			if _, err := client.Write(append(line, body...)); err != nil {
				return
			}
			g.mu.Lock()
			g.pass--
			g.mu.Unlock()
		}
	}
}

// mustWorker returns outboxplugin.NewWorker(db, pub, opts...), failing tb when that returns an error.
func mustWorker(tb testing.TB, db *gorm.DB, pub outboxplugin.Publisher, opts ...outboxplugin.WorkerOption) *outboxplugin.Worker {
	tb.Helper()
	w, err := outboxplugin.NewWorker(db, pub, opts...)
	require.NoError(tb, err)
	return w
}
