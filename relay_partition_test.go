package outboxplugin_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// publishLog records, for every publish of every message, which relay published it and when the call
// began and ended on this process's monotonic clock, so that a test can tell whether two relays ever
// published one event at the same time. hold makes a relay's publish wait (for its context, or the
// time given) before it returns.
type publishLog struct {
	mu      sync.Mutex
	runs    map[string][]publishRun // message id -> its publishes
	hold    map[string]time.Duration
	started map[string]int // relay -> publisher calls begun
}

type publishRun struct {
	relay      string
	start, end time.Time
	ok         bool
}

func newPublishLog() *publishLog {
	return &publishLog{runs: map[string][]publishRun{}, hold: map[string]time.Duration{}, started: map[string]int{}}
}

// as is the publisher of one relay.
func (l *publishLog) as(relay string) outboxplugin.Publisher {
	return outboxplugin.PublisherFunc(func(ctx context.Context, msgs []outboxplugin.Message) error {
		start := time.Now()
		l.mu.Lock()
		hold := l.hold[relay]
		l.started[relay]++
		l.mu.Unlock()
		var err error
		if hold > 0 {
			select {
			case <-ctx.Done():
				err = ctx.Err()
			case <-time.After(hold):
			}
		}
		end := time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, m := range msgs {
			l.runs[m.ID] = append(l.runs[m.ID], publishRun{relay: relay, start: start, end: end, ok: err == nil})
		}
		return err
	})
}

// calls reports how many publisher calls relay has begun.
func (l *publishLog) calls(relay string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started[relay]
}

func (l *publishLog) setHold(relay string, d time.Duration) {
	l.mu.Lock()
	l.hold[relay] = d
	l.mu.Unlock()
}

// published reports how many messages have a publish that succeeded.
func (l *publishLog) published() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, runs := range l.runs {
		for _, r := range runs {
			if r.ok {
				n++
				break
			}
		}
	}
	return n
}

// overlaps lists the messages two relays published at the same time.
func (l *publishLog) overlaps() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, runs := range l.runs {
		for i := range runs {
			for j := i + 1; j < len(runs); j++ {
				a, b := runs[i], runs[j]
				if a.relay != b.relay && a.start.Before(b.end) && b.start.Before(a.end) {
					out = append(out, fmt.Sprintf("%s by %s and %s", id, a.relay, b.relay))
				}
			}
		}
	}
	return out
}

// byRelay counts each relay's successful publishes.
func (l *publishLog) byRelay() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, runs := range l.runs {
		for _, r := range runs {
			if r.ok {
				out[r.relay]++
			}
		}
	}
	return out
}

// emitN commits n events, one per transaction.
func emitN(t *testing.T, db *gorm.DB, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			return outboxplugin.Emit(tx, "Tick", map[string]int{"i": i})
		}))
	}
}

// openThrough opens the dialect's test database with its connections going through proxy, a relay's
// own pool, as a relay in another process would have.
func openThrough(t *testing.T, d dialect, proxy *outboxtest.Proxy) *gorm.DB {
	t.Helper()
	var (
		pool *sql.DB
		err  error
	)
	host, port, _ := net.SplitHostPort(proxy.Addr())
	switch d.server() {
	case "postgres":
		_, perr := postgresPool()
		require.NoError(t, perr)
		dsn := replaceDSNField(replaceDSNField(replaceDSNField(postgresServerDSN(), "dbname", testDatabase), "host", host), "port", port)
		pool, err = sql.Open("pgx", dsn)
	case "mysql":
		_, merr := mysqlPool()
		require.NoError(t, merr)
		dsn := strings.Replace(myDSN, "tcp(127.0.0.1:3306)", "tcp("+proxy.Addr()+")", 1)
		require.NotEqual(t, myDSN, dsn, "the MariaDB DSN names 127.0.0.1:3306")
		pool, err = sql.Open("mysql", dsn)
	default:
		t.Fatalf("no proxied pool for %s", d.name)
	}
	require.NoError(t, err)
	t.Cleanup(func() { pool.Close() })
	var dialector gorm.Dialector
	if d.server() == "postgres" {
		dialector = postgres.New(postgres.Config{Conn: pool})
	} else {
		dialector = mysql.New(mysql.Config{Conn: pool, SkipInitializeWithVersion: true})
	}
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	return db
}

// proxyTo returns a proxy to the dialect's server.
func proxyTo(t *testing.T, d dialect) *outboxtest.Proxy {
	t.Helper()
	target := "127.0.0.1:5432"
	if d.server() == "mysql" {
		target = "127.0.0.1:3306"
	}
	p, err := outboxtest.NewProxy(target)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// Leases run on the database's clock: two relays whose clocks are 20 s apart, each taking a while to
// publish, never publish one event at the same time and never take each other's live batches; every
// event is published once. (SQLite's relays share one host's clock: not run there.)
func TestLeasesFollowTheDatabaseClock(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() == "sqlite" {
			t.Skip("a SQLite database is one host's file: its relays share a clock")
		}
		db := setup(t, d, nil)
		emitN(t, db, 60)
		log := newPublishLog()
		log.setHold("ahead", 300*time.Millisecond)
		log.setHold("behind", 300*time.Millisecond)
		opts := []outboxplugin.WorkerOption{outboxplugin.WithLease(time.Second), outboxplugin.WithBatchSize(10),
			outboxplugin.WithPollInterval(10 * time.Millisecond), outboxplugin.WithoutListen()}
		ahead := newWorker(t, db, log.as("ahead"), opts...)
		outboxplugin.UseClockSkew(ahead, 10*time.Second)
		behind := newWorker(t, db, log.as("behind"), opts...)
		outboxplugin.UseClockSkew(behind, -10*time.Second)
		stop := runWorkers(t, 2, func() *outboxplugin.Worker {
			w := ahead
			ahead = behind
			return w
		})
		require.Eventually(t, func() bool { return log.published() == 60 }, 60*time.Second, 20*time.Millisecond)
		stop()
		assert.Empty(t, log.overlaps(), "two relays published one event at once")
		by := log.byRelay()
		assert.Equal(t, 60, by["ahead"]+by["behind"], "every event published once: %v", by)
	})
}

// A claim whose answer comes back later than the lease — the database ran it, and the network held
// the answer — is not published by the relay that claimed it: by then another relay may have taken
// the rows over, and it does. Every event is published once, never by both.
func TestLateClaimAnswerIsNotPublished(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() == "sqlite" {
			t.Skip("no network between SQLite and its relays")
		}
		db := setup(t, d, nil)
		proxy := proxyTo(t, d)
		late := openThrough(t, d, proxy)
		log := newPublishLog()
		const lease = time.Second
		opts := []outboxplugin.WorkerOption{outboxplugin.WithLease(lease), outboxplugin.WithBatchSize(50), outboxplugin.WithoutListen()}
		a := newWorker(t, late, log.as("late"), opts...)
		b := newWorker(t, db, log.as("other"), opts...)
		// The relay is ready (its table checked, its pool warm: the claim must reach the server), then
		// the events come, and the answers to the relay are held.
		n, err := a.ProcessOnce(context.Background())
		require.NoError(t, err)
		require.Zero(t, n)
		emitN(t, db, 20)
		var lateN int
		var lateErr error
		done := make(chan struct{})
		proxy.Mute(true)
		go func() {
			defer close(done)
			lateN, lateErr = a.ProcessOnce(context.Background())
		}()
		// The other relay takes the rows over once the late claim's lease has run out on the
		// database's clock, and publishes them.
		require.Eventually(t, func() bool {
			_, err := b.ProcessOnce(context.Background())
			require.NoError(t, err)
			return log.published() == 20
		}, 30*time.Second, 50*time.Millisecond)
		proxy.Mute(false)
		<-done
		require.NoError(t, lateErr)
		assert.Zero(t, lateN, "the late claim's batch is not published")
		assert.Equal(t, map[string]int{"other": 20}, log.byRelay())
		assert.Empty(t, log.overlaps())
	})
}

// A relay cut off from the database while it publishes cannot renew its lease: its publish is cut
// short when the lease runs out on its own clock, before the database's lease ends, and the other
// relay then takes the rows over and publishes them — never both at once.
func TestPartitionedRelayStopsPublishingAtItsLease(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() == "sqlite" {
			t.Skip("no network between SQLite and its relays")
		}
		db := setup(t, d, nil)
		emitN(t, db, 10)
		proxy := proxyTo(t, d)
		cutOff := openThrough(t, d, proxy)
		log := newPublishLog()
		log.setHold("cut-off", time.Minute) // publishes until its context ends
		const lease = time.Second
		opts := []outboxplugin.WorkerOption{outboxplugin.WithLease(lease), outboxplugin.WithBatchSize(50), outboxplugin.WithoutListen(),
			outboxplugin.WithPublishTimeout(time.Minute)}
		a := newWorker(t, cutOff, log.as("cut-off"), opts...)
		b := newWorker(t, db, log.as("other"), opts...)

		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = a.ProcessOnce(context.Background()) // claims all ten, then publishes until cut short
		}()
		// Once the batch is being published, the relay's database link goes dark: its renewals hang.
		require.Eventually(t, func() bool { return log.calls("cut-off") > 0 }, 30*time.Second, 5*time.Millisecond)
		proxy.Blackhole(true)
		require.Eventually(t, func() bool {
			_, err := b.ProcessOnce(context.Background())
			require.NoError(t, err)
			return log.byRelay()["other"] == 10
		}, 30*time.Second, 50*time.Millisecond, "the other relay publishes the rows once their lease has run out")
		proxy.Blackhole(false)
		<-done
		assert.Empty(t, log.overlaps(), "two relays published one event at once")
		assert.Zero(t, log.byRelay()["cut-off"], "the cut-off relay's publish was cut short")
	})
}

// A relay cut off from MySQL/MariaDB in the middle of a claim — its rows locked, its stamp and commit
// not yet sent — neither freezes the application nor keeps the rows: the application's transactions
// write events meanwhile, and the database ends the silent transaction (idle_transaction_timeout), so
// the other relay publishes every event while the cut-off one is still partitioned.
func TestRelayCutOffInItsClaimLetsGoOfItsRows(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() != "mysql" {
			t.Skip("a claim is one statement elsewhere: the database does not wait on the relay inside it")
		}
		db := setup(t, d, nil)
		proxy := proxyTo(t, d)
		cutOff := openThrough(t, d, proxy)
		log := newPublishLog()
		opts := []outboxplugin.WorkerOption{outboxplugin.WithLease(time.Minute), outboxplugin.WithBatchSize(50), outboxplugin.WithoutListen()}
		a := newWorker(t, cutOff, log.as("cut-off"), opts...)
		b := newWorker(t, db, log.as("other"), opts...)
		var once sync.Once
		locked := make(chan struct{})
		outboxplugin.UseAfterClaimLock(a, func() {
			once.Do(func() {
				proxy.Blackhole(true)
				close(locked)
			})
		})
		emitN(t, db, 20)
		done := make(chan struct{})
		var aN int
		go func() {
			defer close(done)
			aN, _ = a.ProcessOnce(context.Background())
		}()
		<-locked
		// The application goes on writing while the relay's transaction is open on the server.
		emitN(t, db, 10)
		require.Eventually(t, func() bool {
			_, err := b.ProcessOnce(context.Background())
			require.NoError(t, err)
			return log.byRelay()["other"] == 30
		}, 60*time.Second, 50*time.Millisecond, "the other relay publishes the cut-off claim's rows during the partition")
		proxy.Blackhole(false)
		<-done
		assert.Zero(t, aN, "the cut-off claim publishes nothing")
		assert.Equal(t, map[string]int{"other": 30}, log.byRelay())
	})
}

// A worker on a pool of one connection (SetMaxOpenConns(1)) shares it with the application: it does
// not keep a connection of its own between claims, so the application's statements and the worker's
// other statements get the connection, and every event is published.
func TestRelayOnAPoolOfOneConnection(t *testing.T) {
	forEachRelayDB(t, func(t *testing.T, d dialect) {
		if d.server() == "sqlite" {
			t.Skip("the proxied pool is a server's")
		}
		db := setup(t, d, nil)
		one := openThrough(t, d, proxyTo(t, d))
		pool, err := one.DB()
		require.NoError(t, err)
		pool.SetMaxOpenConns(1)
		log := newPublishLog()
		w := newWorker(t, one, log.as("one"), outboxplugin.WithBatchSize(7), outboxplugin.WithPollInterval(10*time.Millisecond),
			outboxplugin.WithoutListen())
		stop := runWorkers(t, 1, func() *outboxplugin.Worker { return w })
		emitN(t, db, 40)
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, one.Raw("SELECT 1").Scan(&n).Error, "the application's statement on the shared pool")
			return log.published() == 40
		}, 60*time.Second, 20*time.Millisecond)
		stop()
		assert.Equal(t, map[string]int{"one": 40}, log.byRelay())
	})
}
