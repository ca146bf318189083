package reliability

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// chaosDatabase is the database the kill tests use on PostgreSQL and MariaDB, of their own. Its
// random suffix makes it this run's alone, so that two runs on one server never share it and TestMain
// can drop it when the tests end.
var chaosDatabase = testName("kill")

// chaosToken returns a random token, lower-case hexadecimal so that it can end an unquoted database
// name.
func chaosToken() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// chaosRedisAddr is the Redis server the relays publish to.
func chaosRedisAddr() string {
	if a := os.Getenv("OUTBOX_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// chaosDialect is a database the scenario runs on: its dialect name and the DSN that the test and
// its child processes open.
type chaosDialect struct {
	name string // postgres, mysql or sqlite
	dsn  string
}

// chaosDialects are the databases of the matrix, in the order the tests run them.
var chaosDialects = []string{"postgres", "mysql", "sqlite"}

// chaosDialectFor prepares the database of dialect name: chaosDatabase on the server (created by the
// first test that needs it, and dropped by TestMain), or a file in t's temporary directory for SQLite.
// An unreachable server skips the test, or fails it with OUTBOX_REQUIRE_DBS=1.
func chaosDialectFor(t *testing.T, name string) chaosDialect {
	t.Helper()
	switch name {
	case "sqlite":
		// WAL lets readers and the writer work at once; _txlock=immediate takes the write lock at
		// BEGIN, so that a transaction that reads before it writes waits for the lock (busy timeout)
		// instead of failing with SQLITE_BUSY when it upgrades.
		return chaosDialect{name: name, dsn: filepath.Join(t.TempDir(), "kill.db") +
			"?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"}
	case "postgres":
		server := os.Getenv("OUTBOX_POSTGRES_DSN")
		if server == "" {
			server = "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"
		}
		err := chaosAdmin(name, server, func(db *gorm.DB) error {
			var exists bool
			if err := db.Raw(`SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = ?)`, chaosDatabase).Scan(&exists).Error; err != nil || exists {
				return err
			}
			if err := db.Exec(`CREATE DATABASE ` + chaosDatabase).Error; err != nil {
				return err
			}
			DropAfterTests(name, server, chaosDatabase)
			return nil
		})
		if err != nil {
			chaosUnreachable(t, "PostgreSQL", err)
		}
		return chaosDialect{name: name, dsn: chaosPostgresDSN(server, chaosDatabase)}
	case "mysql":
		server := os.Getenv("OUTBOX_MYSQL_DSN")
		if server == "" {
			server = "root@tcp(127.0.0.1:3306)/"
		}
		err := chaosAdmin(name, server, func(db *gorm.DB) error {
			if err := db.Exec(`CREATE DATABASE IF NOT EXISTS ` + chaosDatabase).Error; err != nil {
				return err
			}
			// The name is this run's alone: whether this call or an earlier test made it, this
			// process created it.
			DropAfterTests(name, server, chaosDatabase)
			return nil
		})
		if err != nil {
			chaosUnreachable(t, "MariaDB/MySQL", err)
		}
		return chaosDialect{name: name, dsn: chaosMySQLDSN(server, chaosDatabase)}
	}
	t.Fatalf("unknown dialect %q", name)
	return chaosDialect{}
}

// chaosUnreachable skips the test, or fails it when OUTBOX_REQUIRE_DBS=1.
func chaosUnreachable(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
		t.Fatalf("%s is not reachable (OUTBOX_REQUIRE_DBS=1): %v", what, err)
	}
	t.Skipf("%s is not reachable: %v", what, err)
}

// chaosAdmin connects to a server's administrative DSN, within 5 seconds, and runs fn.
func chaosAdmin(dialect, dsn string, fn func(*gorm.DB) error) error {
	db, err := chaosGorm(dialect, dsn)
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(ctx); err != nil {
		return err
	}
	return fn(db.WithContext(ctx))
}

// chaosPostgresDSN sets dbname in a key/value PostgreSQL DSN.
func chaosPostgresDSN(server, database string) string {
	fields := strings.Fields(server)
	for i, f := range fields {
		if strings.HasPrefix(f, "dbname=") {
			fields[i] = "dbname=" + database
			return strings.Join(fields, " ")
		}
	}
	return strings.Join(append(fields, "dbname="+database), " ")
}

// chaosMySQLDSN puts database into a go-sql-driver DSN ("user@tcp(host:port)/[db][?params]"), with
// parseTime=true, which the worker's time columns need.
func chaosMySQLDSN(server, database string) string {
	params := ""
	if i := strings.Index(server, "?"); i >= 0 {
		server, params = server[:i], server[i+1:]
	}
	if i := strings.LastIndex(server, "/"); i >= 0 {
		server = server[:i]
	}
	if params != "" {
		params += "&"
	}
	return server + "/" + database + "?" + params + "parseTime=true"
}

// chaosGorm opens dsn with the GORM driver of dialect, without logging.
func chaosGorm(dialect, dsn string) (*gorm.DB, error) {
	var d gorm.Dialector
	switch dialect {
	case "postgres":
		d = postgres.Open(dsn)
	case "mysql":
		d = mysql.Open(dsn)
	case "sqlite":
		d = sqlite.Open(dsn)
	default:
		return nil, fmt.Errorf("unknown dialect %q", dialect)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dialect, err)
	}
	return db, nil
}

// chaosOpen opens the scenario's database for the test itself, with the plugin writing to table,
// and closes it when t ends.
func chaosOpen(t *testing.T, d chaosDialect, table string) *gorm.DB {
	t.Helper()
	db, err := chaosGorm(d.name, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB.SetMaxOpenConns(4)
	t.Cleanup(func() { sqlDB.Close() })
	if err := db.Use(outboxplugin.New(outboxplugin.WithTableName(table), outboxplugin.WithModels(&KillAccount{}))); err != nil {
		t.Fatal(err)
	}
	return db
}

// chaosDuration is how long the chaos phase of a scenario lasts: def, or OUTBOX_SOAK — "1" for five
// minutes, or a duration such as 10m. A soak of runs phases that does not fit in the test binary's
// -timeout fails at once, naming the -timeout it needs.
func chaosDuration(t *testing.T, def time.Duration, runs int) time.Duration {
	t.Helper()
	d := def
	switch v := os.Getenv("OUTBOX_SOAK"); v {
	case "", "0":
	case "1", "true":
		d = 5 * time.Minute
	default:
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("OUTBOX_SOAK=%q: want 1 or a positive duration such as 10m", v)
		}
	}
	need := time.Duration(runs) * (d + time.Minute)
	if deadline, ok := t.Deadline(); ok && time.Until(deadline) < need {
		t.Fatalf("%d chaos phases of %v do not fit in the test timeout (%v left): run with -timeout %v or more",
			runs, d, time.Until(deadline).Round(time.Second), (need + 5*time.Minute).Round(time.Minute))
	}
	return d
}

// chaosName returns a name unique to this run, for Redis streams.
func chaosName(parts ...string) string {
	return testPrefix + strings.Join(parts, ":") + ":" + chaosToken()
}

// chaosRedis returns a client of the Redis server, after making the test depend on it (skipped when
// it is not there, failed with OUTBOX_REQUIRE_BROKERS=1); the keys given are deleted and the client
// closed when t ends.
func chaosRedis(t *testing.T, keys ...string) *redis.Client {
	t.Helper()
	outboxtest.RequireBroker(t, "Redis", chaosRedisAddr())
	c := redis.NewClient(&redis.Options{Addr: chaosRedisAddr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("delete %v: %v", keys, err)
			}
		}
		c.Close()
	})
	return c
}

// chaosProc is a child process of the test binary (see TestChaosChild).
type chaosProc struct {
	role   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *chaosTail
	// owner is the worker id a relay announced in its READY line.
	owner atomic.Pointer[string]
	// ready is closed at the READY line, held receives the size of a HELD batch.
	ready chan struct{}
	held  chan int
	// done is closed once the process has exited and its output is read; exitErr is then set.
	done    chan struct{}
	exitErr error
	// killed: ended by SIGKILL on purpose; stopping: asked to stop by closing its standard input.
	killed, stopping atomic.Bool
	fatal            atomic.Pointer[string] // the FATAL line, if any
}

// chaosLineFunc handles one CHAOS line of a child: its kind (BEGIN, PUBLISHED, ...) and arguments.
// It is called from the goroutine that reads the child's output and must not block for long.
type chaosLineFunc func(p *chaosProc, kind string, args []string)

// chaosStart starts the test binary as a child of the given role, with env added to this process's
// environment, and reads its output until it exits. The child is killed when t ends if it still runs,
// and dies with the test process (Pdeathsig on Linux; on every system it stops when its standard
// input closes).
func chaosStart(t *testing.T, role string, env []string, onLine chaosLineFunc) *chaosProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChaosChild$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), chaosEnvRole+"="+role), env...)
	cmd.SysProcAttr = chaosSysProcAttr()
	p := &chaosProc{role: role, cmd: cmd, stderr: &chaosTail{max: 16 << 10},
		ready: make(chan struct{}), held: make(chan int, 1), done: make(chan struct{})}
	cmd.Stderr = p.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdin = stdin
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", role, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var readyOnce sync.Once
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 || f[0] != "CHAOS" {
				continue
			}
			switch f[1] {
			case "READY":
				if len(f) > 2 {
					owner := f[2]
					p.owner.Store(&owner)
				}
				readyOnce.Do(func() { close(p.ready) })
			case "HELD":
				var n int
				if len(f) > 2 {
					fmt.Sscan(f[2], &n)
				}
				select {
				case p.held <- n:
				default:
				}
			case "FATAL":
				msg := strings.Join(f[2:], " ")
				p.fatal.Store(&msg)
			}
			if onLine != nil {
				onLine(p, f[1], f[2:])
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		p.exitErr = cmd.Wait()
	}()
	t.Cleanup(func() {
		if !p.exited() {
			p.kill()
		}
	})
	return p
}

// exited reports whether the process has exited and its output has been read.
func (p *chaosProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the process to be gone; it returns when it died.
func (p *chaosProc) kill() time.Time {
	p.killed.Store(true)
	_ = p.cmd.Process.Kill() // SIGKILL
	at := time.Now()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second): // a killed process cannot take that long; do not hang the test
	}
	return at
}

// hold asks a relay to wait after its next accepted batch, before marking it.
func (p *chaosProc) hold() {
	_, _ = io.WriteString(p.stdin, "hold\n")
}

// stop closes the child's standard input, which makes it finish what it is doing and exit, and waits
// up to timeout; it returns an error when the child did not exit cleanly in time (and then kills it).
func (p *chaosProc) stop(timeout time.Duration) error {
	p.stopping.Store(true)
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("%s did not stop within %v; killed. stderr:\n%s", p.role, timeout, p.stderr)
	}
	if p.exitErr != nil {
		return fmt.Errorf("%s exited with %v%s. stderr:\n%s", p.role, p.exitErr, p.fatalText(), p.stderr)
	}
	return nil
}

// unexpectedExit describes a child that ended on its own, neither killed nor stopped, or is "".
func (p *chaosProc) unexpectedExit() string {
	if !p.exited() || p.killed.Load() || p.stopping.Load() {
		return ""
	}
	return fmt.Sprintf("%s exited on its own (%v)%s. stderr:\n%s", p.role, p.exitErr, p.fatalText(), p.stderr)
}

func (p *chaosProc) fatalText() string {
	if f := p.fatal.Load(); f != nil {
		return ": " + *f
	}
	return ""
}

// ownerID is the worker id of a relay ("" before its READY line).
func (p *chaosProc) ownerID() string {
	if o := p.owner.Load(); o != nil {
		return *o
	}
	return ""
}

// waitReady waits for the READY line, the process's exit, or the timeout.
func (p *chaosProc) waitReady(timeout time.Duration) error {
	select {
	case <-p.ready:
		return nil
	case <-p.done:
		return errors.New(p.unexpectedExit())
	case <-time.After(timeout):
		return fmt.Errorf("%s not ready after %v. stderr:\n%s", p.role, timeout, p.stderr)
	}
}

// chaosTail keeps the last max bytes written to it: a child's standard error, for failure messages.
type chaosTail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *chaosTail) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *chaosTail) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// chaosLedger is the consumer's record: every message read from the stream, by outbox id, in the order
// the stream holds them.
type chaosLedger struct {
	mu      sync.Mutex
	count   map[string]int // message id → deliveries
	order   []chaosEntry   // every entry, in stream order
	lastErr error
}

// chaosEntry is one stream entry as the consumer read it.
type chaosEntry struct {
	id, key string
}

// chaosConsume reads stream from its start into a new ledger until ctx ends, in a goroutine; wait
// returns once it has stopped.
func chaosConsume(ctx context.Context, client *redis.Client, stream string) (l *chaosLedger, wait func()) {
	l = &chaosLedger{count: map[string]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := "0"
		for ctx.Err() == nil {
			res, err := client.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, last}, Count: 1000, Block: 100 * time.Millisecond}).Result()
			if err != nil {
				if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
					l.mu.Lock()
					l.lastErr = err
					l.mu.Unlock()
					time.Sleep(50 * time.Millisecond)
				}
				continue
			}
			l.mu.Lock()
			for _, s := range res {
				for _, m := range s.Messages {
					last = m.ID
					id, _ := m.Values[outboxplugin.HeaderID].(string)
					key, _ := m.Values[outboxplugin.HeaderKey].(string)
					l.count[id]++
					l.order = append(l.order, chaosEntry{id: id, key: key})
				}
			}
			l.mu.Unlock()
		}
	}()
	return l, func() { <-done }
}

// distinct is the number of different messages received.
func (l *chaosLedger) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.count)
}

// entries is the number of stream entries read, duplicates included.
func (l *chaosLedger) entries() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.order)
}

// snapshot copies the counts and the order.
func (l *chaosLedger) snapshot() (map[string]int, []chaosEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	count := make(map[string]int, len(l.count))
	for k, v := range l.count {
		count[k] = v
	}
	return count, append([]chaosEntry(nil), l.order...)
}

// chaosWindDown ends a scenario: it stops the relays (each within 30 s), then waits up to 10 s for
// the consumer to have read every entry of the stream, reporting failures on t.
func chaosWindDown(ctx context.Context, t *testing.T, relays []*chaosProc, client *redis.Client, stream string, l *chaosLedger) {
	t.Helper()
	for _, r := range relays {
		if err := r.stop(30 * time.Second); err != nil {
			t.Error(err)
		}
	}
	catchCtx, stopCatch := context.WithTimeout(ctx, 10*time.Second)
	defer stopCatch()
	if err := chaosCatchUp(catchCtx, client, stream, l); err != nil {
		t.Error(err)
	}
}

// chaosCatchUp waits until the consumer has read every entry of the stream.
func chaosCatchUp(ctx context.Context, client *redis.Client, stream string, l *chaosLedger) error {
	for {
		n, err := client.XLen(ctx, stream).Result()
		if err == nil && int64(l.entries()) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("consumer read %d entries of %d: %w (last read error: %v)", l.entries(), n, ctx.Err(), l.lastErr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// chaosWaitFor polls cond every interval until it is true, or fails after timeout with what.
func chaosWaitFor(timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v", what, timeout)
		}
		time.Sleep(interval)
	}
}
