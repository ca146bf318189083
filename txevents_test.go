package outboxplugin_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// statementLog is a GORM logger that keeps the SQL of every statement traced, the plugin's outbox
// INSERTs among them.
type statementLog struct {
	mu    sync.Mutex
	stmts []string
}

func (l *statementLog) LogMode(logger.LogLevel) logger.Interface { return l }
func (l *statementLog) Info(context.Context, string, ...any)     {}
func (l *statementLog) Warn(context.Context, string, ...any)     {}
func (l *statementLog) Error(context.Context, string, ...any)    {}
func (l *statementLog) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	sql, _ := fc()
	l.mu.Lock()
	l.stmts = append(l.stmts, sql)
	l.mu.Unlock()
}

// outboxInserts counts the INSERTs into the outbox table traced since the last call.
func (l *statementLog) outboxInserts() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.stmts {
		if strings.Contains(s, `INSERT INTO "outbox_events"`) || strings.Contains(s, "INSERT INTO `outbox_events`") {
			n++
		}
	}
	l.stmts = nil
	return n
}

// eventSequence is "type aggregate-id" of every event, in the order of the table's ids.
func eventSequence(t testing.TB, db *gorm.DB) []string {
	t.Helper()
	var out []string
	for _, e := range loadEvents(t, db) {
		out = append(out, e.EventType+" "+e.AggregateID)
	}
	return out
}

func eventTypes(t testing.TB, db *gorm.DB) []string {
	t.Helper()
	var out []string
	for _, e := range loadEvents(t, db) {
		out = append(out, e.EventType)
	}
	return out
}

// The events of all statements of a transaction are written in one INSERT at commit, in the order
// of their statements; one per 1000 events for larger transactions. A transaction the plugin does
// not watch (one on a connection pinned with db.Connection) gets an INSERT per statement, as does
// the per-statement mode benchmarks compare against.
func TestOneOutboxInsertPerTransaction(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		base := openDB(t, d, nil)
		resetTables(t, base, append(captureModels, &BenchUser{})...)
		require.NoError(t, base.Use(outboxplugin.New()))
		log := &statementLog{}
		db := base.Session(&gorm.Session{Logger: log})

		require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return serviceTransaction(tx, "svc") }))
		assert.Equal(t, 1, log.outboxInserts(), "one INSERT for the 11 events of 10 statements")
		assert.Equal(t, serviceEvents, eventTypes(t, db), "in statement order")

		// Begin and Commit by hand, with Emit among the writes.
		tx := db.Begin()
		u := User{Name: "by hand"}
		require.NoError(t, tx.Create(&u).Error)
		require.NoError(t, outboxplugin.Emit(tx, "Signed", nil))
		require.NoError(t, tx.Model(&u).Update("age", 7).Error)
		assert.Zero(t, log.outboxInserts(), "held until commit")
		require.NoError(t, tx.Commit().Error)
		assert.Equal(t, 1, log.outboxInserts())
		id := fmt.Sprint(u.ID)
		assert.Equal(t, []string{"User_create " + id, "Signed ", "User_update " + id}, eventSequence(t, db)[len(serviceEvents):])

		// 1001 events: two INSERTs.
		require.NoError(t, db.Exec("DELETE FROM outbox_events").Error)
		log.outboxInserts()
		users := make([]User, 1001)
		for i := range users {
			users[i] = User{Name: fmt.Sprint("bulk", i)}
		}
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return tx.CreateInBatches(&users, 300).Error }))
		assert.Equal(t, 2, log.outboxInserts())
		evs := loadEvents(t, db)
		require.Len(t, evs, len(users))
		for i, e := range evs {
			require.Equal(t, fmt.Sprint(users[i].ID), e.AggregateID, "event %d in row order", i)
		}

		// Not watched: an INSERT per statement.
		require.NoError(t, db.Connection(func(conn *gorm.DB) error {
			return conn.Transaction(func(tx *gorm.DB) error { return serviceTransaction(tx, "pinned") })
		}))
		assert.Equal(t, 10, log.outboxInserts(), "a transaction on a connection of db.Connection")

		perStatement := openDB(t, d, &gorm.Config{Logger: log})
		resetTables(t, perStatement, &outboxplugin.OutboxEvent{}, &BenchUser{})
		log.outboxInserts()
		p := outboxplugin.New()
		outboxplugin.UsePerStatementInserts(p)
		require.NoError(t, perStatement.Use(p))
		require.NoError(t, perStatement.Transaction(func(tx *gorm.DB) error { return serviceTransaction(tx, "each") }))
		assert.Equal(t, 10, log.outboxInserts(), "per-statement mode")
	})
}

// Savepoints: the events of statements rolled back to a savepoint are dropped with their rows, the
// others kept, whether the savepoint is a nested db.Transaction, SavePoint/RollbackTo, SQL run with
// Exec, or SQL sent to the transaction's connection directly, with and without PrepareStmt.
func TestHeldEventsFollowSavepoints(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		for _, prepared := range []bool{false, true} {
			t.Run(fmt.Sprint("PrepareStmt=", prepared), func(t *testing.T) {
				db := setup(t, d, &gorm.Config{PrepareStmt: prepared})
				var kept []string
				create := func(tx *gorm.DB, name string, keep bool) {
					u := User{Name: name}
					require.NoError(t, tx.Create(&u).Error)
					if keep {
						kept = append(kept, fmt.Sprint("User_create ", u.ID))
					}
				}
				ctx := context.Background()
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					create(tx, "a", true)
					require.Error(t, tx.Transaction(func(inner *gorm.DB) error {
						create(inner, "b (rolled back)", false)
						return errors.New("roll back the savepoint")
					}))
					create(tx, "c", true)
					require.NoError(t, tx.Transaction(func(inner *gorm.DB) error {
						create(inner, "d", true)
						return inner.Transaction(func(innermost *gorm.DB) error {
							create(innermost, "e", true)
							return nil
						})
					}))

					require.NoError(t, tx.SavePoint("s1").Error)
					create(tx, "f (rolled back)", false)
					require.NoError(t, tx.SavePoint("s2").Error)
					create(tx, "g (rolled back)", false)
					require.NoError(t, tx.RollbackTo("s1").Error, "past a later savepoint")
					create(tx, "h", true)

					require.NoError(t, tx.Exec("SAVEPOINT s3").Error)
					create(tx, "i (rolled back)", false)
					require.NoError(t, tx.Exec("ROLLBACK TO SAVEPOINT s3").Error)
					require.NoError(t, tx.Exec("RELEASE SAVEPOINT s3").Error)
					create(tx, "j", true)

					// Straight to the connection, around GORM's callbacks (under PrepareStmt, as a
					// prepared statement).
					conn := tx.Statement.ConnPool
					_, err := conn.ExecContext(ctx, "SAVEPOINT s4")
					require.NoError(t, err)
					create(tx, "k (rolled back)", false)
					_, err = conn.ExecContext(ctx, "rollback to savepoint s4")
					require.NoError(t, err)
					create(tx, "l", true)
					_, err = conn.ExecContext(ctx, "SAVEPOINT s5")
					require.NoError(t, err)
					create(tx, "m", true)
					_, err = conn.ExecContext(ctx, "RELEASE SAVEPOINT s5")
					require.NoError(t, err)
					return nil
				}))
				assert.Equal(t, kept, eventSequence(t, db))
				var names []string
				require.NoError(t, db.Model(&User{}).Order("id").Pluck("name", &names).Error)
				assert.Equal(t, []string{"a", "c", "d", "e", "h", "j", "l", "m"}, names)
			})
		}
	})
}

// A transaction reads and changes its own events: the events held are written before a query of
// the outbox table, before SQL run with Exec, and before a GORM write to the outbox table.
func TestTransactionSeesItsHeldEvents(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			require.NoError(t, tx.Create(&User{Name: "a"}).Error)
			var n int64
			require.NoError(t, tx.Model(&outboxplugin.OutboxEvent{}).Count(&n).Error)
			assert.EqualValues(t, 1, n, "Count through the model")

			require.NoError(t, tx.Create(&User{Name: "b"}).Error)
			require.NoError(t, tx.Raw("SELECT COUNT(*) FROM outbox_events").Scan(&n).Error)
			assert.EqualValues(t, 2, n, "raw SQL naming the table")

			require.NoError(t, tx.Create(&User{Name: "c"}).Error)
			var evs []outboxplugin.OutboxEvent
			require.NoError(t, tx.Table("outbox_events").Find(&evs).Error)
			assert.Len(t, evs, 3, "Table(...).Find")

			require.NoError(t, tx.Create(&User{Name: "d"}).Error)
			res := tx.Exec("UPDATE outbox_events SET event_type = 'Renamed'")
			require.NoError(t, res.Error)
			assert.EqualValues(t, 4, res.RowsAffected, "Exec")

			require.NoError(t, tx.Create(&User{Name: "e"}).Error)
			res = tx.Model(&outboxplugin.OutboxEvent{}).Where("event_type = ?", "User_create").Update("event_type", "Renamed too")
			require.NoError(t, res.Error)
			assert.EqualValues(t, 1, res.RowsAffected, "a GORM update of the outbox table")
			return nil
		}))
		assert.Equal(t, []string{"Renamed", "Renamed", "Renamed", "Renamed", "Renamed too"}, eventTypes(t, db))
	})
}

// When the events held cannot be written at commit, the transaction is rolled back and its commit
// fails, naming the statements the events come from: no row is committed without its event. A
// commit the database refuses after the events were written (a deferred constraint) commits neither.
func TestFailedWriteAtCommitRollsBack(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		plain := db.Session(&gorm.Session{NewDB: true})
		// The outbox refuses events of type Rejected.
		if d.name == "sqlite" {
			require.NoError(t, plain.Exec(`CREATE TRIGGER reject_event BEFORE INSERT ON outbox_events
				WHEN NEW.event_type = 'Rejected' BEGIN SELECT RAISE(ABORT, 'event rejected'); END`).Error)
		} else {
			require.NoError(t, plain.Exec(`ALTER TABLE outbox_events ADD CONSTRAINT reject_event CHECK (event_type <> 'Rejected')`).Error)
		}
		reject := func(tx *gorm.DB) error { return outboxplugin.Emit(tx, "Rejected", nil) }

		err := db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "a"}).Error; err != nil {
				return err
			}
			if err := tx.Model(&User{}).Where("name = ?", "a").Update("age", 2).Error; err != nil {
				return err
			}
			return reject(tx)
		})
		require.Error(t, err, "db.Transaction")
		assert.ErrorContains(t, err, `outboxplugin: create User, update User, Emit "Rejected": insert into outbox_events`)
		assert.ErrorContains(t, err, "rolled back")

		tx := db.Begin()
		require.NoError(t, tx.Create(&User{Name: "b"}).Error)
		require.NoError(t, reject(tx))
		require.Error(t, tx.Commit().Error, "Commit by hand")

		sess := db.Session(&gorm.Session{SkipDefaultTransaction: true})
		require.Error(t, sess.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "c"}).Error; err != nil {
				return err
			}
			return reject(tx)
		}), "SkipDefaultTransaction")

		// Written early, before a savepoint, whose error GORM's SavePoint drops on some dialects:
		// the commit fails all the same.
		require.Error(t, db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "d"}).Error; err != nil {
				return err
			}
			if err := reject(tx); err != nil {
				return err
			}
			return tx.Transaction(func(inner *gorm.DB) error { return inner.Create(&User{Name: "e"}).Error })
		}))

		assert.Zero(t, count(t, db, &User{}), "no row committed")
		assert.Empty(t, loadEvents(t, db), "no event committed")

		if d.name == "postgres" {
			// The database refuses the commit itself, after the events went in.
			require.NoError(t, plain.Exec(`ALTER TABLE pets DROP CONSTRAINT IF EXISTS fk_users_pets`).Error)
			require.NoError(t, plain.Exec(`ALTER TABLE pets ADD CONSTRAINT pets_user_deferred
				FOREIGN KEY (user_id) REFERENCES users (id) DEFERRABLE INITIALLY DEFERRED`).Error)
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&User{Name: "f"}).Error; err != nil {
					return err
				}
				return tx.Create(&Pet{Name: "orphan", UserID: 1 << 30}).Error
			})
			require.Error(t, err)
			assert.ErrorContains(t, err, "pets_user_deferred")
			assert.Zero(t, count(t, db, &User{}))
			assert.Empty(t, loadEvents(t, db))
		}
	})
}
