package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"gorm.io/gorm"
)

// The kill scenario's settings. The relays run with the default lease and publish timeout: failover
// after a SIGKILL is what the defaults give. A small batch makes the in-flight bound (kills × 2
// batches × batch size) tight enough to mean something.
const (
	killOutbox  = "kill_outbox"
	killWriters = 2
	killRelays  = 3
	killBatch   = 20
	killLease   = outboxplugin.DefaultLease
	killPoll    = 100 * time.Millisecond
	// killRecoverySlack is how long past its lease a dead relay's rows may stay leased: the other
	// relays' poll interval, a claim, and the scheduling delays of a loaded 2-CPU machine. With the
	// default lease the bound is 8 s, inside the 10 s failover the relay promises.
	killRecoverySlack = 3 * time.Second
)

// TestKill is the kill scenario of the reliability suite, on PostgreSQL, MariaDB and SQLite: two
// writer processes make transactional business writes through the plugin, three relay processes
// publish the outbox to a Redis stream, and a consumer records every message it reads in a ledger.
// For the chaos phase (10 s; OUTBOX_SOAK=1 for 5 minutes, or OUTBOX_SOAK=<duration>) writers and
// relays are killed with SIGKILL at random moments and restarted — a third of the relay kills exactly
// between "published" and "marked" — with at least two relays running at all times. Then the writers
// stop, the relays drain the outbox, and the test checks:
//
//   - every committed transaction has exactly the events of its changes, once each, and every
//     business row its events; a transaction that did not commit (rolled back, failed, or killed
//     half-way) has none (phantoms);
//   - every event was published at least once (lost), and the duplicates are no more than the events
//     in flight at the relay kills (kills × 2 batches × batch size), and no fewer than the batches
//     killed between publish and mark;
//   - no row is left pending, leased or dead, and a killed relay's rows were taken over within its
//     lease plus killRecoverySlack.
//
// It logs a FIGURES line per database (events written, kills, lost, phantoms, duplicates against the
// bound, the longest time a dead relay's rows stayed leased, and the time to drain after the last
// kill) for docs/reliability.md.
func TestKill(t *testing.T) {
	phase := chaosDuration(t, 10*time.Second, len(chaosDialects))
	for _, dialect := range chaosDialects {
		t.Run(dialect, func(t *testing.T) { killScenario(t, dialect, phase) })
	}
}

// killFigures are the counts of one run of the kill scenario.
type killFigures struct {
	events                        int // outbox rows written (all committed)
	committed, rolledBack, failed int // writer transactions by outcome line
	killedInTx, inDoubt           int // begun, no outcome line: not committed / committed all the same
	writerKills, relayKills       int
	windowKills, heldEvents       int // relay kills between publish and mark, and the events of those batches
	batches                       int64
	lost, phantoms, duplicates    int
	stuck                         int
	maxLeased                     time.Duration // longest time a dead relay's rows stayed leased
	leasedKills                   int           // relay kills that left rows leased
	drain                         time.Duration // from the last kill to every event in the ledger
}

func killScenario(t *testing.T, dialect string, phase time.Duration) {
	d := chaosDialectFor(t, dialect)
	stream := chaosName("kill", dialect)
	rdb := chaosRedis(t, stream)
	db := chaosOpen(t, d, killOutbox)
	if err := db.Migrator().DropTable(&KillAccount{}, &KillIntent{}, killOutbox); err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&KillAccount{}, &KillIntent{}); err != nil {
		t.Fatal(err)
	}
	if err := outboxplugin.AutoMigrate(db); err != nil {
		t.Fatal(err)
	}

	budget := phase + 3*time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	consumeCtx, stopConsumer := context.WithCancel(ctx)
	ledger, consumerDone := chaosConsume(consumeCtx, rdb, stream)
	defer func() { stopConsumer(); consumerDone() }()

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	deadline := time.Now().Add(budget)
	common := []string{
		chaosEnvDialect + "=" + d.name, chaosEnvDSN + "=" + d.dsn, chaosEnvTable + "=" + killOutbox,
		chaosEnvDeadline + "=" + strconv.FormatInt(deadline.UnixMilli(), 10),
	}
	relayEnv := append(slices.Clone(common),
		chaosEnvRedis+"="+chaosRedisAddr(), chaosEnvStream+"="+stream,
		chaosEnvBatch+"="+strconv.Itoa(killBatch), chaosEnvPoll+"="+killPoll.String())

	var f killFigures
	intentLog := &killIntentLog{outcome: map[string]string{}}
	var batches atomic.Int64
	onRelay := func(_ *chaosProc, kind string, _ []string) {
		if kind == "PUBLISHED" {
			batches.Add(1)
		}
	}
	writers := make([]*chaosProc, killWriters)
	relays := make([]*chaosProc, killRelays)
	startWriter := func(i int) {
		writers[i] = chaosStart(t, "writer", append(slices.Clone(common), chaosEnvSeed+"="+strconv.FormatUint(rng.Uint64(), 10)), intentLog.onLine)
	}
	startRelay := func(i int) { relays[i] = chaosStart(t, "relay", relayEnv, onRelay) }
	for i := range relays {
		startRelay(i)
	}
	for i := range writers {
		startWriter(i)
	}
	for _, p := range append(slices.Clone(relays), writers...) {
		if err := p.waitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	monitor := &killLeaseMonitor{db: db, killed: map[string]time.Time{}}
	monitorCtx, stopMonitor := context.WithCancel(ctx)
	monitorDone := make(chan struct{})
	go func() { defer close(monitorDone); monitor.run(monitorCtx) }()
	defer func() { stopMonitor(); <-monitorDone }()

	// The chaos phase.
	var lastKill time.Time
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }
	now := time.Now()
	end := now.Add(phase)
	nextWriterKill, nextRelayKill := now.Add(between(200*time.Millisecond, time.Second)), now.Add(between(300*time.Millisecond, 1200*time.Millisecond))
	for time.Now().Before(end) {
		for _, p := range append(slices.Clone(relays), writers...) {
			if msg := p.unexpectedExit(); msg != "" {
				t.Fatal(msg)
			}
		}
		time.Sleep(min(time.Until(nextWriterKill), time.Until(nextRelayKill), time.Until(end)))
		if now := time.Now(); !now.Before(nextWriterKill) && now.Before(end) {
			i := rng.IntN(killWriters)
			lastKill = writers[i].kill()
			f.writerKills++
			time.Sleep(between(0, 100*time.Millisecond))
			startWriter(i)
			nextWriterKill = time.Now().Add(between(200*time.Millisecond, time.Second))
		}
		if now := time.Now(); !now.Before(nextRelayKill) && now.Before(end) {
			i := rng.IntN(killRelays)
			r := relays[i]
			if f.relayKills%3 == 1 { // one kill in three between publish and mark
				r.hold()
				select {
				case n := <-r.held:
					f.windowKills++
					f.heldEvents += n
				case <-time.After(2 * time.Second): // nothing to publish: an ordinary kill
				case <-r.done:
				}
			}
			lastKill = r.kill()
			monitor.add(r.ownerID(), lastKill)
			f.relayKills++
			time.Sleep(between(0, 300*time.Millisecond))
			startRelay(i)
			nextRelayKill = time.Now().Add(between(300*time.Millisecond, 1200*time.Millisecond))
		}
	}

	// The writers stop; the relays, no longer killed, drain the outbox.
	for _, w := range writers {
		if err := w.stop(30 * time.Second); err != nil {
			t.Error(err)
		}
	}
	var total, pending int64
	err := chaosWaitFor(killLease+30*time.Second, 50*time.Millisecond, "drain", func() (bool, error) {
		if err := db.Table(killOutbox).Count(&total).Error; err != nil {
			return false, err
		}
		if err := db.Table(killOutbox).Where("processed = ?", false).Count(&pending).Error; err != nil {
			return false, err
		}
		return pending == 0 && int64(ledger.distinct()) >= total, nil
	})
	f.drain = time.Since(lastKill)
	if err != nil {
		t.Errorf("%v: %d events written, %d pending, %d distinct in the ledger", err, total, pending, ledger.distinct())
	}
	stopMonitor()
	<-monitorDone
	if err := monitor.poll(ctx); err != nil { // what the last tick did not see
		t.Error(err)
	}
	chaosWindDown(ctx, t, relays, rdb, stream, ledger)
	stopConsumer()
	consumerDone()

	f.batches = batches.Load()
	f.maxLeased, f.leasedKills = monitor.result()
	killCheck(t, db, ledger, intentLog, &f)
	bound := f.relayKills * 2 * killBatch
	t.Logf("FIGURES kill/%s chaos=%v events=%d tx_committed=%d tx_rolled_back=%d tx_failed=%d writer_kills=%d killed_in_tx=%d in_doubt=%d "+
		"relay_kills=%d window_kills=%d held_events=%d batches=%d lost=%d phantoms=%d duplicates=%d dup_bound=%d stuck=%d "+
		"p50_leased_after_kill=%v max_leased_after_kill=%v leased_kills=%d lease=%v drain_after_last_kill=%v",
		dialect, phase, f.events, f.committed, f.rolledBack, f.failed, f.writerKills, f.killedInTx, f.inDoubt,
		f.relayKills, f.windowKills, f.heldEvents, f.batches, f.lost, f.phantoms, f.duplicates, bound, f.stuck,
		monitor.median().Round(time.Millisecond), f.maxLeased.Round(time.Millisecond), f.leasedKills, killLease, f.drain.Round(time.Millisecond))

	if f.duplicates > bound {
		t.Errorf("%d duplicates, more than the events in flight at %d relay kills (%d kills × 2 batches × %d)", f.duplicates, f.relayKills, f.relayKills, killBatch)
	}
	if f.duplicates < f.heldEvents {
		t.Errorf("%d duplicates, fewer than the %d events of the batches killed between publish and mark: those must be published again", f.duplicates, f.heldEvents)
	}
	if limit := killLease + killRecoverySlack; f.maxLeased > limit {
		t.Errorf("a dead relay's rows stayed leased %v after the kill, more than the lease %v plus %v", f.maxLeased, killLease, killRecoverySlack)
	}
	// The scenario must have exercised what it claims to.
	minKills := int(phase / (2 * time.Second))
	switch {
	case f.writerKills < minKills || f.relayKills < minKills:
		t.Errorf("only %d writer and %d relay kills in %v; want at least %d of each", f.writerKills, f.relayKills, phase, minKills)
	case f.windowKills == 0:
		t.Errorf("no relay was killed between publish and mark in %d relay kills", f.relayKills)
	case f.killedInTx == 0:
		t.Errorf("no writer was killed inside a transaction in %d writer kills", f.writerKills)
	case f.rolledBack == 0 || f.committed < 100:
		t.Errorf("%d transactions committed and %d rolled back: the writers did too little", f.committed, f.rolledBack)
	}
	if !t.Failed() {
		if err := db.Migrator().DropTable(&KillAccount{}, &KillIntent{}, killOutbox); err != nil {
			t.Error(err)
		}
	}
}

// killIntentLog records the writers' BEGIN and outcome lines.
type killIntentLog struct {
	mu      sync.Mutex
	begun   []string
	outcome map[string]string // intent → COMMIT, ROLLBACK or ABORT
}

func (l *killIntentLog) onLine(_ *chaosProc, kind string, args []string) {
	if len(args) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch kind {
	case "BEGIN":
		l.begun = append(l.begun, args[0])
	case "COMMIT", "ROLLBACK", "ABORT":
		l.outcome[args[0]] = kind
	}
}

// killLeaseMonitor measures how long the rows a killed relay had leased stay leased to it: from the
// kill until no row is stamped with its id any more (another relay took each over, once the lease ran
// out). A row is stamped until it is marked, failed or released, so a dead relay's stamp goes only
// when the row is claimed again.
type killLeaseMonitor struct {
	db     *gorm.DB
	mu     sync.Mutex
	killed map[string]time.Time // owner → kill time, while rows are stamped with it
	max    time.Duration
	leased int
	seen   map[string]bool // owners seen holding rows
	taken  []time.Duration // per kill that left rows leased: the time until all were taken over
}

func (m *killLeaseMonitor) add(owner string, at time.Time) {
	if owner == "" { // killed before it said READY: it never claimed
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.killed[owner] = at
}

func (m *killLeaseMonitor) run(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_ = m.poll(ctx) // a failed poll only delays the measurement
		}
	}
}

// poll looks up the rows still stamped with each killed owner.
func (m *killLeaseMonitor) poll(ctx context.Context) error {
	m.mu.Lock()
	owners := make([]string, 0, len(m.killed))
	for o := range m.killed {
		owners = append(owners, o)
	}
	m.mu.Unlock()
	if len(owners) == 0 {
		return nil
	}
	var held []struct {
		LockedBy string
		N        int
	}
	err := m.db.WithContext(ctx).Table(killOutbox).Select("locked_by, COUNT(*) AS n").
		Where("locked_by IN ?", owners).Group("locked_by").Scan(&held).Error
	if err != nil {
		return fmt.Errorf("lease monitor: %w", err)
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[string]bool{}
	}
	holding := map[string]bool{}
	for _, h := range held {
		holding[h.LockedBy] = h.N > 0
		if h.N > 0 && !m.seen[h.LockedBy] {
			m.seen[h.LockedBy] = true
			m.leased++
		}
	}
	for _, o := range owners {
		if !holding[o] {
			m.max = max(m.max, now.Sub(m.killed[o]))
			if m.seen[o] {
				m.taken = append(m.taken, now.Sub(m.killed[o]))
			}
			delete(m.killed, o)
		}
	}
	return nil
}

// median is the median time until the rows of a kill that left rows leased were all taken over.
func (m *killLeaseMonitor) median() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.taken) == 0 {
		return 0
	}
	d := slices.Clone(m.taken)
	slices.Sort(d)
	return d[len(d)/2]
}

// result is the longest time a dead relay's rows stayed leased, and how many kills left rows leased.
// Owners still holding rows count with their time so far.
func (m *killLeaseMonitor) result() (time.Duration, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	longest := m.max
	for _, at := range m.killed {
		longest = max(longest, time.Since(at))
	}
	return longest, m.leased
}

// killCheck compares the writers' committed intents, the business rows, the outbox and the ledger,
// fills in the figures, and reports every violation (a few examples of each).
func killCheck(t *testing.T, db *gorm.DB, ledger *chaosLedger, intentLog *killIntentLog, f *killFigures) {
	t.Helper()
	var intents []KillIntent
	if err := db.Find(&intents).Error; err != nil {
		t.Fatal(err)
	}
	var accounts []KillAccount
	if err := db.Find(&accounts).Error; err != nil {
		t.Fatal(err)
	}
	var events []outboxplugin.OutboxEvent
	if err := db.Table(killOutbox).Order("id").Find(&events).Error; err != nil {
		t.Fatal(err)
	}
	count, _ := ledger.snapshot()
	f.events = len(events)

	problems := map[string][]string{}
	report := func(kind, format string, args ...any) {
		problems[kind] = append(problems[kind], fmt.Sprintf(format, args...))
	}

	// What the writers said against what the database kept.
	committed := make(map[string][]string, len(intents))
	for _, in := range intents {
		committed[in.ID] = strings.Fields(in.Changes)
	}
	intentLog.mu.Lock()
	begun := slices.Clone(intentLog.begun)
	outcome := make(map[string]string, len(intentLog.outcome))
	for k, v := range intentLog.outcome {
		outcome[k] = v
	}
	intentLog.mu.Unlock()
	begunSet := make(map[string]bool, len(begun))
	for _, id := range begun {
		begunSet[id] = true
		_, kept := committed[id]
		switch o := outcome[id]; {
		case o == "COMMIT":
			f.committed++
			if !kept {
				report("lost commit", "transaction %s reported COMMIT but its intent row is not in the database", id)
			}
		case o == "ROLLBACK" || o == "ABORT":
			if o == "ROLLBACK" {
				f.rolledBack++
			} else {
				f.failed++
			}
			if kept {
				report("phantom commit", "transaction %s reported %s but its intent row is in the database", id, o)
			}
		case kept: // killed after the commit, before it could say so
			f.inDoubt++
			f.committed++
		default:
			f.killedInTx++
		}
	}
	for id := range committed {
		if !begunSet[id] {
			report("phantom commit", "intent %s is in the database but no writer began it", id)
		}
	}

	// Every committed change has exactly one event, and every event a committed change.
	written := map[string][]string{} // intent → its events, as "<type>:<aggregate id>"
	eventOf := map[string]bool{}     // "<intent> <type>:<aggregate id>"
	inOutbox := make(map[string]bool, len(events))
	for _, e := range events {
		inOutbox[e.MessageID] = true
		var headers map[string]string
		_ = json.Unmarshal(e.Headers, &headers)
		intent := headers[chaosIntentHeader]
		change := e.EventType + ":" + e.AggregateID
		if _, ok := committed[intent]; !ok {
			f.phantoms++
			report("phantom event", "event %d (%s) of transaction %q, which did not commit", e.ID, change, intent)
		} else {
			written[intent] = append(written[intent], change)
			eventOf[intent+" "+change] = true
		}
		if !e.Processed || e.LockedBy != nil || e.LockedUntil != nil || e.DeadAt != nil {
			f.stuck++
			report("stuck", "event %d: processed=%v locked_by=%v dead_at=%v attempts=%d", e.ID, e.Processed, e.LockedBy, e.DeadAt, e.Attempts)
		}
		switch n := count[e.MessageID]; {
		case n == 0:
			f.lost++
			report("lost", "event %d (%s, %s) was never published", e.ID, change, e.MessageID)
		case n > 1:
			f.duplicates += n - 1
		}
	}
	for id, changes := range committed {
		want, got := slices.Sorted(slices.Values(changes)), slices.Sorted(slices.Values(written[id]))
		if !slices.Equal(want, got) {
			missing, extra := killDiff(want, got)
			f.lost += len(missing)
			f.phantoms += len(extra)
			report("capture", "transaction %s: changes %v, events %v: missing %v, extra %v", id, want, got, missing, extra)
		}
	}
	for id := range count {
		if !inOutbox[id] {
			f.phantoms++
			report("phantom message", "message %q in the ledger is not in the outbox", id)
		}
	}

	// Every business row has its events: the create that made it, and the update that stamped it last.
	for _, a := range accounts {
		id := strconv.FormatInt(a.ID, 10)
		if _, ok := committed[a.CreatedIntent]; !ok {
			report("phantom row", "account %d was created by %s, which did not commit", a.ID, a.CreatedIntent)
		}
		if !eventOf[a.CreatedIntent+" KillAccount_create:"+id] {
			report("row without event", "account %d has no KillAccount_create event of %s", a.ID, a.CreatedIntent)
		}
		if a.UpdatedIntent != "" && !eventOf[a.UpdatedIntent+" KillAccount_update:"+id] {
			report("row without event", "account %d has no KillAccount_update event of %s", a.ID, a.UpdatedIntent)
		}
	}

	kinds := make([]string, 0, len(problems))
	for k := range problems {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		list := problems[k]
		if len(list) > 5 {
			list = append(list[:5], fmt.Sprintf("... and %d more", len(problems[k])-5))
		}
		t.Errorf("%s: %d:\n  %s", k, len(problems[k]), strings.Join(list, "\n  "))
	}
}

// killDiff returns what is in want and not in got, and the reverse, both sorted multisets.
func killDiff(want, got []string) (missing, extra []string) {
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || i < len(want) && want[i] < got[j]:
			missing = append(missing, want[i])
			i++
		case i == len(want) || got[j] < want[i]:
			extra = append(extra, got[j])
			j++
		default:
			i++
			j++
		}
	}
	return missing, extra
}
