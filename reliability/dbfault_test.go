package reliability_test

// Database faults (item 3 of the reliability suite), on the real servers:
//
//   - TestRelayConnectionsKilled{Postgres,MariaDB}: while two workers relay a backlog and a writer keeps
//     committing orders through the plugin, the relays' connections are killed again and again —
//     pg_terminate_backend on the backends whose application_name is the relays', KILL CONNECTION on
//     the MariaDB threads of the relays' own user — preferably while one of them is running a
//     statement. Each worker's Run must keep going and recover by itself; in the end nothing is lost,
//     no phantom exists, nothing stays claimed, and the duplicates are no more than the batches in
//     flight at the kills (two per worker: the one being published and the one claimed ahead).
//   - TestLongTransaction{Postgres,MariaDB}: a transaction holds some outbox rows locked
//     (SELECT … FOR UPDATE) while the workers run: every other event — the backlog and the writer's new
//     ones — is delivered meanwhile, the locked ones are never claimed, and they are delivered once the
//     transaction ends, exactly once.
//   - TestLongWriteTransactionAtWorkerStartPostgres: a worker with per-key ordering starts while a write
//     transaction of the application (an order and its event, not yet committed) stays open: the
//     application's other writes go on committing, and the worker publishes them.
//   - TestDatabaseRestartPostgres: the shared servers are never restarted (other work uses them), so
//     this one starts a private, throwaway PostgreSQL (initdb and pg_ctl from /usr/lib/postgresql/*/bin,
//     on a free port, in a temporary directory) and crashes it (pg_ctl stop -m immediate) under load,
//     then starts it again, twice: the workers and the writer, sharing one pool as an application
//     would, recover by themselves; every committed order survives with its event (the relay's
//     asynchronous commits do not leak into the application's transactions), nothing is lost, and the
//     duplicates stay within the batches in flight plus the marks a crash may take back (those of the
//     last few wal_writer_delay periods). It skips when no PostgreSQL binaries are installed.
//
// OUTBOX_SOAK (1, or a duration) kills connections, and restarts the private server, for that long.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
	"github.com/gorm-outbox/outboxplugin/reliability"
	"gorm.io/gorm"
)

// Worker settings of the fault scenarios: a short poll, and a lease short enough that rows whose
// worker lost track of them come back within the test, yet more than twice the publish timeout so
// that each worker pipelines (holds two batches) as it does with the defaults.
const (
	faultBatch          = 100
	faultPoll           = 20 * time.Millisecond
	faultPublishTimeout = time.Second
	faultLease          = 3 * time.Second
)

// faultWorkers returns n workers over the given pools (one each, cycling), publishing to ledger, with
// the fault scenarios' settings, logging to logs and observed by obs.
func faultWorkers(tb testing.TB, pools []*gorm.DB, n int, ledger *faultLedger, logs *faultLogCounter, obs *faultSuccess) []*outboxplugin.Worker {
	tb.Helper()
	workers := make([]*outboxplugin.Worker, n)
	for i := range workers {
		w, err := outboxplugin.NewWorker(pools[i%len(pools)], ledger,
			outboxplugin.WithTable(faultOutboxTable),
			outboxplugin.WithBatchSize(faultBatch),
			outboxplugin.WithPollInterval(faultPoll),
			outboxplugin.WithPublishTimeout(faultPublishTimeout),
			outboxplugin.WithLease(faultLease),
			outboxplugin.WithLogger(slog.New(logs)),
			outboxplugin.WithObserver(obs))
		if err != nil {
			tb.Fatalf("worker %d: %v", i, err)
		}
		workers[i] = w
	}
	return workers
}

// faultKiller kills the relays' database connections.
type faultKiller struct {
	name string
	// kill waits up to wait for a relay connection to be running a statement, then kills every relay
	// connection; it returns how many it killed and whether one was mid-statement.
	kill func(ctx context.Context, wait time.Duration) (killed int, midStatement bool, err error)
}

// TestRelayConnectionsKilledPostgres kills the relays' backends with pg_terminate_backend.
func TestRelayConnectionsKilledPostgres(t *testing.T) {
	writer := faultOpenPostgres(t, "fault_kill_writer")
	faultResetTables(t, writer)
	const relayApp = "fault_kill_relay"
	relays := []*gorm.DB{faultOpenPostgres(t, relayApp+"_0"), faultOpenPostgres(t, relayApp+"_1")}
	admin := faultOpenPostgres(t, "fault_kill_admin")
	killer := &faultKiller{name: "postgres", kill: func(ctx context.Context, wait time.Duration) (int, bool, error) {
		type backend struct {
			Pid   int
			State string
		}
		deadline := time.Now().Add(wait)
		for {
			var backends []backend
			err := admin.WithContext(ctx).Raw(`SELECT pid, COALESCE(state, '') AS state FROM pg_stat_activity
				WHERE datname = ? AND application_name LIKE ? AND pid <> pg_backend_pid()`,
				faultDatabase, relayApp+"_%").Scan(&backends).Error
			if err != nil {
				return 0, false, err
			}
			mid := false
			for _, b := range backends {
				mid = mid || b.State == "active"
			}
			if !mid && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
				continue
			}
			killed := 0
			for _, b := range backends {
				var ok bool
				if err := admin.WithContext(ctx).Raw(`SELECT pg_terminate_backend(?)`, b.Pid).Scan(&ok).Error; err != nil {
					return killed, mid, err
				}
				if ok {
					killed++
				}
			}
			return killed, mid, nil
		}
	}}
	faultRunConnectionKills(t, writer, relays, killer)
}

// faultMySQLRelayUser is the MariaDB user the relays connect as, so that their threads can be told
// apart in the process list: of this run, so that two runs on one server do not drop each other's
// (and within the 32 characters MySQL allows).
var faultMySQLRelayUser = reliability.RunPrefix() + "relay"

// TestRelayConnectionsKilledMariaDB kills the relays' threads with KILL CONNECTION.
func TestRelayConnectionsKilledMariaDB(t *testing.T) {
	writer := faultOpenMySQL(t, "", "")
	faultResetTables(t, writer)
	const password = "outbox-fault"
	// Registered before the user is created, so that a failed grant leaves no user behind.
	t.Cleanup(func() {
		if err := writer.Exec(fmt.Sprintf("DROP USER IF EXISTS '%s'@'%%'", faultMySQLRelayUser)).Error; err != nil {
			t.Errorf("drop user %s: %v", faultMySQLRelayUser, err)
		}
	})
	for _, stmt := range []string{
		fmt.Sprintf("CREATE USER IF NOT EXISTS '%s'@'%%' IDENTIFIED BY '%s'", faultMySQLRelayUser, password),
		fmt.Sprintf("GRANT ALL PRIVILEGES ON %s.* TO '%s'@'%%'", faultDatabase, faultMySQLRelayUser),
	} {
		if err := writer.Exec(stmt).Error; err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	relays := []*gorm.DB{faultOpenMySQL(t, faultMySQLRelayUser, password), faultOpenMySQL(t, faultMySQLRelayUser, password)}
	admin := faultOpenMySQL(t, "", "")
	killer := &faultKiller{name: "mariadb", kill: func(ctx context.Context, wait time.Duration) (int, bool, error) {
		type thread struct {
			ID      int64
			Command string
		}
		deadline := time.Now().Add(wait)
		for {
			var threads []thread
			err := admin.WithContext(ctx).Raw(`SELECT ID AS id, COMMAND AS command FROM information_schema.PROCESSLIST
				WHERE USER = ? AND DB = ?`, faultMySQLRelayUser, faultDatabase).Scan(&threads).Error
			if err != nil {
				return 0, false, err
			}
			mid := false
			for _, th := range threads {
				mid = mid || th.Command == "Query"
			}
			if !mid && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
				continue
			}
			killed := 0
			for _, th := range threads {
				err := admin.WithContext(ctx).Exec("KILL CONNECTION " + strconv.FormatInt(th.ID, 10)).Error
				switch {
				case err == nil:
					killed++
				case strings.Contains(err.Error(), "Unknown thread id"): // it ended meanwhile
				default:
					return killed, mid, err
				}
			}
			return killed, mid, nil
		}
	}}
	faultRunConnectionKills(t, writer, relays, killer)
}

// faultRunConnectionKills is the connection-kill scenario: writer (plugin registered, tables reset)
// commits orders, two workers on the relays' pools relay a backlog, and killer kills the relays'
// connections, waiting after each kill until a worker has published again.
func faultRunConnectionKills(t *testing.T, writer *gorm.DB, relays []*gorm.DB, killer *faultKiller) {
	window := 5 * time.Second
	if soak := faultSoak(t); soak > 0 {
		window = soak
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second+window)
	defer cancel()

	if _, err := outboxtest.Fill(ctx, writer, 8000, outboxtest.FillOptions{Table: faultOutboxTable}); err != nil {
		t.Fatal(err)
	}
	ledger := faultNewLedger(20 * time.Millisecond)
	logs := faultNewLogCounter()
	obs := &faultSuccess{}
	const workers = 2
	stopWorkers := faultRunWorkers(ctx, t, faultWorkers(t, relays, workers, ledger, logs, obs)...)
	w := faultStartWriter(ctx, writer, 10*time.Millisecond)
	defer w.Stop()

	var (
		kills, killed, midStatement int
		recoveries                  []time.Duration
		end                         = time.Now().Add(window)
	)
	faultWaitFor(ctx, t, 20*time.Second, killer.name+": the workers publish", func() bool { return obs.published.Load() > 0 })
	for time.Now().Before(end) {
		time.Sleep(time.Duration(50+rand.IntN(250)) * time.Millisecond)
		n, mid, err := killer.kill(ctx, 300*time.Millisecond)
		if err != nil {
			t.Fatalf("kill the relays' connections: %v", err)
		}
		if n == 0 {
			continue
		}
		killAt := time.Now()
		kills++
		killed += n
		if mid {
			midStatement++
		}
		recoveries = append(recoveries, faultWaitFor(ctx, t, 15*time.Second,
			fmt.Sprintf("%s: a worker publishes again after kill %d", killer.name, kills),
			func() bool { return obs.PublishedAfter(killAt) }))
	}
	w.Stop()
	// Rows whose outcome a kill interrupted stay leased until their lease ends, then any worker
	// takes them again.
	faultWaitFor(ctx, t, 30*time.Second+faultLease, killer.name+": every event published after the kills", func() bool {
		n, err := faultPending(ctx, writer)
		return err == nil && n == 0
	})
	stopWorkers()

	if kills < 3 {
		t.Errorf("only %d kills landed: the scenario did not exercise the relays", kills)
	}
	seen, _ := ledger.Deliveries()
	tally := faultCheck(ctx, t, writer, w, seen)
	bound := kills * workers * 2 * faultBatch
	if tally.Duplicates > bound {
		t.Errorf("%d duplicates, more than the %d events in flight at %d kills (%d workers × 2 batches of %d)",
			tally.Duplicates, bound, kills, workers, faultBatch)
	}
	t.Logf("FIGURES dbfault/kill-%s events=%d orders=%d kills=%d connections_killed=%d mid_statement=%d lost=%d phantoms=%d "+
		"dup=%d max_copies=%d inflight_bound=%d recovery=%s logs=%d",
		killer.name, tally.Events, tally.Orders, kills, killed, midStatement, tally.Lost, tally.Phantoms,
		tally.Duplicates, tally.MaxCopies, bound, faultDurations(recoveries), logs.Total())
}

// TestLongTransactionPostgres holds outbox rows locked in a PostgreSQL transaction while workers run.
func TestLongTransactionPostgres(t *testing.T) {
	db := faultOpenPostgres(t, "fault_longtx")
	faultResetTables(t, db)
	faultRunLongTransaction(t, "postgres", db)
}

// TestLongTransactionMariaDB holds outbox rows locked in a MariaDB transaction while workers run.
func TestLongTransactionMariaDB(t *testing.T) {
	db := faultOpenMySQL(t, "", "")
	faultResetTables(t, db)
	faultRunLongTransaction(t, "mariadb", db)
}

// faultRunLongTransaction is the long-transaction scenario on db (plugin registered, tables reset).
func faultRunLongTransaction(t *testing.T, name string, db *gorm.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const events, every = 2000, 40 // every 40th event of the backlog is locked: 50 rows
	filled, err := outboxtest.Fill(ctx, db, events, outboxtest.FillOptions{Table: faultOutboxTable})
	if err != nil {
		t.Fatal(err)
	}
	var (
		lockedIDs []int64
		locked    = map[string]bool{}
	)
	for i := 0; i < len(filled); i += every {
		lockedIDs = append(lockedIDs, filled[i].ID)
		locked[filled[i].MessageID] = true
	}
	lastFilled := filled[len(filled)-1].ID

	// The long transaction: row locks by primary key only (no gap or next-key locks on MariaDB).
	holder := db.WithContext(ctx).Begin()
	if holder.Error != nil {
		t.Fatal(holder.Error)
	}
	defer holder.Rollback()
	var got []int64
	if err := holder.Raw(`SELECT id FROM `+faultOutboxTable+` WHERE id IN ? FOR UPDATE`, lockedIDs).Scan(&got).Error; err != nil {
		t.Fatalf("lock rows: %v", err)
	}
	if len(got) != len(lockedIDs) {
		t.Fatalf("locked %d rows, want %d", len(got), len(lockedIDs))
	}
	heldAt := time.Now()

	ledger := faultNewLedger(0)
	logs := faultNewLogCounter()
	obs := &faultSuccess{}
	stopWorkers := faultRunWorkers(ctx, t, faultWorkers(t, []*gorm.DB{db}, 2, ledger, logs, obs)...)
	w := faultStartWriter(ctx, db, 10*time.Millisecond)
	defer w.Stop()

	// Everything else of the backlog flows past the locked rows.
	othersAfter := faultWaitFor(ctx, t, 30*time.Second, name+": the unlocked backlog is published while rows are locked", func() bool {
		var n int64
		err := db.WithContext(ctx).Table(faultOutboxTable).
			Where("id <= ? AND id NOT IN ? AND processed = ?", lastFilled, lockedIDs, false).Count(&n).Error
		return err == nil && n == 0
	})
	// So do the writer's new events, for a while longer, and the locked rows stay untouched.
	writerBefore := obs.published.Load()
	time.Sleep(time.Second)
	if obs.published.Load() == writerBefore {
		t.Errorf("no new event was published while the rows were locked")
	}
	var touched int64
	if err := db.WithContext(ctx).Table(faultOutboxTable).
		Where("id IN ? AND (processed = ? OR attempts > 0 OR locked_by <> ?)", lockedIDs, true, outboxplugin.NoLeaseOwner).
		Count(&touched).Error; err != nil {
		t.Fatal(err)
	}
	if touched != 0 {
		t.Errorf("%d locked rows were claimed or marked while the transaction held them", touched)
	}
	seen, _ := ledger.Deliveries()
	for id := range locked {
		if seen[id] > 0 {
			t.Errorf("locked event %s was delivered while the transaction held it", id)
		}
	}
	held := time.Since(heldAt)
	if err := holder.Commit().Error; err != nil {
		t.Fatalf("end the long transaction: %v", err)
	}
	endedAt := time.Now()

	lockedAfter := faultWaitFor(ctx, t, 30*time.Second, name+": the locked rows are published once the transaction ends", func() bool {
		seen, _ := ledger.Deliveries()
		for id := range locked {
			if seen[id] == 0 {
				return false
			}
		}
		return true
	})
	_, first := ledger.Deliveries()
	var lastLocked time.Time
	for id := range locked {
		if first[id].After(lastLocked) {
			lastLocked = first[id]
		}
	}
	w.Stop()
	faultWaitFor(ctx, t, 30*time.Second, name+": every event published", func() bool {
		n, err := faultPending(ctx, db)
		return err == nil && n == 0
	})
	stopWorkers()

	seen, _ = ledger.Deliveries()
	tally := faultCheck(ctx, t, db, w, seen)
	if tally.Duplicates != 0 {
		t.Errorf("%d duplicates without any fault", tally.Duplicates)
	}
	t.Logf("FIGURES dbfault/longtx-%s events=%d orders=%d locked=%d held=%v lost=%d phantoms=%d dup=%d "+
		"others_published_in=%v locked_published_after_commit=%v",
		name, tally.Events, tally.Orders, len(lockedIDs), held.Round(time.Millisecond), tally.Lost, tally.Phantoms,
		tally.Duplicates, othersAfter.Round(time.Millisecond), max(lockedAfter, lastLocked.Sub(endedAt)).Round(time.Millisecond))
}

// TestLongWriteTransactionAtWorkerStartPostgres starts a worker with per-key ordering while a write
// transaction of the application — an order written through the plugin, so a row of the outbox — stays
// open. The index that ordering needs already exists (a first worker created it); the application's
// other writes must go on committing meanwhile, and the worker must publish them.
func TestLongWriteTransactionAtWorkerStartPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := faultOpenPostgres(t, "fault_longtx_start")
	faultResetTables(t, db)
	ledger := faultNewLedger(0)
	logs := faultNewLogCounter()
	obs := &faultSuccess{}
	options := []outboxplugin.WorkerOption{
		outboxplugin.WithTable(faultOutboxTable), outboxplugin.WithKeyOrdering(),
		outboxplugin.WithPollInterval(faultPoll), outboxplugin.WithLogger(slog.New(logs)), outboxplugin.WithObserver(obs),
	}
	// The migration created the per-key index; a first worker has run.
	if err := outboxplugin.AutoMigrate(db, outboxplugin.WithKeyOrderingIndex()); err != nil {
		t.Fatal(err)
	}
	if _, err := faultMustWorker(t, db, ledger, options...).ProcessOnce(ctx); err != nil {
		t.Fatalf("first worker: %v", err)
	}

	w := faultStartWriter(ctx, db, 10*time.Millisecond)
	defer w.Stop()
	holder := db.WithContext(ctx).Begin()
	if holder.Error != nil {
		t.Fatal(holder.Error)
	}
	defer holder.Rollback()
	if err := holder.Create(&faultOrder{Ref: "long", Amount: -1}).Error; err != nil {
		t.Fatalf("the long transaction's write: %v", err)
	}
	heldAt := time.Now()
	stopWorkers := faultRunWorkers(ctx, t, faultMustWorker(t, db, ledger, options...))

	const hold = 2 * time.Second
	committed0, published0 := w.Committed(), obs.published.Load()
	time.Sleep(hold)
	commits, published := w.Committed()-committed0, obs.published.Load()-published0
	// The writer commits every 10 ms: 200 in the hold when nothing stops it. A quarter is plenty
	// on a loaded machine; a stall shows as a handful.
	if commits < int(hold/(40*time.Millisecond)) {
		t.Errorf("the application committed %d writes in %v while a worker started during a long write transaction: "+
			"its writes queued behind the worker's start-up statement", commits, hold)
	}
	if published == 0 {
		t.Errorf("the worker published nothing in %v while a write transaction stayed open", hold)
	}
	if err := holder.Commit().Error; err != nil {
		t.Fatalf("end the long transaction: %v", err)
	}
	held := time.Since(heldAt)
	w.Stop()
	faultWaitFor(ctx, t, 30*time.Second, "every event published", func() bool {
		n, err := faultPending(ctx, db)
		return err == nil && n == 0
	})
	stopWorkers()
	seen, _ := ledger.Deliveries()
	tally := faultCheck(ctx, t, db, w, seen)
	if tally.Duplicates != 0 {
		t.Errorf("%d duplicates without any fault", tally.Duplicates)
	}
	t.Logf("FIGURES dbfault/longtx-start-postgres events=%d orders=%d held=%v commits_while_held=%d published_while_held=%d lost=%d phantoms=%d dup=%d",
		tally.Events, tally.Orders, held.Round(time.Millisecond), commits, published, tally.Lost, tally.Phantoms, tally.Duplicates)
}

// faultPGServer is a private PostgreSQL server in a temporary directory, run by the postgres user
// when the test runs as root.
type faultPGServer struct {
	bin, dir, data string
	port           int
	cred           *syscall.Credential
}

// faultStartPrivatePostgres initialises and starts a private PostgreSQL server, stopped and removed
// when the test ends. It skips the test when no PostgreSQL binaries are installed or the server
// cannot be initialised here: it is an extra, not one of the shared services.
func faultStartPrivatePostgres(t *testing.T) *faultPGServer {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		t.Skip("no PostgreSQL binaries under /usr/lib/postgresql/*/bin: database restart not run (the shared servers are never restarted)")
	}
	sort.Strings(bins)
	s := &faultPGServer{bin: filepath.Dir(bins[len(bins)-1])}
	dir, err := os.MkdirTemp("", "outbox-fault-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s.dir, s.data = dir, filepath.Join(dir, "data")
	if os.Geteuid() == 0 { // initdb refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("running as root without a postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if out, err := s.run("initdb", "-D", s.data, "-U", "postgres", "-A", "trust", "--no-sync"); err != nil {
		t.Skipf("initdb failed, database restart not run: %v\n%s", err, out)
	}
	if out, err := s.start(); err != nil {
		t.Skipf("the private PostgreSQL did not start, database restart not run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := s.run("pg_ctl", "-D", s.data, "-m", "immediate", "-w", "stop"); err != nil &&
			!strings.Contains(string(out), "Is server running?") {
			t.Errorf("stop the private PostgreSQL: %v\n%s", err, out)
		}
	})
	return s
}

// run runs one of the server's binaries, as the postgres user when the test runs as root.
func (s *faultPGServer) run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd.CombinedOutput()
}

// start starts the server and waits until it accepts connections.
func (s *faultPGServer) start() ([]byte, error) {
	return s.run("pg_ctl", "-D", s.data, "-l", filepath.Join(s.dir, "server.log"), "-w", "-t", "30",
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", s.port, s.dir), "start")
}

// crash stops the server the way a crash does: every process at once, no checkpoint, no flush of
// what the WAL writer has not written yet.
func (s *faultPGServer) crash() ([]byte, error) {
	return s.run("pg_ctl", "-D", s.data, "-m", "immediate", "-w", "stop")
}

// TestDatabaseRestartPostgres crashes and restarts a private PostgreSQL server under load.
func TestDatabaseRestartPostgres(t *testing.T) {
	restarts := 2
	soak := faultSoak(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second+2*soak)
	defer cancel()
	server := faultStartPrivatePostgres(t)

	// One pool for the application's writes and the relay, as in a service that runs its worker.
	db := faultOpenPostgresDSN(t, fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable application_name=fault_restart", server.port))
	faultResetTables(t, db)
	var walWriterDelay string
	if err := db.Raw(`SHOW wal_writer_delay`).Scan(&walWriterDelay).Error; err != nil {
		t.Fatal(err)
	}
	if _, err := outboxtest.Fill(ctx, db, 3000, outboxtest.FillOptions{Table: faultOutboxTable}); err != nil {
		t.Fatal(err)
	}
	ledger := faultNewLedger(10 * time.Millisecond)
	logs := faultNewLogCounter()
	obs := &faultSuccess{}
	const workers = 2
	stopWorkers := faultRunWorkers(ctx, t, faultWorkers(t, []*gorm.DB{db}, workers, ledger, logs, obs)...)
	w := faultStartWriter(ctx, db, 10*time.Millisecond)
	defer w.Stop()

	var (
		crashes              int
		bound                int
		relayRecoveries      []time.Duration
		writerRecoveries     []time.Duration
		downtimes            []time.Duration
		soakEnd              = time.Now().Add(soak)
		lookBack             = time.Second // covers the relay's asynchronous commits: 3 × wal_writer_delay (600 ms by default)
		committedBeforeCrash int
	)
	for i := 0; i < restarts || time.Now().Before(soakEnd); i++ {
		time.Sleep(time.Duration(1000+rand.IntN(1000)) * time.Millisecond)
		crashAt := time.Now()
		if out, err := server.crash(); err != nil {
			t.Fatalf("crash the private PostgreSQL: %v\n%s", err, out)
		}
		crashes++
		committedBeforeCrash = w.Committed()
		// At a crash, each worker may have two batches published and not yet recorded, and the marks
		// committed asynchronously in the last wal_writer_delays may be lost: both come back.
		bound += workers*2*faultBatch + obs.PublishedBetween(crashAt.Add(-lookBack), crashAt)
		time.Sleep(1500 * time.Millisecond)
		if out, err := server.start(); err != nil {
			t.Fatalf("restart the private PostgreSQL: %v\n%s", err, out)
		}
		upAt := time.Now()
		downtimes = append(downtimes, upAt.Sub(crashAt))
		// Both recover on their own; measure each from the moment the server accepts connections.
		var relayBack, writerBack time.Duration
		faultWaitFor(ctx, t, 40*time.Second, fmt.Sprintf("the workers and the writer work again after restart %d", crashes), func() bool {
			if relayBack == 0 && obs.PublishedAfter(upAt) {
				relayBack = time.Since(upAt)
			}
			if writerBack == 0 && w.Committed() > committedBeforeCrash {
				writerBack = time.Since(upAt)
			}
			return relayBack > 0 && writerBack > 0
		})
		relayRecoveries = append(relayRecoveries, relayBack)
		writerRecoveries = append(writerRecoveries, writerBack)
	}
	w.Stop()
	faultWaitFor(ctx, t, 40*time.Second+faultLease, "every event published after the restarts", func() bool {
		n, err := faultPending(ctx, db)
		return err == nil && n == 0
	})
	stopWorkers()

	seen, _ := ledger.Deliveries()
	tally := faultCheck(ctx, t, db, w, seen)
	_, inDoubt, _ := w.Outcome()
	if tally.Duplicates > bound {
		t.Errorf("%d duplicates, more than the bound of %d (batches in flight and marks of the last %v at %d crashes)",
			tally.Duplicates, bound, lookBack, crashes)
	}
	t.Logf("FIGURES dbfault/restart-postgres events=%d orders=%d crashes=%d writes_failed=%d lost=%d phantoms=%d dup=%d "+
		"bound=%d down=%s relay_recovery=%s writer_recovery=%s wal_writer_delay=%s logs=%d",
		tally.Events, tally.Orders, crashes, inDoubt, tally.Lost, tally.Phantoms, tally.Duplicates, bound,
		faultDurations(downtimes), faultDurations(relayRecoveries), faultDurations(writerRecoveries), walWriterDelay, logs.Total())
}
