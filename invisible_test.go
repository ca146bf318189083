package outboxplugin_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	"gorm.io/plugin/dbresolver"
)

// The plugin is invisible to the application: a transaction that commits without it commits with
// it, whatever the contexts of its statements, the savepoints it recovers with, the path its
// transaction statements take and the connection pool it runs on; and it commits exactly one event
// per row it created, none for a row it rolled back.

// twinRun runs app once on the database without the plugin and once with it, each time on freshly
// made tables, and returns what each committed: the error of app (nil or not) and the users' names in
// id order. The database is left as the run with the plugin left it.
func twinRun(t *testing.T, d dialect, cfg *gorm.Config, app func(t *testing.T, db *gorm.DB) error) (without, with runOutcome, db *gorm.DB) {
	t.Helper()
	plain := openDB(t, d, cfg)
	resetTables(t, plain, captureModels...)
	without = runOutcome{err: app(t, plain)}
	without.users = userNames(t, plain)

	db = openDB(t, d, cfg)
	resetTables(t, db, captureModels...)
	require.NoError(t, db.Use(outboxplugin.New()))
	with = runOutcome{err: app(t, db)}
	with.users = userNames(t, db)
	return without, with, db
}

type runOutcome struct {
	err   error
	users []string
}

func userNames(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	var names []string
	require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Model(&User{}).Order("id").Pluck("name", &names).Error)
	return names
}

// assertSameOutcome checks that the plugin changed nothing the application sees, and that the
// outbox holds exactly one User_create event per committed user (and the explicit events named).
func assertSameOutcome(t *testing.T, db *gorm.DB, without, with runOutcome, emitted ...string) {
	t.Helper()
	assert.Equal(t, without.err == nil, with.err == nil, "commits with the plugin as without it: without %v, with %v", without.err, with.err)
	assert.Equal(t, without.users, with.users, "the same rows committed")
	assertOneEventPerUser(t, db, emitted...)
}

// assertOneEventPerUser checks that the outbox holds one User_create event per user row, with its
// key, and besides them exactly the events of the types named.
func assertOneEventPerUser(t *testing.T, db *gorm.DB, emitted ...string) {
	t.Helper()
	var ids []uint
	require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Model(&User{}).Order("id").Pluck("id", &ids).Error)
	var want, got, others []string
	for _, id := range ids {
		want = append(want, fmt.Sprint("User_create ", id))
	}
	for _, e := range loadEvents(t, db) {
		if e.EventType == "User_create" {
			got = append(got, "User_create "+e.AggregateID)
		} else {
			others = append(others, e.EventType)
		}
	}
	sort.Strings(want)
	sort.Strings(got)
	sort.Strings(emitted)
	assert.Equal(t, want, got, "one event per committed row, none for a row rolled back")
	assert.Equal(t, emitted, others, "the explicit events of the committed work")
}

type ctxValueKey struct{}

// traceLog is a GORM logger that keeps, for each statement, its SQL and a value of its context.
type traceLog struct {
	logger.Interface
	mu      sync.Mutex
	entries []traceEntry
}

type traceEntry struct {
	sql   string
	value any
	err   error
}

func (l *traceLog) LogMode(logger.LogLevel) logger.Interface { return l }
func (l *traceLog) Trace(ctx context.Context, _ time.Time, fc func() (string, int64), err error) {
	sql, _ := fc()
	l.mu.Lock()
	l.entries = append(l.entries, traceEntry{sql: sql, value: ctx.Value(ctxValueKey{}), err: err})
	l.mu.Unlock()
}

// outboxInserts returns the traced INSERTs into the outbox table.
func (l *traceLog) outboxInserts() []traceEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []traceEntry
	for _, e := range l.entries {
		if strings.Contains(e.sql, "INSERT INTO") && strings.Contains(e.sql, "outbox_events") {
			out = append(out, e)
		}
	}
	return out
}

// A repository method with a per-call timeout (ctx, cancel := context.WithTimeout; defer cancel())
// whose transaction the service commits later: the statement's context has ended by the commit, and
// decides nothing about it. The events are written with the transaction's context and the values of
// the statement's, so a logger or tracer sees them as part of that request.
func TestPerCallContextsDoNotDecideTheCommit(t *testing.T) {
	create := func(tx *gorm.DB, name string) error {
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxValueKey{}, "req-"+name), time.Minute)
		defer cancel()
		return tx.WithContext(ctx).Create(&User{Name: name}).Error
	}
	emit := func(tx *gorm.DB, eventType string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return outboxplugin.Emit(tx.WithContext(ctx), eventType, map[string]string{"by": "repository"})
	}
	update := func(tx *gorm.DB, name string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return tx.WithContext(ctx).Model(&User{}).Where("name = ?", name).Update("age", 40).Error
	}
	shapes := []struct {
		name    string
		emitted []string
		app     func(t *testing.T, db *gorm.DB) error
	}{
		{"a service transaction of repository calls", []string{"Signed"}, func(t *testing.T, db *gorm.DB) error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := create(tx, "a"); err != nil {
					return err
				}
				if err := emit(tx, "Signed"); err != nil {
					return err
				}
				return create(tx, "b") // the last statement to hold events: its context has ended too
			})
		}},
		{"an Emit last", []string{"Signed"}, func(t *testing.T, db *gorm.DB) error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := create(tx, "a"); err != nil {
					return err
				}
				return emit(tx, "Signed")
			})
		}},
		{"an update by condition last", []string{"User_update"}, func(t *testing.T, db *gorm.DB) error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := create(tx, "a"); err != nil {
					return err
				}
				return update(tx, "a")
			})
		}},
		{"a nested transaction begun after such a statement", nil, func(t *testing.T, db *gorm.DB) error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := create(tx, "a"); err != nil {
					return err
				}
				return tx.Transaction(func(inner *gorm.DB) error { return create(inner, "b") })
			})
		}},
		{"CreateInBatches nesting after such a statement", nil, func(t *testing.T, db *gorm.DB) error {
			return db.Transaction(func(tx *gorm.DB) error {
				if err := create(tx, "a"); err != nil {
					return err
				}
				users := []User{{Name: "b"}, {Name: "c"}, {Name: "d"}}
				return tx.CreateInBatches(&users, 2).Error
			})
		}},
		{"Begin and Commit by hand", []string{"Signed"}, func(t *testing.T, db *gorm.DB) error {
			tx := db.WithContext(context.WithValue(context.Background(), ctxValueKey{}, "service")).Begin()
			if err := create(tx, "a"); err != nil {
				tx.Rollback()
				return err
			}
			if err := emit(tx, "Signed"); err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit().Error
		}},
		{"SkipDefaultTransaction", nil, func(t *testing.T, db *gorm.DB) error {
			return db.Session(&gorm.Session{SkipDefaultTransaction: true}).Transaction(func(tx *gorm.DB) error {
				if err := create(tx, "a"); err != nil {
					return err
				}
				return create(tx, "b")
			})
		}},
		{"a transaction whose own context ends before its commit", nil, func(t *testing.T, db *gorm.DB) error {
			// Without the plugin, database/sql rolls such a transaction back: the commit fails.
			ctx, cancel := context.WithCancel(context.Background())
			tx := db.WithContext(ctx).Begin()
			if err := tx.Create(&User{Name: "a"}).Error; err != nil {
				cancel()
				tx.Rollback()
				return err
			}
			cancel()
			return tx.Commit().Error
		}},
	}
	forEachDB(t, func(t *testing.T, d dialect) {
		for _, prepared := range []bool{false, true} {
			for _, s := range shapes {
				t.Run(fmt.Sprintf("%s/PrepareStmt=%v", s.name, prepared), func(t *testing.T) {
					without, with, db := twinRun(t, d, &gorm.Config{PrepareStmt: prepared}, s.app)
					assertSameOutcome(t, db, without, with, s.emitted...)
					if strings.HasPrefix(s.name, "a transaction whose own context") {
						assert.Error(t, with.err, "its commit fails, as without the plugin")
					} else {
						assert.NoError(t, with.err)
					}
				})
			}
		}

		t.Run("the statement's values reach the logger", func(t *testing.T) {
			log := &traceLog{}
			db := setup(t, d, &gorm.Config{Logger: log})
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
				if err := create(tx, "a"); err != nil {
					return err
				}
				return create(tx, "b")
			}))
			inserts := log.outboxInserts()
			require.Len(t, inserts, 1, "one outbox INSERT at commit")
			assert.NoError(t, inserts[0].err)
			assert.Equal(t, "req-b", inserts[0].value, "written with the values of the statement that held the last events")
		})
	})
}

// takenID is the key of a row each savepoint test creates first, so that a later create of the same
// key fails in the database with a duplicate key.
const takenID = 1_000_000

// A statement that fails in the database inside a savepoint, recovered from by rolling back to it:
// the outer transaction goes on and commits, as without the plugin, on every database (PostgreSQL
// refuses every statement after the failure until the rollback). The events of what the rollback
// undid are dropped, those of the rest committed.
func TestSavepointRecoversAFailedStatement(t *testing.T) {
	taken := func(tx *gorm.DB) error { return tx.Create(&User{ID: takenID, Name: "again"}).Error }
	shapes := []struct {
		name    string
		emitted []string
		app     func(t *testing.T, tx *gorm.DB) error
	}{
		{"a nested transaction returns the error", []string{"Signed"}, func(t *testing.T, tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "a"}).Error; err != nil {
				return err
			}
			err := tx.Transaction(func(inner *gorm.DB) error {
				if err := inner.Create(&User{Name: "b (undone)"}).Error; err != nil {
					return err
				}
				if err := outboxplugin.Emit(inner, "Undone", nil); err != nil {
					return err
				}
				return taken(inner)
			})
			if err == nil {
				return errors.New("the duplicate key was accepted")
			}
			if err := tx.Create(&User{Name: "c"}).Error; err != nil {
				return err
			}
			return outboxplugin.Emit(tx, "Signed", nil)
		}},
		{"SavePoint and RollbackTo by hand", nil, func(t *testing.T, tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "a"}).Error; err != nil {
				return err
			}
			if err := tx.SavePoint("before_b").Error; err != nil {
				return err
			}
			if err := tx.Create(&User{Name: "b (undone)"}).Error; err != nil {
				return err
			}
			if err := taken(tx); err == nil {
				return errors.New("the duplicate key was accepted")
			}
			if err := tx.RollbackTo("before_b").Error; err != nil {
				return err
			}
			return tx.Create(&User{Name: "c"}).Error
		}},
		{"CreateInBatches fails in its second batch", nil, func(t *testing.T, tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "a"}).Error; err != nil {
				return err
			}
			users := []User{{Name: "b1 (undone)"}, {Name: "b2 (undone)"}, {ID: takenID, Name: "b3 (undone)"}}
			if err := tx.CreateInBatches(&users, 2).Error; err == nil {
				return errors.New("the duplicate key was accepted")
			}
			return tx.Create(&User{Name: "c"}).Error
		}},
		{"a failed update by condition in a nested transaction", nil, func(t *testing.T, tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "a"}).Error; err != nil {
				return err
			}
			err := tx.Transaction(func(inner *gorm.DB) error {
				if err := inner.Create(&User{Name: "b (undone)"}).Error; err != nil {
					return err
				}
				// Every row's id moved onto the taken one: a duplicate key in the middle of an update
				// the plugin runs with RETURNING or as a locked read and a write.
				return inner.Model(&User{}).Where("name = ?", "b (undone)").Update("id", takenID).Error
			})
			if err == nil {
				return errors.New("the duplicate key was accepted")
			}
			return tx.Create(&User{Name: "c"}).Error
		}},
	}
	forEachDB(t, func(t *testing.T, d dialect) {
		for _, prepared := range []bool{false, true} {
			for _, s := range shapes {
				t.Run(fmt.Sprintf("%s/PrepareStmt=%v", s.name, prepared), func(t *testing.T) {
					app := func(t *testing.T, db *gorm.DB) error {
						if err := db.Create(&User{ID: takenID, Name: "taken"}).Error; err != nil {
							return err
						}
						return db.Transaction(func(tx *gorm.DB) error { return s.app(t, tx) })
					}
					without, with, db := twinRun(t, d, &gorm.Config{PrepareStmt: prepared}, app)
					require.NoError(t, without.err, "the database recovers without the plugin")
					assertSameOutcome(t, db, without, with, s.emitted...)
					assert.Equal(t, []string{"a", "c", "taken"}, sortedCopy(with.users))
				})
			}
		}
	})
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return out
}

// A ROLLBACK TO SAVEPOINT never writes the events held: an event the outbox would refuse, held inside
// a savepoint that is rolled back, is dropped without being written, and the outer transaction
// commits with the events of what it kept.
func TestRollbackToSavepointWritesNothing(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		db := setup(t, d, nil)
		refuseEventType(t, db, d, "Refused")
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&User{Name: "a"}).Error; err != nil {
				return err
			}
			require.Error(t, tx.Transaction(func(inner *gorm.DB) error {
				if err := inner.Create(&User{Name: "b (undone)"}).Error; err != nil {
					return err
				}
				if err := outboxplugin.Emit(inner, "Refused", nil); err != nil {
					return err
				}
				return errors.New("the application changes its mind")
			}))
			require.NoError(t, tx.SavePoint("sp").Error)
			require.NoError(t, outboxplugin.Emit(tx, "Refused", nil))
			require.NoError(t, tx.Exec("ROLLBACK TO SAVEPOINT sp").Error)
			return tx.Create(&User{Name: "c"}).Error
		}))
		assert.Equal(t, []string{"a", "c"}, userNames(t, db))
		assertOneEventPerUser(t, db)
	})
}

// refuseEventType makes the outbox table refuse events of one type: a trigger on SQLite, a check
// constraint elsewhere.
func refuseEventType(t *testing.T, db *gorm.DB, d dialect, eventType string) {
	t.Helper()
	plain := db.Session(&gorm.Session{NewDB: true})
	if d.name == "sqlite" {
		require.NoError(t, plain.Exec(`CREATE TRIGGER refuse_event BEFORE INSERT ON outbox_events
			WHEN NEW.event_type = '`+eventType+`' BEGIN SELECT RAISE(ABORT, 'event refused'); END`).Error)
		return
	}
	require.NoError(t, plain.Exec(`ALTER TABLE outbox_events ADD CONSTRAINT refuse_event CHECK (event_type <> '`+eventType+`')`).Error)
}

// txPath sends one transaction statement inside tx the way an application may.
type txPath struct {
	name string
	run  func(ctx context.Context, tx *gorm.DB, query string) error
}

var txPaths = []txPath{
	{"Exec", func(_ context.Context, tx *gorm.DB, q string) error { return tx.Exec(q).Error }},
	{"Raw.Row", func(_ context.Context, tx *gorm.DB, q string) error {
		return ignoreNoRows(tx.Raw(q).Row().Scan())
	}},
	{"Raw.Rows", func(_ context.Context, tx *gorm.DB, q string) error {
		rows, err := tx.Raw(q).Rows()
		if err != nil {
			return err
		}
		for rows.Next() {
		}
		return errors.Join(rows.Err(), rows.Close())
	}},
	{"Raw.Scan", func(_ context.Context, tx *gorm.DB, q string) error {
		var v struct{}
		return tx.Raw(q).Scan(&v).Error
	}},
	{"ConnPool.ExecContext", func(ctx context.Context, tx *gorm.DB, q string) error {
		_, err := tx.Statement.ConnPool.ExecContext(ctx, q)
		return err
	}},
	{"ConnPool.QueryContext", func(ctx context.Context, tx *gorm.DB, q string) error {
		rows, err := tx.Statement.ConnPool.QueryContext(ctx, q)
		if err != nil {
			return err
		}
		for rows.Next() {
		}
		return errors.Join(rows.Err(), rows.Close())
	}},
	{"ConnPool.QueryRowContext", func(ctx context.Context, tx *gorm.DB, q string) error {
		return ignoreNoRows(tx.Statement.ConnPool.QueryRowContext(ctx, q).Scan())
	}},
}

func ignoreNoRows(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	return err
}

// Transaction statements are seen on every path they reach the database through GORM, with comments
// before them and in any letter case: a row written before a savepoint keeps its event after a
// rollback to it, a row the rollback undid has none.
func TestTransactionStatementsSeenOnEveryPath(t *testing.T) {
	type spelling struct {
		name                         string
		savepoint, rollback, release string
		mysqlOnly                    bool
	}
	spellings := []spelling{
		{"upper case", "SAVEPOINT sp1", "ROLLBACK TO SAVEPOINT sp1", "RELEASE SAVEPOINT sp1", false},
		{"lower case", "savepoint sp1", "rollback to savepoint sp1", "release savepoint sp1", false},
		{"mixed case names", "SavePoint Sp1", "Rollback To SP1", "Release Savepoint sP1", false},
		{"block comments", "/* app */ SAVEPOINT sp1", "/* app: undo */\n  ROLLBACK TO SAVEPOINT sp1", "/**/RELEASE SAVEPOINT sp1", false},
		{"line comments", "-- app\nSAVEPOINT sp1", "-- app\n-- undo\nROLLBACK TO sp1", "-- app\nRELEASE SAVEPOINT sp1", false},
		{"hash comments", "# app\nSAVEPOINT sp1", "# app\nROLLBACK WORK TO SAVEPOINT sp1", "# app\nRELEASE SAVEPOINT sp1", true},
	}
	forEachDB(t, func(t *testing.T, d dialect) {
		for _, prepared := range []bool{false, true} {
			db := setup(t, d, &gorm.Config{PrepareStmt: prepared})
			ctx := context.Background()
			for _, path := range txPaths {
				for _, sp := range spellings {
					if sp.mysqlOnly && d.server() != "mysql" {
						continue
					}
					name := fmt.Sprintf("PrepareStmt=%v/%s/%s", prepared, path.name, sp.name)
					t.Run(name, func(t *testing.T) {
						var kept []uint
						var undone uint
						create := func(tx *gorm.DB, suffix string, keep bool) {
							u := User{Name: name + " " + suffix}
							require.NoError(t, tx.Create(&u).Error)
							if keep {
								kept = append(kept, u.ID)
							} else {
								undone = u.ID
							}
						}
						require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
							create(tx, "a", true)
							require.NoError(t, path.run(ctx, tx, sp.savepoint), "SAVEPOINT")
							create(tx, "b (undone)", false)
							require.NoError(t, outboxplugin.Emit(tx, "Undone", nil))
							require.NoError(t, path.run(ctx, tx, sp.rollback), "ROLLBACK TO")
							create(tx, "c", true)
							require.NoError(t, path.run(ctx, tx, sp.release), "RELEASE")
							create(tx, "d", true)
							return nil
						}))
						var ids []uint
						require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Model(&User{}).
							Where("name LIKE ?", name+" %").Order("id").Pluck("id", &ids).Error)
						assert.Equal(t, kept, ids, "the rows the rollback kept")
						events := map[string]int{}
						for _, e := range loadEvents(t, db) {
							events[e.EventType+" "+e.AggregateID]++
						}
						for _, id := range kept {
							assert.Equal(t, 1, events[fmt.Sprint("User_create ", id)], "one event of kept row %d", id)
						}
						if !slices.Contains(kept, undone) { // SQLite gives a rolled-back row's id again
							assert.Zero(t, events[fmt.Sprint("User_create ", undone)], "no event of the undone row")
						}
						assert.Zero(t, events["Undone "], "no event emitted inside the undone savepoint")
					})
				}
			}
			assertOneEventPerUser(t, db)
		}
	})
}

// SQL sent on the transaction's *sql.Tx (SQLTx), or on PostgreSQL with pgx its *sql.Conn (SQLConn),
// goes around GORM and the plugin. A savepoint set
// there and rolled back to through GORM while events are held cannot be matched with them: the
// commit fails with ErrUnknownSavepoint and nothing is committed. A savepoint set and rolled back to
// there both leaves the events held as they were: the event of the row it undid is still written,
// for a row that does not exist (docs/capture.md says so).
func TestSQLTxIsNotSeen(t *testing.T) {
	sqlTx := func(t *testing.T, d dialect, tx *gorm.DB) interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	} {
		t.Helper()
		conn, ok := tx.Statement.ConnPool.(interface {
			SQLTx() (*sql.Tx, bool)
			SQLConn() (*sql.Conn, bool)
		})
		require.True(t, ok, "the transaction has SQLTx and SQLConn: %T", tx.Statement.ConnPool)
		if c, ok := conn.SQLConn(); ok {
			_, isTx := conn.SQLTx()
			require.False(t, isTx, "a transaction on a held connection has no *sql.Tx")
			require.Equal(t, "postgres", d.name, "only PostgreSQL's transactions are on held connections")
			return c
		}
		s, ok := conn.SQLTx()
		require.True(t, ok)
		return s
	}
	forEachDB(t, func(t *testing.T, d dialect) {
		ctx := context.Background()
		t.Run("set on SQLTx, rolled back through GORM", func(t *testing.T) {
			db := setup(t, d, nil)
			err := db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Create(&User{Name: "a"}).Error)
				_, err := sqlTx(t, d, tx).ExecContext(ctx, "SAVEPOINT unseen")
				require.NoError(t, err)
				require.NoError(t, tx.Create(&User{Name: "b"}).Error)
				require.NoError(t, tx.Exec("ROLLBACK TO SAVEPOINT unseen").Error)
				return nil
			})
			require.ErrorIs(t, err, outboxplugin.ErrUnknownSavepoint)
			assert.Empty(t, userNames(t, db), "nothing committed")
			assert.Empty(t, loadEvents(t, db))
		})
		t.Run("set and rolled back on SQLTx", func(t *testing.T) {
			db := setup(t, d, nil)
			var undone uint
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Create(&User{Name: "a"}).Error)
				_, err := sqlTx(t, d, tx).ExecContext(ctx, "SAVEPOINT unseen")
				require.NoError(t, err)
				b := User{Name: "b"}
				require.NoError(t, tx.Create(&b).Error)
				undone = b.ID
				_, err = sqlTx(t, d, tx).ExecContext(ctx, "ROLLBACK TO SAVEPOINT unseen")
				return err
			}))
			assert.Equal(t, []string{"a"}, userNames(t, db))
			var aggregates []string
			for _, e := range loadEvents(t, db) {
				aggregates = append(aggregates, e.AggregateID)
			}
			assert.Contains(t, aggregates, fmt.Sprint(undone), "the undone row's event is written: the plugin did not see the rollback")
		})
	})
}

// On MySQL and MariaDB a deadlock rolls the whole transaction back, savepoints and all, even when it
// happens inside a nested transaction: nothing of it is committed, and the statements that follow
// would each commit on their own. None of the transaction's events is written — neither those held
// before the deadlock nor, through a later flush, any in what remains — later writes and Emits are
// refused, and the commit fails with ErrTransactionRolledBack.
func TestDeadlockRollsBackTheWholeTransaction(t *testing.T) {
	for _, d := range dialects {
		if d.server() != "mysql" {
			continue
		}
		for _, prepared := range []bool{false, true} {
			for _, nested := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/PrepareStmt=%v/nested=%v", d.name, prepared, nested), func(t *testing.T) {
					deadlockVictim(t, d, prepared, nested)
				})
			}
		}
	}
}

// deadlockVictim runs an application transaction into a deadlock with another that InnoDB keeps.
func deadlockVictim(t *testing.T, d dialect, prepared, nested bool) {
	db := setup(t, d, &gorm.Config{PrepareStmt: prepared})
	x, y := User{Name: "x"}, User{Name: "y"}
	require.NoError(t, db.Create(&x).Error)
	require.NoError(t, db.Create(&y).Error)
	filler := make([]Language, 200)
	for i := range filler {
		filler[i] = Language{Code: fmt.Sprintf("f%03d", i), Name: "filler"}
	}
	require.NoError(t, db.Create(&filler).Error)
	before := len(loadEvents(t, db))

	// The other transaction changes 201 rows, so that InnoDB picks the application's, which changes
	// two, as the deadlock's victim. The 200 are rows of another table, so that no lock of theirs
	// stands in the application's way.
	other := db.Begin()
	require.NoError(t, other.Model(&Language{}).Where("name = ?", "filler").Update("name", "filler, changed").Error)
	require.NoError(t, other.Model(&y).Update("age", 1).Error)

	holdsX := make(chan struct{})
	appDone := make(chan error, 1)
	var deadlockErr, afterErr, emitErr error
	go func() {
		tx := db.Begin()
		if err := tx.Create(&User{Name: "a (rolled back)"}).Error; err != nil {
			appDone <- err
			return
		}
		lockBoth := func(tx *gorm.DB) error {
			if err := outboxplugin.Emit(tx, "Held", nil); err != nil {
				return err
			}
			if err := tx.Model(&x).Update("age", 2).Error; err != nil {
				return err
			}
			close(holdsX)
			return tx.Model(&y).Update("age", 2).Error // waits for the other transaction
		}
		if nested {
			deadlockErr = tx.Transaction(lockBoth)
		} else {
			// The application handles the error and goes on: without the plugin the statements that
			// follow would each commit on their own.
			deadlockErr = lockBoth(tx)
			afterErr = tx.Create(&User{Name: "after the deadlock"}).Error
			emitErr = outboxplugin.Emit(tx, "After", nil)
		}
		appDone <- tx.Commit().Error
	}()
	select {
	case <-holdsX:
	case err := <-appDone:
		t.Fatalf("the application's transaction ended before locking x: %v", err)
	}
	otherErr := other.Model(&x).Update("age", 1).Error // closes the cycle
	commitErr := <-appDone
	require.NoError(t, otherErr, "the heavier transaction survives")
	require.NoError(t, other.Commit().Error)

	require.Error(t, deadlockErr)
	assert.Contains(t, deadlockErr.Error(), "Deadlock")
	assert.Equal(t, []string{"x", "y"}, userNames(t, db), "nothing of the rolled-back transaction")
	for _, e := range loadEvents(t, db)[before:] {
		assert.Contains(t, []string{"User_update", "Language_update"}, e.EventType, "only the other transaction's events: %s %s", e.EventType, e.AggregateID)
	}
	assertOneEventPerUserCreated(t, db)
	if !nested {
		assert.ErrorIs(t, afterErr, outboxplugin.ErrTransactionRolledBack, "a later write is refused: it would commit on its own")
		assert.ErrorIs(t, emitErr, outboxplugin.ErrTransactionRolledBack)
	}
	assert.ErrorIs(t, commitErr, outboxplugin.ErrTransactionRolledBack)
}

// assertOneEventPerUserCreated is assertOneEventPerUser for the creates alone, beside updates.
func assertOneEventPerUserCreated(t *testing.T, db *gorm.DB) {
	t.Helper()
	var ids []uint
	require.NoError(t, db.Session(&gorm.Session{NewDB: true}).Model(&User{}).Order("id").Pluck("id", &ids).Error)
	var want, got []string
	for _, id := range ids {
		want = append(want, fmt.Sprint("User_create ", id))
	}
	for _, e := range loadEvents(t, db) {
		if e.EventType == "User_create" {
			got = append(got, "User_create "+e.AggregateID)
		}
	}
	sort.Strings(want)
	sort.Strings(got)
	assert.Equal(t, want, got, "one create event per committed row, none for a row rolled back")
}

// appConnPool is a connection pool of the application's own, as GORM's TestConnPoolWrapper makes one:
// a gorm.ConnPool over a *sql.DB, beginning transactions of its own type, that gives GORM no way to
// reach the *sql.DB (no GetDBConn) unless exposeDB is set.
type appConnPool struct {
	db       *sql.DB
	exposeDB bool
}

func (p *appConnPool) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return p.db.PrepareContext(ctx, q)
}

func (p *appConnPool) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return p.db.ExecContext(ctx, q, args...)
}

func (p *appConnPool) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return p.db.QueryContext(ctx, q, args...)
}

func (p *appConnPool) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return p.db.QueryRowContext(ctx, q, args...)
}

func (p *appConnPool) Ping() error { return p.db.Ping() }

func (p *appConnPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := p.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &appTx{Tx: tx}, nil
}

// appDBPool is appConnPool with the *sql.DB exposed, as gorm.GetDBConnector.
type appDBPool struct{ appConnPool }

func (p *appDBPool) GetDBConn() (*sql.DB, error) { return p.db, nil }

// appTx is the transaction of appConnPool: a gorm.Tx that is not a *sql.Tx.
type appTx struct{ *sql.Tx }

// openOverPool opens the dialect's database through pool, a gorm.ConnPool of the application's own.
func openOverPool(t *testing.T, d dialect, pool gorm.ConnPool) *gorm.DB {
	t.Helper()
	var dialector gorm.Dialector
	switch d.name {
	case "sqlite":
		dialector = sqlite.New(sqlite.Config{Conn: pool})
	case "postgres":
		dialector = postgres.New(postgres.Config{Conn: pool})
	case "mysql":
		dialector = mysql.New(mysql.Config{Conn: pool})
	case "mysql_noreturning":
		dialector = mysql.New(mysql.Config{Conn: pool, DisableWithReturning: true})
	default:
		t.Fatalf("no dialector for %s", d.name)
	}
	db, err := gorm.Open(dialector, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	return db
}

// Capture works over any pool GORM accepts: a gorm.ConnPool of the application's own, with or without
// a *sql.DB behind it that GORM can reach. Only what needs a *sql.DB — db.DB(), and so the Worker and
// the Admin — needs one, with the plugin as without it; the wake-up NOTIFY goes through the pool.
func TestCustomConnPool(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		base := openDB(t, d, nil)
		resetTables(t, base, captureModels...)
		sqlDB, err := base.DB()
		require.NoError(t, err)

		for _, exposed := range []bool{false, true} {
			t.Run(fmt.Sprint("GetDBConn=", exposed), func(t *testing.T) {
				var pool gorm.ConnPool = &appConnPool{db: sqlDB}
				if exposed {
					pool = &appDBPool{appConnPool{db: sqlDB}}
				}
				db := openOverPool(t, d, pool)
				_, plainErr := db.DB()
				require.NoError(t, db.Use(outboxplugin.New()), "db.Use over a pool of the application's own")
				_, withErr := db.DB()
				assert.Equal(t, plainErr == nil, withErr == nil, "db.DB() answers as without the plugin: %v, %v", plainErr, withErr)
				if !exposed {
					assert.ErrorIs(t, withErr, gorm.ErrInvalidDB)
				}

				require.NoError(t, db.Exec("DELETE FROM outbox_events").Error)
				require.NoError(t, db.Exec("DELETE FROM users").Error)
				require.NoError(t, db.Create(&User{Name: "own transaction"}).Error)
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&User{Name: "in a transaction"}).Error; err != nil {
						return err
					}
					_, isAppTx := tx.Statement.ConnPool.(interface{ SQLTx() (*sql.Tx, bool) })
					assert.True(t, isAppTx, "the transaction is watched: %T", tx.Statement.ConnPool)
					return tx.Transaction(func(inner *gorm.DB) error { return inner.Create(&User{Name: "nested"}).Error })
				}))
				require.Error(t, db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&User{Name: "rolled back"}).Error; err != nil {
						return err
					}
					return errors.New("roll back")
				}))
				require.NoError(t, db.Session(&gorm.Session{SkipDefaultTransaction: true}).Create(&User{Name: "skip default"}).Error)
				assert.Equal(t, []string{"own transaction", "in a transaction", "nested", "skip default"}, userNames(t, db))
				assertOneEventPerUser(t, db)

				if d.name == "postgres" {
					assert.Eventually(t, func() bool { return outboxplugin.NotifiesSent(db) > 0 }, 30*time.Second, 10*time.Millisecond,
						"the wake-up NOTIFY goes through the pool")
				}

				pub := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error { return nil })
				w, err := outboxplugin.NewWorker(db, pub)
				if !exposed {
					require.Error(t, err, "the relay needs a *sql.DB")
					assert.Contains(t, err.Error(), "*sql.DB")
					return
				}
				require.NoError(t, err)
				n, err := w.ProcessOnce(context.Background())
				require.NoError(t, err)
				assert.Equal(t, 4, n, "the relay publishes what was captured over the pool")
			})
		}
	})
}

// With dbresolver's read/write splitting, registered before or after the plugin: a write outside a
// transaction runs on the resolver's source pool (a transaction the plugin did not begin, whose
// events are written right after each statement), a db.Transaction on the main pool; every committed
// row has its event either way, and reads go to the replica.
func TestDBResolverPools(t *testing.T) {
	forEachDB(t, func(t *testing.T, d dialect) {
		for _, c := range []struct {
			pluginFirst, ownSource bool
		}{{true, true}, {false, true}, {true, false}, {false, false}} {
			t.Run(fmt.Sprintf("plugin first=%v/source of its own=%v", c.pluginFirst, c.ownSource), func(t *testing.T) {
				pluginFirst := c.pluginFirst
				db := openDB(t, d, nil)
				resetTables(t, db, captureModels...)
				// The source and the replica are the same database here, opened again: what matters
				// is that the resolver switches statements to pools of its own. Without Sources the
				// resolver writes through the main pool, as it was when the resolver was registered.
				cfg := dbresolver.Config{Replicas: []gorm.Dialector{db.Dialector}}
				if c.ownSource {
					cfg.Sources = []gorm.Dialector{db.Dialector}
				}
				resolver := dbresolver.Register(cfg)
				if pluginFirst {
					require.NoError(t, db.Use(outboxplugin.New()))
					require.NoError(t, db.Use(resolver))
				} else {
					require.NoError(t, db.Use(resolver))
					require.NoError(t, db.Use(outboxplugin.New()))
				}
				u := User{Name: "outside"}
				require.NoError(t, db.Create(&u).Error)
				require.NoError(t, db.Model(&u).Update("age", 3).Error)
				require.NoError(t, db.Clauses(dbresolver.Write).Create(&User{Name: "on the source"}).Error)
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&User{Name: "in a transaction"}).Error; err != nil {
						return err
					}
					return tx.Transaction(func(inner *gorm.DB) error { return inner.Create(&User{Name: "nested"}).Error })
				}))
				require.Error(t, db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&User{Name: "rolled back"}).Error; err != nil {
						return err
					}
					return errors.New("roll back")
				}))
				var n int64
				require.NoError(t, db.Model(&User{}).Count(&n).Error, "a read through the replica")
				assert.EqualValues(t, 4, n)
				assert.Equal(t, []string{"outside", "on the source", "in a transaction", "nested"}, userNames(t, db))
				assertOneEventPerUser(t, db, "User_update")
			})
		}
	})
}
