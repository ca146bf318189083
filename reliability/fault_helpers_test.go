package reliability_test

// Helpers of the broker-outage and database-fault scenarios (outage_test.go, dbfault_test.go): the
// databases they run on, the business model the writer writes through the plugin, the ledger that
// records every delivery, a log-record counter, process CPU time, and the final invariants every
// scenario checks. Every name here starts with "fault" so that it cannot clash with the helpers of the
// other scenarios of this package.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/reliability"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// faultDatabase is the database these scenarios use on PostgreSQL and on MariaDB; no other package
// touches it. Its random suffix makes it this run's alone, so that two runs on one server never share
// it and TestMain can drop it when the tests end.
var faultDatabase = reliability.RunName("fault")

// Tables of the scenarios. The tests of this package run one after the other, and each scenario drops
// and recreates both tables before it starts.
const (
	faultOutboxTable = "fault_outbox"
	faultOrderTable  = "fault_orders"
)

// faultOrder is the business row the writer creates; the plugin captures each as a faultOrder_create
// event whose aggregate id is the order's id.
type faultOrder struct {
	ID     int64 `gorm:"primaryKey;autoIncrement"`
	Ref    string
	Amount int
}

// TableName keeps the orders in a table of these scenarios' own.
func (faultOrder) TableName() string { return faultOrderTable }

// faultPostgresServerDSN is the PostgreSQL server: OUTBOX_POSTGRES_DSN or the local one.
func faultPostgresServerDSN() string {
	if dsn := os.Getenv("OUTBOX_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"
}

// faultMySQLServerDSN is the MariaDB/MySQL server: OUTBOX_MYSQL_DSN or the local one.
func faultMySQLServerDSN() string {
	if dsn := os.Getenv("OUTBOX_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/"
}

// faultUnreachable skips the test, or fails it when OUTBOX_REQUIRE_DBS=1 (as in CI).
func faultUnreachable(tb testing.TB, what string, err error) {
	tb.Helper()
	if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
		tb.Fatalf("%s is not reachable (OUTBOX_REQUIRE_DBS=1): %v", what, err)
	}
	tb.Skipf("%s is not reachable: %v", what, err)
}

// faultPing pings db within 5 seconds.
func faultPing(db *sql.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// faultPGDSN returns the PostgreSQL DSN dsn with the database and the application name set; it takes
// key/value DSNs and postgres:// URLs.
func faultPGDSN(dsn, dbname, appName string) string {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err == nil {
			u.Path = "/" + dbname
			q := u.Query()
			q.Set("application_name", appName)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	set := map[string]string{"dbname": dbname, "application_name": appName}
	fields := strings.Fields(dsn)
	for i, f := range fields {
		if k, _, ok := strings.Cut(f, "="); ok {
			if v, found := set[k]; found {
				fields[i] = k + "=" + v
				delete(set, k)
			}
		}
	}
	for _, k := range []string{"dbname", "application_name"} {
		if v, ok := set[k]; ok {
			fields = append(fields, k+"="+v)
		}
	}
	return strings.Join(fields, " ")
}

var (
	faultPGOnce sync.Once
	faultPGErr  error
	faultMyOnce sync.Once
	faultMyErr  error
)

// faultEnsurePostgres creates faultDatabase on the PostgreSQL server once per test binary, for
// TestMain to drop when the tests end.
func faultEnsurePostgres() error {
	faultPGOnce.Do(func() {
		admin, err := sql.Open("pgx", faultPostgresServerDSN())
		if err != nil {
			faultPGErr = err
			return
		}
		defer admin.Close()
		if faultPGErr = faultPing(admin); faultPGErr != nil {
			return
		}
		if _, err := admin.Exec(`CREATE DATABASE ` + faultDatabase); err != nil {
			faultPGErr = fmt.Errorf("create database %s: %w", faultDatabase, err)
			return
		}
		reliability.DropAfterTests("postgres", faultPostgresServerDSN(), faultDatabase)
	})
	return faultPGErr
}

// faultOpenPostgres opens faultDatabase on the PostgreSQL server with its own pool, whose connections
// carry appName as their application_name (so that pg_stat_activity tells them apart); the pool is
// closed when the test ends. It skips (or fails) when the server is unreachable.
func faultOpenPostgres(tb testing.TB, appName string) *gorm.DB {
	tb.Helper()
	if err := faultEnsurePostgres(); err != nil {
		faultUnreachable(tb, "PostgreSQL", err)
	}
	return faultOpenPostgresDSN(tb, faultPGDSN(faultPostgresServerDSN(), faultDatabase, appName))
}

// faultOpenPostgresDSN opens a gorm.DB on dsn, closed when the test ends.
func faultOpenPostgresDSN(tb testing.TB, dsn string) *gorm.DB {
	tb.Helper()
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		tb.Fatalf("open PostgreSQL %q: %v", dsn, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sqlDB.Close() })
	if err := faultPing(sqlDB); err != nil {
		faultUnreachable(tb, "PostgreSQL", err)
	}
	return db
}

// faultMySQLConfig is the server DSN's configuration with the database (empty: none) and the user set.
func faultMySQLConfig(tb testing.TB, dbname, user, password string) *mysql.Config {
	tb.Helper()
	cfg, err := mysql.ParseDSN(faultMySQLServerDSN())
	if err != nil {
		tb.Fatalf("OUTBOX_MYSQL_DSN: %v", err)
	}
	cfg.DBName = dbname
	cfg.ParseTime = true
	// The relays' connections are killed on purpose: keep the driver's complaints out of the output.
	cfg.Logger = log.New(io.Discard, "", 0)
	if user != "" {
		cfg.User, cfg.Passwd = user, password
	}
	return cfg
}

// faultEnsureMySQL creates faultDatabase on the MariaDB/MySQL server once per test binary, for
// TestMain to drop when the tests end.
func faultEnsureMySQL(tb testing.TB) error {
	tb.Helper()
	faultMyOnce.Do(func() {
		adminDSN := faultMySQLConfig(tb, "", "", "").FormatDSN()
		admin, err := sql.Open("mysql", adminDSN)
		if err != nil {
			faultMyErr = err
			return
		}
		defer admin.Close()
		if faultMyErr = faultPing(admin); faultMyErr != nil {
			return
		}
		if _, err := admin.Exec("CREATE DATABASE " + faultDatabase); err != nil {
			faultMyErr = fmt.Errorf("create database %s: %w", faultDatabase, err)
			return
		}
		reliability.DropAfterTests("mysql", adminDSN, faultDatabase)
	})
	return faultMyErr
}

// faultOpenMySQL opens faultDatabase on the MariaDB/MySQL server with its own pool, as user (the
// server DSN's user when empty); the pool is closed when the test ends. It skips (or fails) when the
// server is unreachable.
func faultOpenMySQL(tb testing.TB, user, password string) *gorm.DB {
	tb.Helper()
	if err := faultEnsureMySQL(tb); err != nil {
		faultUnreachable(tb, "MariaDB", err)
	}
	// A connector rather than a DSN string: the configuration keeps its quiet logger.
	connector, err := mysql.NewConnector(faultMySQLConfig(tb, faultDatabase, user, password))
	if err != nil {
		tb.Fatalf("MariaDB connector: %v", err)
	}
	sqlDB := sql.OpenDB(connector)
	tb.Cleanup(func() { sqlDB.Close() })
	if err := faultPing(sqlDB); err != nil {
		faultUnreachable(tb, "MariaDB", err)
	}
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		tb.Fatalf("open MariaDB as %q: %v", user, err)
	}
	return db
}

// faultResetTables drops and recreates the orders and the outbox table (with its indexes and, on
// PostgreSQL, its storage settings), and registers the plugin on db, writing to faultOutboxTable.
func faultResetTables(tb testing.TB, db *gorm.DB) {
	tb.Helper()
	if err := db.Migrator().DropTable(faultOrderTable, faultOutboxTable); err != nil {
		tb.Fatalf("drop tables: %v", err)
	}
	faultUsePlugin(tb, db)
	if err := db.AutoMigrate(&faultOrder{}); err != nil {
		tb.Fatalf("migrate orders: %v", err)
	}
	if err := outboxplugin.AutoMigrate(db); err != nil {
		tb.Fatalf("migrate outbox: %v", err)
	}
}

// faultUsePlugin registers the plugin on db, writing to faultOutboxTable.
func faultUsePlugin(tb testing.TB, db *gorm.DB) {
	tb.Helper()
	if err := db.Use(outboxplugin.New(outboxplugin.WithTableName(faultOutboxTable))); err != nil {
		tb.Fatalf("register the plugin: %v", err)
	}
}

// faultToken returns a random hexadecimal token, for names no other test or run uses.
func faultToken() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// faultWriter writes orders through the plugin, one transaction each, at a steady rate, and records the
// outcome of every commit: committed (Commit returned nil) or in doubt (an error; the transaction may
// or may not have committed, as when the connection dies during COMMIT).
type faultWriter struct {
	db    *gorm.DB
	every time.Duration

	mu        sync.Mutex
	committed []int64 // ids of the orders whose transaction committed
	inDoubt   int     // transactions that returned an error
	lastErr   error

	stop context.CancelFunc
	done chan struct{}
}

// faultStartWriter starts a writer that commits one order every `every` until it is stopped (and at
// the latest when ctx ends).
func faultStartWriter(ctx context.Context, db *gorm.DB, every time.Duration) *faultWriter {
	ctx, stop := context.WithCancel(ctx)
	w := &faultWriter{db: db, every: every, stop: stop, done: make(chan struct{})}
	go w.run(ctx)
	return w
}

func (w *faultWriter) run(ctx context.Context) {
	defer close(w.done)
	tick := time.NewTicker(w.every)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		o := faultOrder{Ref: "order-" + strconv.Itoa(n), Amount: n}
		// Each write is bounded, so that a database that has gone away costs a write, not the test.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := w.db.WithContext(wctx).Transaction(func(tx *gorm.DB) error { return tx.Create(&o).Error })
		cancel()
		w.mu.Lock()
		if err == nil {
			w.committed = append(w.committed, o.ID)
		} else if ctx.Err() == nil {
			w.inDoubt++
			w.lastErr = err
		}
		w.mu.Unlock()
	}
}

// Stop stops the writer and waits for its last transaction.
func (w *faultWriter) Stop() {
	w.stop()
	<-w.done
}

// Committed returns how many transactions committed so far.
func (w *faultWriter) Committed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.committed)
}

// Outcome returns the committed order ids, the number of transactions in doubt and the last error.
func (w *faultWriter) Outcome() ([]int64, int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int64(nil), w.committed...), w.inDoubt, w.lastErr
}

// faultLedger is the consumer's ledger: every delivery of every message, by id. Used as a Publisher,
// it records each batch after an optional pause (a broker's round trip), so that faults land while
// batches are in flight.
type faultLedger struct {
	pause time.Duration

	mu    sync.Mutex
	seen  map[string]int
	first map[string]time.Time
	total atomic.Int64 // deliveries, duplicates included
}

func faultNewLedger(pause time.Duration) *faultLedger {
	return &faultLedger{pause: pause, seen: map[string]int{}, first: map[string]time.Time{}}
}

// Publish records msgs as delivered, after the ledger's pause (or fails when ctx ends first).
func (l *faultLedger) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	if l.pause > 0 {
		t := time.NewTimer(l.pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	for _, m := range msgs {
		l.record(m.ID)
	}
	return nil
}

// record notes one delivery of message id.
func (l *faultLedger) record(id string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[id] == 0 {
		l.first[id] = now
	}
	l.seen[id]++
	l.total.Add(1)
}

// Unique returns how many distinct messages were delivered.
func (l *faultLedger) Unique() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// Deliveries returns a copy of the delivery counts and of the first delivery times.
func (l *faultLedger) Deliveries() (map[string]int, map[string]time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := make(map[string]int, len(l.seen))
	first := make(map[string]time.Time, len(l.first))
	for k, v := range l.seen {
		seen[k] = v
	}
	for k, v := range l.first {
		first[k] = v
	}
	return seen, first
}

// faultLogCounter is a slog.Handler that counts records, by level, and keeps the last few messages.
type faultLogCounter struct {
	c *faultLogCounts
}

type faultLogCounts struct {
	mu       sync.Mutex
	byLevel  map[slog.Level]int
	total    int
	messages map[string]int
}

func faultNewLogCounter() *faultLogCounter {
	return &faultLogCounter{c: &faultLogCounts{byLevel: map[slog.Level]int{}, messages: map[string]int{}}}
}

func (h *faultLogCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h *faultLogCounter) Handle(_ context.Context, r slog.Record) error {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.c.total++
	h.c.byLevel[r.Level]++
	h.c.messages[r.Message]++
	return nil
}

func (h *faultLogCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *faultLogCounter) WithGroup(string) slog.Handler      { return h }

// Total returns the number of records so far.
func (h *faultLogCounter) Total() int {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return h.c.total
}

// Messages returns the count of records per message, as "message×n" sorted, for failure reports.
func (h *faultLogCounter) Messages() string {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	out := make([]string, 0, len(h.c.messages))
	for m, n := range h.c.messages {
		out = append(out, fmt.Sprintf("%q×%d", m, n))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// faultCPUTime returns the CPU time (user + system) this process has used so far.
func faultCPUTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// faultSoak returns the soak length OUTBOX_SOAK asks for ("1" means 10 minutes; otherwise a duration
// such as 10m), or 0 when it is not set: the default run stays short.
func faultSoak(tb testing.TB) time.Duration {
	tb.Helper()
	v := os.Getenv("OUTBOX_SOAK")
	switch v {
	case "", "0":
		return 0
	case "1":
		return 10 * time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		tb.Fatalf("OUTBOX_SOAK=%q: want 1 or a duration such as 10m", v)
	}
	return d
}

// faultWaitFor polls cond every 10 ms until it holds, and fails the test with what when ctx or
// within ends first; it returns how long it waited.
func faultWaitFor(ctx context.Context, tb testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			tb.Fatalf("%s: %v after %v", what, ctx.Err(), time.Since(start).Round(time.Millisecond))
		case <-deadline.C:
			tb.Fatalf("%s: not reached within %v", what, within)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return time.Since(start)
}

// faultEventRow is an outbox row as the final checks read it.
type faultEventRow struct {
	MessageID     string
	EventType     string
	AggregateID   string
	Processed     bool
	DeadAt        *time.Time
	LockedUntil   *time.Time
	NextAttemptAt *time.Time
	Attempts      int
}

// faultEvents reads every row of the outbox table.
func faultEvents(ctx context.Context, tb testing.TB, db *gorm.DB) []faultEventRow {
	tb.Helper()
	var rows []faultEventRow
	err := db.WithContext(ctx).Table(faultOutboxTable).
		Select("message_id, event_type, aggregate_id, processed, dead_at, locked_until, next_attempt_at, attempts").
		Order("id").Find(&rows).Error
	if err != nil {
		tb.Fatalf("read the outbox: %v", err)
	}
	return rows
}

// faultPending counts the events not yet processed.
func faultPending(ctx context.Context, db *gorm.DB) (int64, error) {
	var n int64
	err := db.WithContext(ctx).Table(faultOutboxTable).Where("processed = ?", false).Count(&n).Error
	return n, err
}

// faultTally is the outcome of a scenario as its figures report it.
type faultTally struct {
	Events     int // outbox events in the table
	Orders     int // business rows committed (or found in the table)
	Lost       int // events never delivered, or committed orders without their event
	Phantoms   int // events without a committed order, and deliveries of messages the outbox never held
	Duplicates int // deliveries beyond the first
	MaxCopies  int // the most deliveries of one message
}

// faultCheck asserts the end state every scenario promises: every committed order is in the table
// with exactly one event; no event exists for an order that is not there (no phantom); every event is
// processed, none dead, none still leased; every event was delivered at least once, and nothing else
// was. It returns the tally; the caller checks the duplicates against its in-flight bound.
func faultCheck(ctx context.Context, tb testing.TB, db *gorm.DB, w *faultWriter, seen map[string]int) faultTally {
	tb.Helper()
	var tally faultTally
	events := faultEvents(ctx, tb, db)
	tally.Events = len(events)

	var orderIDs []int64
	if err := db.WithContext(ctx).Table(faultOrderTable).Order("id").Pluck("id", &orderIDs).Error; err != nil {
		tb.Fatalf("read the orders: %v", err)
	}
	tally.Orders = len(orderIDs)
	inTable := make(map[string]bool, len(orderIDs))
	for _, id := range orderIDs {
		inTable[strconv.FormatInt(id, 10)] = true
	}
	if w != nil {
		committed, _, _ := w.Outcome()
		for _, id := range committed {
			if !inTable[strconv.FormatInt(id, 10)] {
				tally.Lost++
				tb.Errorf("order %d committed but missing from the table", id)
			}
		}
	}
	orderEvents := map[string]int{}
	const orderCreate = "faultOrder_create"
	now := time.Now().UTC()
	known := make(map[string]bool, len(events))
	for _, e := range events {
		known[e.MessageID] = true
		if e.EventType == orderCreate {
			orderEvents[e.AggregateID]++
			if !inTable[e.AggregateID] {
				tally.Phantoms++
				tb.Errorf("phantom: event %s for order %s, which is not in the table", e.MessageID, e.AggregateID)
			}
		}
		switch {
		case e.DeadAt != nil:
			tb.Errorf("event %s is dead after %d attempts", e.MessageID, e.Attempts)
		case !e.Processed && e.LockedUntil != nil && e.LockedUntil.After(now):
			tb.Errorf("event %s is still leased (until %v)", e.MessageID, e.LockedUntil)
		case !e.Processed:
			tb.Errorf("event %s is still pending (%d attempts)", e.MessageID, e.Attempts)
		}
		n := seen[e.MessageID]
		if n == 0 {
			tally.Lost++
			if tally.Lost <= 5 {
				tb.Errorf("lost: event %s (%s %s) was never delivered", e.MessageID, e.EventType, e.AggregateID)
			}
			continue
		}
		tally.Duplicates += n - 1
		tally.MaxCopies = max(tally.MaxCopies, n)
	}
	for id := range inTable {
		if n := orderEvents[id]; n != 1 {
			tally.Lost++
			tb.Errorf("order %s has %d events, want exactly 1", id, n)
		}
	}
	for id := range seen {
		if !known[id] {
			tally.Phantoms++
			tb.Errorf("phantom: message %s was delivered but is not in the outbox", id)
		}
	}
	return tally
}

// faultSuccess is an Observer that records when each worker last published something.
type faultSuccess struct {
	outboxplugin.NopObserver
	last      atomic.Int64 // unix nanoseconds of the last batch with published messages
	published atomic.Int64
	failed    atomic.Int64
	mu        sync.Mutex
	recent    []faultBatchMark // published batches, for bounds that look back in time
}

// faultBatchMark is a published batch: when it was recorded, and how many messages it published.
type faultBatchMark struct {
	at time.Time
	n  int
}

func (o *faultSuccess) BatchDone(_ context.Context, r outboxplugin.BatchResult) {
	o.failed.Add(int64(len(r.Failed)))
	if len(r.Published) == 0 {
		return
	}
	now := time.Now()
	o.published.Add(int64(len(r.Published)))
	o.last.Store(now.UnixNano())
	o.mu.Lock()
	o.recent = append(o.recent, faultBatchMark{at: now, n: len(r.Published)})
	o.mu.Unlock()
}

// PublishedAfter reports whether a batch with published messages was recorded after t.
func (o *faultSuccess) PublishedAfter(t time.Time) bool {
	return o.last.Load() > t.UnixNano()
}

// PublishedBetween returns how many messages were recorded published in [from, to].
func (o *faultSuccess) PublishedBetween(from, to time.Time) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, b := range o.recent {
		if !b.at.Before(from) && !b.at.After(to) {
			n += b.n
		}
	}
	return n
}

// faultDurations summarises durations as "median/max".
func faultDurations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2].Round(time.Millisecond).String() + "/" + s[len(s)-1].Round(time.Millisecond).String()
}

// faultMustWorker returns outboxplugin.NewWorker(db, pub, opts...), failing tb when that returns an
// error.
func faultMustWorker(tb testing.TB, db *gorm.DB, pub outboxplugin.Publisher, opts ...outboxplugin.WorkerOption) *outboxplugin.Worker {
	tb.Helper()
	w, err := outboxplugin.NewWorker(db, pub, opts...)
	if err != nil {
		tb.Fatalf("new worker: %v", err)
	}
	return w
}

// faultRunWorkers runs one Run per worker until the returned stop is called; stop fails the test if a
// Run returned before it was asked to, or with an error.
func faultRunWorkers(ctx context.Context, tb testing.TB, workers ...*outboxplugin.Worker) (stop func()) {
	tb.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(workers))
	for i, w := range workers {
		go func() { results <- result{i, w.Run(runCtx)} }()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			early := runCtx.Err() == nil && len(results) > 0
			cancel()
			for range workers {
				r := <-results
				if r.err != nil {
					tb.Errorf("worker %d: Run returned %v", r.i, r.err)
				}
			}
			if early {
				tb.Errorf("a worker's Run returned before it was stopped")
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
