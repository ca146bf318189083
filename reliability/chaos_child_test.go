package reliability

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// The processes of the kill tests are this test binary started again with -test.run=^TestChaosChild$
// and CHAOS_ROLE naming what to be: a writer, making transactional business writes through the plugin,
// or a relay, an outboxplugin.Worker publishing to a Redis stream. The parent test kills them with
// SIGKILL and reads what they do from their standard output, one line per fact, each starting with
// "CHAOS":
//
//	CHAOS READY <worker-owner>     relay: the worker exists; <owner> is what it stamps on its claims
//	CHAOS PUBLISHED <n>            relay: the broker accepted a batch of n, which is not marked yet
//	CHAOS HELD <n>                 relay: as PUBLISHED, and the relay now waits there to be killed
//	CHAOS READY writer             writer: connected
//	CHAOS BEGIN <intent>           writer: a transaction starts
//	CHAOS COMMIT <intent>          writer: it committed
//	CHAOS ROLLBACK <intent>        writer: it was rolled back on purpose
//	CHAOS ABORT <intent> <error>   writer: it failed (a deadlock, a lost connection) and rolled back
//	CHAOS FATAL <error>            either: the process gives up
//
// A relay reads commands from its standard input: "hold" makes the next batch the broker accepts
// wait, after PUBLISHED and before the worker marks it, so that the parent kills it exactly in the
// window that makes duplicates. Either role stops cleanly when its standard input closes (the parent
// is done with it, or died) or CHAOS_DEADLINE passes.

// Environment of a child process.
const (
	chaosEnvRole           = "CHAOS_ROLE"            // writer or relay
	chaosEnvDialect        = "CHAOS_DIALECT"         // postgres, mysql or sqlite
	chaosEnvDSN            = "CHAOS_DSN"             // the database, as the dialect's driver takes it
	chaosEnvTable          = "CHAOS_TABLE"           // the outbox table
	chaosEnvDeadline       = "CHAOS_DEADLINE"        // Unix milliseconds after which the child stops
	chaosEnvRedis          = "CHAOS_REDIS"           // relay: Redis address
	chaosEnvStream         = "CHAOS_STREAM"          // relay: the one stream every event goes to
	chaosEnvBatch          = "CHAOS_BATCH"           // relay: WithBatchSize
	chaosEnvLease          = "CHAOS_LEASE"           // relay: WithLease
	chaosEnvPublishTimeout = "CHAOS_PUBLISH_TIMEOUT" // relay: WithPublishTimeout
	chaosEnvPoll           = "CHAOS_POLL"            // relay: WithPollInterval
	chaosEnvKeyOrdering    = "CHAOS_KEY_ORDERING"    // relay: "1" for WithKeyOrdering
	chaosEnvMaxAttempts    = "CHAOS_MAX_ATTEMPTS"    // relay: WithMaxAttempts
	chaosEnvRetryBase      = "CHAOS_RETRY_BASE"      // relay: base of an exponential backoff without jitter
	chaosEnvPoisonID       = "CHAOS_POISON_ID"       // relay: message id the publisher refuses...
	chaosEnvPoisonGate     = "CHAOS_POISON_GATE"     // relay: ...until this file exists
	chaosEnvKillerID       = "CHAOS_KILLER_ID"       // relay: message id whose publish SIGKILLs the relay
	chaosEnvSeed           = "CHAOS_SEED"            // writer: seed of its random choices
)

// TestChaosChild is the entry point of the processes the kill tests start. Run directly, it skips.
func TestChaosChild(t *testing.T) {
	role := os.Getenv(chaosEnvRole)
	if role == "" {
		t.Skip("entry point of the processes started by TestKill and TestChaosPoison; nothing to do on its own")
	}
	if err := chaosChildMain(role); err != nil {
		chaosSay("FATAL", strings.ReplaceAll(err.Error(), "\n", " "))
		t.Fatalf("chaos %s: %v", role, err)
	}
}

var chaosStdout sync.Mutex

// chaosSay writes one line of the child protocol to standard output.
func chaosSay(kind string, args ...any) {
	chaosStdout.Lock()
	defer chaosStdout.Unlock()
	fmt.Fprintln(os.Stdout, append([]any{"CHAOS", kind}, args...)...)
}

// chaosChildMain runs a child of the given role until its standard input closes or its deadline.
func chaosChildMain(role string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if ms, err := strconv.ParseInt(os.Getenv(chaosEnvDeadline), 10, 64); err == nil {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, time.UnixMilli(ms))
		defer stop()
	}
	var hold atomic.Bool
	go func() {
		defer cancel() // standard input closed: the parent is done with this process, or gone
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if sc.Text() == "hold" {
				hold.Store(true)
			}
		}
	}()

	dialect, dsn := os.Getenv(chaosEnvDialect), os.Getenv(chaosEnvDSN)
	table := os.Getenv(chaosEnvTable)
	var opts []outboxplugin.Option
	if table != "" {
		opts = append(opts, outboxplugin.WithTableName(table))
	}
	switch role {
	case "writer":
		opts = append(opts, outboxplugin.WithModels(&KillAccount{}), outboxplugin.WithContextHeaders(chaosIntentHeaders))
	case "relay":
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	db, err := chaosGorm(dialect, dsn)
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	sqlDB.SetMaxOpenConns(3)
	if err := db.Use(outboxplugin.New(opts...)); err != nil {
		return err
	}
	if role == "writer" {
		return chaosWriter(ctx, db)
	}
	return chaosRelay(ctx, db, &hold)
}

// The writer's business data. Every transaction of the writer records its intent (a unique id) in
// KillIntent, with the changes it made, in the same transaction as the changes: an intent row exists
// exactly when the transaction committed, and the checker compares it with the outbox. Every event
// carries the intent in its chaos-intent header (WithContextHeaders), so that an event can be traced
// to the transaction that wrote it.

// KillAccount is the business row the writers create, update and delete; the plugin captures it.
type KillAccount struct {
	ID            int64  `gorm:"primaryKey"`
	Balance       int64  `gorm:"not null;default:0"`
	CreatedIntent string `gorm:"size:64;not null"`
	UpdatedIntent string `gorm:"size:64;not null;default:''"`
}

// TableName is kill_accounts.
func (KillAccount) TableName() string { return "kill_accounts" }

// KillIntent records a committed writer transaction: Changes lists the events it must have written,
// as "<event type>:<aggregate id>" separated by spaces. The plugin does not capture it.
type KillIntent struct {
	ID      string `gorm:"primaryKey;size:64"`
	Changes string `gorm:"type:text;not null"`
}

// TableName is kill_intents.
func (KillIntent) TableName() string { return "kill_intents" }

// chaosIntentHeader is the event header that names the writer transaction (intent) of an event.
const chaosIntentHeader = "chaos-intent"

type chaosIntentKey struct{}

// chaosIntentHeaders gives each event the intent of the transaction writing it.
func chaosIntentHeaders(ctx context.Context) map[string]string {
	if id, ok := ctx.Value(chaosIntentKey{}).(string); ok {
		return map[string]string{chaosIntentHeader: id}
	}
	return nil
}

// errChaosRollback rolls a writer transaction back on purpose.
var errChaosRollback = errors.New("chaos: rolled back on purpose")

// chaosWriter runs transactions until ctx ends. A transaction in progress when ctx ends is finished:
// only SIGKILL cuts one short.
func chaosWriter(ctx context.Context, db *gorm.DB) error {
	seed, _ := strconv.ParseUint(os.Getenv(chaosEnvSeed), 10, 64)
	rng := rand.New(rand.NewPCG(seed, uint64(os.Getpid())))
	chaosSay("READY", "writer")
	prefix := fmt.Sprintf("w%d-%04x-", os.Getpid(), rng.Uint32()&0xffff)
	for seq := 1; ctx.Err() == nil; seq++ {
		intent := prefix + strconv.Itoa(seq)
		chaosSay("BEGIN", intent)
		txCtx, cancel := context.WithTimeout(context.WithValue(context.Background(), chaosIntentKey{}, intent), 20*time.Second)
		err := chaosWriteOnce(db.WithContext(txCtx), rng, intent)
		cancel()
		switch {
		case err == nil:
			chaosSay("COMMIT", intent)
		case errors.Is(err, errChaosRollback):
			chaosSay("ROLLBACK", intent)
		default:
			chaosSay("ABORT", intent, strings.ReplaceAll(err.Error(), "\n", " "))
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
	}
	return nil
}

// chaosWriteOnce is one writer transaction: one or two changes picked at random among every write
// path the plugin captures (creates of several rows, updates and deletes by key and by condition, an
// explicit Emit), held open a few milliseconds so that kills land inside transactions, then either
// committed with its intent row or, one time in eight, rolled back.
func chaosWriteOnce(db *gorm.DB, rng *rand.Rand, intent string) error {
	return db.Transaction(func(tx *gorm.DB) error {
		var changes []string
		note := func(eventType string, ids ...int64) {
			for _, id := range ids {
				changes = append(changes, eventType+":"+strconv.FormatInt(id, 10))
			}
		}
		for range 1 + rng.IntN(2) {
			switch op := rng.IntN(10); {
			case op < 4: // create, one to three rows in one statement
				accounts := make([]KillAccount, 1+rng.IntN(3))
				for i := range accounts {
					accounts[i] = KillAccount{Balance: int64(rng.IntN(100)), CreatedIntent: intent}
				}
				if err := tx.Create(&accounts).Error; err != nil {
					return err
				}
				for _, a := range accounts {
					note("KillAccount_create", a.ID)
				}
			case op < 6: // update by key
				ids, err := chaosLockAccounts(tx, rng, 1)
				if err != nil {
					return err
				}
				if len(ids) == 0 {
					continue // no account yet
				}
				err = tx.Model(&KillAccount{ID: ids[0]}).
					Updates(map[string]any{"balance": gorm.Expr("balance + 1"), "updated_intent": intent}).Error
				if err != nil {
					return err
				}
				note("KillAccount_update", ids...)
			case op < 7: // update by condition: the plugin finds the keys itself
				ids, err := chaosLockAccounts(tx, rng, 3)
				if err != nil {
					return err
				}
				if len(ids) == 0 {
					continue // no account yet
				}
				// The balance changes too: a second update of the same rows in one transaction would
				// otherwise write the same intent again, which MySQL counts as no change (its affected
				// rows are changed rows), so the plugin rightly emits nothing for it (docs/capture.md).
				if err := tx.Model(&KillAccount{}).Where("id IN ?", ids).
					Updates(map[string]any{"balance": gorm.Expr("balance + 1"), "updated_intent": intent}).Error; err != nil {
					return err
				}
				note("KillAccount_update", ids...)
			case op < 8: // delete by key
				ids, err := chaosLockAccounts(tx, rng, 1)
				if err != nil {
					return err
				}
				if len(ids) == 0 {
					continue // no account yet
				}
				if err := tx.Delete(&KillAccount{ID: ids[0]}).Error; err != nil {
					return err
				}
				note("KillAccount_delete", ids...)
			case op < 9: // delete by condition
				ids, err := chaosLockAccounts(tx, rng, 2)
				if err != nil {
					return err
				}
				if len(ids) == 0 {
					continue // no account yet
				}
				if err := tx.Where("id IN ?", ids).Delete(&KillAccount{}).Error; err != nil {
					return err
				}
				note("KillAccount_delete", ids...)
			default: // an explicit domain event
				err := outboxplugin.Emit(tx, "KillAudit_note", map[string]string{"intent": intent},
					outboxplugin.WithAggregate("KillAudit", intent))
				if err != nil {
					return err
				}
				changes = append(changes, "KillAudit_note:"+intent)
			}
		}
		time.Sleep(time.Duration(rng.IntN(6)) * time.Millisecond)
		if rng.IntN(8) == 0 {
			return errChaosRollback
		}
		return tx.Create(&KillIntent{ID: intent, Changes: strings.Join(changes, " ")}).Error
	})
}

// chaosLockAccounts locks up to n existing accounts from a random point, in id order, and returns
// their ids: the rows then exist until the transaction ends, so that the changes it records are the
// changes it makes, whatever the other writer does.
func chaosLockAccounts(tx *gorm.DB, rng *rand.Rand, n int) ([]int64, error) {
	var maxID int64
	if err := tx.Model(&KillAccount{}).Select("COALESCE(MAX(id), 0)").Scan(&maxID).Error; err != nil {
		return nil, err
	}
	if maxID == 0 {
		return nil, nil
	}
	var ids []int64
	err := tx.Model(&KillAccount{}).Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).
		Where("id >= ?", 1+rng.Int64N(maxID)).Order("id").Limit(n).Pluck("id", &ids).Error
	return ids, err
}

// chaosRelay runs a worker until ctx ends, publishing every event to one Redis stream through the
// project's Redis publisher, wrapped in chaosPublisher.
func chaosRelay(ctx context.Context, db *gorm.DB, hold *atomic.Bool) error {
	client := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv(chaosEnvRedis),
		ContextTimeoutEnabled: true,
		MaxRetries:            -1, // the worker retries; a re-sent pipeline would be a duplicate of its own
	})
	defer client.Close()
	stream := os.Getenv(chaosEnvStream)
	inner, err := outboxredis.New(client, outboxredis.WithStream(func(outboxplugin.Message) string { return stream }))
	if err != nil {
		return err
	}
	defer inner.Close()
	pub := &chaosPublisher{inner: inner, hold: hold,
		poisonID: os.Getenv(chaosEnvPoisonID), poisonGate: os.Getenv(chaosEnvPoisonGate), killerID: os.Getenv(chaosEnvKillerID),
		keyOrdering: os.Getenv(chaosEnvKeyOrdering) == "1"}

	opts := []outboxplugin.WorkerOption{
		outboxplugin.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
	}
	if t := os.Getenv(chaosEnvTable); t != "" {
		opts = append(opts, outboxplugin.WithTable(t))
	}
	for env, opt := range map[string]func(int) outboxplugin.WorkerOption{
		chaosEnvBatch:       outboxplugin.WithBatchSize,
		chaosEnvMaxAttempts: outboxplugin.WithMaxAttempts,
	} {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%s=%q: %w", env, v, err)
			}
			opts = append(opts, opt(n))
		}
	}
	for env, opt := range map[string]func(time.Duration) outboxplugin.WorkerOption{
		chaosEnvLease:          outboxplugin.WithLease,
		chaosEnvPublishTimeout: outboxplugin.WithPublishTimeout,
		chaosEnvPoll:           outboxplugin.WithPollInterval,
		chaosEnvRetryBase: func(d time.Duration) outboxplugin.WorkerOption {
			return outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: d, Max: 4 * d})
		},
	} {
		if v := os.Getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("%s=%q: %w", env, v, err)
			}
			opts = append(opts, opt(d))
		}
	}
	if os.Getenv(chaosEnvKeyOrdering) == "1" {
		opts = append(opts, outboxplugin.WithKeyOrdering())
	}
	w, err := outboxplugin.NewWorker(db, pub, opts...)
	if err != nil {
		return err
	}
	chaosSay("READY", w.Owner())
	return w.Run(ctx)
}

// errChaosPoison is the failure of the poison event while its gate is closed.
var errChaosPoison = errors.New("chaos: poison event refused")

// chaosPublisher wraps the Redis publisher. It announces every accepted batch on standard output
// (PUBLISHED) before returning, that is before the worker marks it; on the parent's "hold" it then
// waits there (HELD) to be killed. With a poison message id, it refuses that message (and publishes
// the rest of its batch) until the gate file exists. With a killer message id, a batch holding that
// message kills the process, as an out-of-memory kill or a crash in a cgo client would.
type chaosPublisher struct {
	inner      outboxplugin.Publisher
	hold       *atomic.Bool
	poisonID   string
	poisonGate string
	killerID   string
	// keyOrdering: the relay runs WithKeyOrdering, and a batch holding two events of one key is
	// announced (KEYTWICE) for the parent to count.
	keyOrdering bool
}

// Publish implements outboxplugin.Publisher.
func (p *chaosPublisher) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	if p.killerID != "" && slices.ContainsFunc(msgs, func(m outboxplugin.Message) bool { return m.ID == p.killerID }) {
		chaosSay("KILLED_BY", p.killerID)
		if self, err := os.FindProcess(os.Getpid()); err == nil {
			_ = self.Kill() // SIGKILL: no deferred function, no mark, no log line
		}
		select {} // the signal is on its way
	}
	if p.keyOrdering {
		seen := make(map[string]bool, len(msgs))
		for _, m := range msgs {
			if m.Key != "" && seen[m.Key] {
				chaosSay("KEYTWICE", m.Key)
			}
			seen[m.Key] = true
		}
	}
	failed := map[string]error{}
	send := msgs
	if p.poisonID != "" {
		if _, err := os.Stat(p.poisonGate); err != nil {
			send = make([]outboxplugin.Message, 0, len(msgs))
			for _, m := range msgs {
				if m.ID == p.poisonID {
					failed[m.ID] = errChaosPoison
				} else {
					send = append(send, m)
				}
			}
		}
	}
	if len(send) == 0 {
		return outboxplugin.FailedMessages(failed)
	}
	accepted := len(send)
	if err := p.inner.Publish(ctx, send); err != nil {
		var partial *outboxplugin.PublishError
		if !errors.As(err, &partial) {
			return err
		}
		for id, e := range partial.Failed {
			failed[id] = e
		}
		accepted -= len(partial.Failed)
	}
	chaosSay("PUBLISHED", accepted)
	if accepted > 0 && p.hold.CompareAndSwap(true, false) {
		chaosSay("HELD", accepted)
		// The parent kills the process now. Should it not, give up after long enough for the
		// lease to have run out: the batch then counts as failed and is published again anyway.
		time.Sleep(30 * time.Second)
		return errors.New("chaos: held batch was not killed")
	}
	return outboxplugin.FailedMessages(failed)
}
