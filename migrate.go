package outboxplugin

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin/internal/partition"
	"github.com/gorm-outbox/outboxplugin/internal/sqlname"
)

// MigrateOption configures AutoMigrate.
type MigrateOption func(*migrateConfig)

type migrateConfig struct {
	keyOrdering bool
	// partitions is WithPartitions's width, and partitioned whether it was given.
	partitions  time.Duration
	partitioned bool
	now         func() time.Time
}

func newMigrateConfig(opts []MigrateOption) migrateConfig {
	cfg := migrateConfig{now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return cfg
}

// WithPartitions makes AutoMigrate (and SchemaSQL) create a new outbox table partitioned by time, on
// PostgreSQL and MySQL/MariaDB: by range of created_at, in partitions every wide (a day when every
// is zero; a whole number of hours otherwise), aligned on midnight UTC, with a default partition that
// takes any write no partition covers. AutoMigrate makes the partitions of the current interval and
// the next two; the relay's maintenance makes the next ones as time passes, and its cleanup
// (WithCleanup, Worker.Cleanup, Admin.Cleanup) retires the old ones by dropping them whole instead of
// deleting their rows, never one that holds a pending or dead event. See docs/operations.md,
// "Partitioned outbox", for the trade-offs and the conversion of an existing table.
//
// On a table that exists and is partitioned, AutoMigrate makes the partitions it lacks now (of the
// width of its newest one, whatever every says). On a table that exists and is not, it fails with
// ErrNotPartitioned: converting a table is not something to do at a start. SQLite has no partitions:
// the option is refused there.
func WithPartitions(every time.Duration) MigrateOption {
	return func(c *migrateConfig) {
		if every == 0 {
			every = partition.DefaultEvery
		}
		c.partitions, c.partitioned = every, true
	}
}

// partitionWith checks cfg's partitions for d's database and gives them to d.
func (d *ddl) partitionWith(cfg migrateConfig) error {
	if !cfg.partitioned {
		return nil
	}
	if d.dialect == dialectSQLite {
		return fmt.Errorf("outboxplugin: %w: WithPartitions: SQLite has no partitions", ErrInvalidOption)
	}
	if err := partition.CheckEvery(cfg.partitions); err != nil {
		return fmt.Errorf("outboxplugin: %w: WithPartitions: %v", ErrInvalidOption, err)
	}
	if err := d.partitioned().Check(); err != nil {
		return fmt.Errorf("outboxplugin: %w: WithPartitions: %v", ErrInvalidTableName, err)
	}
	d.partitions, d.now = cfg.partitions, cfg.now()
	return nil
}

// WithKeyOrderingIndex makes AutoMigrate also create the index that a worker with WithKeyOrdering
// probes: (aggregate_type, aggregate_id, id) over unprocessed rows (over every row on MySQL and
// MariaDB, which have no partial indexes). Without key ordering the index costs every insert and buys
// nothing, so it is not created by default; a worker with WithKeyOrdering refuses to run without it.
func WithKeyOrderingIndex() MigrateOption {
	return func(c *migrateConfig) { c.keyOrdering = true }
}

// AutoMigrate creates or updates the outbox table that db's plugin writes to (DefaultTableName when
// the plugin is not registered or was not given WithTableName; the table of db.Table(name) when it is
// given), with its indexes, and on PostgreSQL gives it the storage settings the relay wants (see
// pgStorageOptions). It is everything the relay needs: the worker runs no DDL, and refuses to run on
// a table without the claim index (see OutboxEvent).
//
// A new table is created with the statements SchemaSQL returns (in one transaction on PostgreSQL and
// SQLite). On an existing table AutoMigrate reads the catalog and adds only what is missing, never
// re-typing a column: the columns of later versions (nullable or with a constant default, so that
// adding one is a change of the catalog), the claim index, the reference index, on PostgreSQL and
// SQLite the dead index (dead_at, id) WHERE dead_at IS NOT NULL that the Admin reads, with
// WithKeyOrderingIndex the per-key ordering index, on MySQL and MariaDB the lease columns' defaults
// (NoLeaseOwner; a change of the catalog), and the storage settings the table has no value for (a
// value of yours is kept). It drops the pending index (created_at, id) of earlier versions,
// which the claim index replaces. Indexes are built without holding up the table's writes:
// CONCURRENTLY on PostgreSQL (where an INVALID index a failed build left behind is replaced), in
// place without a lock on MySQL and MariaDB. On an up-to-date table it runs no DDL at all, so calling
// it at every start costs a few catalog queries. A PostgreSQL table whose payload and headers are
// jsonb, as earlier versions made them, keeps them (docs/capture.md). PlanMigration returns the
// statements it would run. A table name that WithTableName would refuse is refused with
// ErrInvalidTableName, before anything is run.
func AutoMigrate(db *gorm.DB, opts ...MigrateOption) error {
	db, table, plan, err := planMigration(db, opts)
	if err != nil {
		return err
	}
	if plan.create && db.Dialector.Name() != dialectMySQL {
		// All or nothing: a table without its claim index would be refused by the relay.
		err = db.Transaction(func(tx *gorm.DB) error {
			for _, s := range plan.statements {
				if err := tx.Exec(s).Error; err != nil {
					return err
				}
			}
			return nil
		})
	} else {
		for _, s := range plan.statements {
			if err = db.Exec(s).Error; err != nil {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("outboxplugin: migrate %s: %w", table, err)
	}
	return nil
}

// PlanMigration returns the statements AutoMigrate(db, opts...) would run now, in order, without
// running any: reading the catalog is all it does. It returns none for an up-to-date table.
func PlanMigration(db *gorm.DB, opts ...MigrateOption) ([]string, error) {
	_, _, plan, err := planMigration(db, opts)
	return plan.statements, err
}

// migrationPlan is what AutoMigrate runs: the whole schema of a new table, or what an existing one
// lacks.
type migrationPlan struct {
	create     bool // the table is new: statements that may run in one transaction
	statements []string
}

// planMigration finds the table AutoMigrate(db, opts...) migrates, and what it would run on it. It
// returns db as a new session, for running the plan.
func planMigration(db *gorm.DB, opts []MigrateOption) (*gorm.DB, string, migrationPlan, error) {
	cfg := newMigrateConfig(opts)
	table := DefaultTableName
	if p := pluginOf(db); p != nil {
		table = p.cfg.table
	}
	if db.Statement != nil && db.Statement.TableExpr != nil {
		named, err := tableOfStatement(db)
		if err != nil {
			return nil, "", migrationPlan{}, err
		}
		table = named // AutoMigrate(db.Table("events")), AutoMigrate(db.Table("audit.events"))
	}
	db = db.Session(&gorm.Session{NewDB: true})
	d := ddl{dialect: db.Dialector.Name(), table: table, namer: db.NamingStrategy}
	if d.dialect != dialectPostgres && d.dialect != dialectMySQL {
		d.dialect = dialectSQLite
	}
	if err := d.partitionWith(cfg); err != nil {
		return nil, "", migrationPlan{}, err
	}
	plan, err := d.plan(db, cfg)
	if err != nil {
		return nil, "", migrationPlan{}, fmt.Errorf("outboxplugin: migrate %s: %w", table, err)
	}
	return db, table, plan, nil
}

// plan reads the catalog of d's table and returns what AutoMigrate runs on it.
func (d ddl) plan(db *gorm.DB, cfg migrateConfig) (migrationPlan, error) {
	if !db.Migrator().HasTable(d.table) {
		return migrationPlan{create: true, statements: d.createCurrent(cfg.keyOrdering)}, nil
	}
	var plan migrationPlan
	var layout partition.Layout
	if d.dialect != dialectSQLite {
		var err error
		if layout, err = d.partitioned().Read(db.Statement.Context, db.Statement.ConnPool); err != nil {
			return plan, fmt.Errorf("read the partitions: %w", err)
		}
	}
	if cfg.partitioned && !layout.Partitioned {
		return plan, fmt.Errorf("%w: see docs/operations.md, \"Partitioned outbox\", for its conversion", ErrNotPartitioned)
	}
	// A partitioned table's indexes are built plainly: PostgreSQL builds no index of a partitioned
	// table CONCURRENTLY (the build holds up the table's writes; AutoMigrate made them with the table,
	// so only an index a later option asks for is built so).
	online := !layout.Partitioned
	columns, err := tableColumns(db, d.dialect, d.table)
	if err != nil {
		return plan, err
	}
	for _, c := range schemaColumns {
		if !columns[c.name] {
			plan.statements = append(plan.statements, d.addColumn(c))
		}
	}
	for _, ix := range currentIndexes(d.dialect, cfg.keyOrdering) {
		name := ix.name(d.namer, d.table)
		exists, valid, err := indexState(db, d.table, name)
		if err != nil {
			return plan, fmt.Errorf("look up index %s: %w", name, err)
		}
		if exists && !valid {
			// What a failed CREATE INDEX CONCURRENTLY left behind: IF NOT EXISTS would keep it.
			plan.statements = append(plan.statements, d.dropIndex(ix, online))
		}
		if !exists || !valid {
			plan.statements = append(plan.statements, d.createIndex(ix, online, true))
		}
		if ix.suffix == claimIndex.suffix {
			// The pending index of earlier versions: the claim index does its work, and every insert
			// paid for it. Dropped once the claim index is there.
			name := pendingIndex.name(d.namer, d.table)
			if exists, _, err := indexState(db, d.table, name); err != nil {
				return plan, fmt.Errorf("look up index %s: %w", name, err)
			} else if exists {
				plan.statements = append(plan.statements, d.dropIndex(pendingIndex, online))
			}
		}
	}
	if !referenceIndex.applies(d.dialect) {
		// MySQL and MariaDB: the full reference index of earlier versions, which every insert and
		// every mark paid for. The claim index serves its readers once the processed rows earlier
		// versions marked have no next attempt time (Admin.processedGroup).
		name := referenceIndex.name(d.namer, d.table)
		if exists, _, err := indexState(db, d.table, name); err != nil {
			return plan, fmt.Errorf("look up index %s: %w", name, err)
		} else if exists {
			plan.statements = append(plan.statements, d.clearProcessedNextAttempt(), d.dropIndex(firstReferenceIndex, true))
		}
	}
	if d.dialect == dialectMySQL {
		set, err := hasLeaseDefaults(db, d.table)
		if err != nil {
			return plan, err
		}
		if !set {
			plan.statements = append(plan.statements, d.setLeaseDefaults(false))
		}
	}
	if layout.Partitioned {
		// PostgreSQL keeps no storage settings on a partitioned table: each partition has its own,
		// given as it is made. The partitions of now and the next intervals, when the option asks.
		if cfg.partitioned {
			steps, _, err := d.partitioned().Plan(db.Statement.Context, db.Statement.ConnPool, layout, d.now)
			if err != nil {
				return plan, fmt.Errorf("plan the partitions: %w", err)
			}
			for _, st := range steps {
				plan.statements = append(plan.statements, st.SQL...)
			}
		}
		return plan, nil
	}
	missing, err := missingStorageOptions(db, d.table)
	if err != nil {
		return plan, err
	}
	if len(missing) > 0 {
		plan.statements = append(plan.statements, d.setStorage(missing))
	}
	return plan, nil
}

// hasLeaseDefaults reports whether the lease columns of table, on MySQL or MariaDB, have the defaults
// of leaseDefaults. MariaDB quotes a default in information_schema and MySQL does not; both write a
// time with its fraction.
func hasLeaseDefaults(db *gorm.DB, table string) (bool, error) {
	schemaName, name := "", table
	if i := strings.LastIndex(table, "."); i >= 0 {
		schemaName, name = table[:i], table[i+1:]
	}
	var cols []struct {
		Name    string
		Default *string
	}
	if err := db.Raw(`SELECT column_name AS name, column_default AS `+"`default`"+` FROM information_schema.columns`+
		` WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? AND column_name IN ('locked_by', 'locked_until')`,
		schemaName, name).Scan(&cols).Error; err != nil {
		return false, fmt.Errorf("read the lease columns' defaults: %w", err)
	}
	found := 0
	for _, c := range cols {
		if c.Default == nil {
			return false, nil
		}
		v := *c.Default
		if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = v[1 : len(v)-1]
		}
		switch strings.ToLower(c.Name) {
		case "locked_by":
			if v != NoLeaseOwner {
				return false, nil
			}
		case "locked_until":
			if !strings.HasPrefix(v, noLeaseUntil) {
				return false, nil
			}
		}
		found++
	}
	return found == len(leaseDefaults), nil
}

// tableColumns returns the names of the columns table has.
func tableColumns(db *gorm.DB, dialect, table string) (map[string]bool, error) {
	var names []string
	var err error
	switch dialect {
	case dialectPostgres:
		err = db.Raw(`SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(?) AND attnum > 0 AND NOT attisdropped`,
			sqlname.PG(table)).Scan(&names).Error
	case dialectMySQL:
		schemaName, name := "", table
		if i := strings.LastIndex(table, "."); i >= 0 {
			schemaName, name = table[:i], table[i+1:]
		}
		err = db.Raw(`SELECT column_name FROM information_schema.columns WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?`,
			schemaName, name).Scan(&names).Error
	default:
		if i := strings.LastIndex(table, "."); i >= 0 {
			err = db.Raw(`SELECT name FROM pragma_table_info(?, ?)`, table[i+1:], table[:i]).Scan(&names).Error
		} else {
			err = db.Raw(`SELECT name FROM pragma_table_info(?)`, table).Scan(&names).Error
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read the columns: %w", err)
	}
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[strings.ToLower(n)] = true
	}
	return out, nil
}

// tableOfStatement is the table db.Table(name) named, schema included: GORM keeps only the part after
// the dot in Statement.Table, and the whole name, quoted, in Statement.TableExpr. A name that
// WithTableName would refuse (an expression, an alias, a quote inside) is refused with
// ErrInvalidTableName: it would be written into the index statements as it is.
func tableOfStatement(db *gorm.DB) (string, error) {
	expr := db.Statement.TableExpr
	name := strings.NewReplacer(`"`, "", "`", "").Replace(expr.SQL)
	if len(expr.Vars) > 0 || !sqlname.Valid(name) || (&gorm.Statement{DB: db}).Quote(name) != expr.SQL {
		return "", fmt.Errorf("outboxplugin: migrate %q: %w", expr.SQL, ErrInvalidTableName)
	}
	return name, nil
}

// keyIndexName is the name of the per-key ordering index of table.
func keyIndexName(table string) string {
	return keyIndex.name(nil, table)
}

// gormIndexName is the name GORM gives OutboxEvent's index named in its tags on table. GORM names an
// index after the table without its schema: db.Table("audit.events") keeps "events" in
// Statement.Table, and the claim index of audit.events is idx_events_claim (in schema audit).
func gormIndexName(db *gorm.DB, table, index string) string {
	return db.NamingStrategy.IndexName(unqualified(table), index)
}

// claimIndexName is the name GORM gives table's claim index (OutboxEvent's "claim" composite).
func claimIndexName(db *gorm.DB, table string) string {
	return claimIndex.name(db.NamingStrategy, table)
}

// deadIndexName is the name of the dead index AutoMigrate creates on PostgreSQL and SQLite.
func deadIndexName(db *gorm.DB, table string) string {
	return deadIndex.name(db.NamingStrategy, table)
}

// indexState reports whether table has the index name, and whether it is valid (only PostgreSQL
// has invalid indexes: what a failed CREATE INDEX CONCURRENTLY leaves behind).
func indexState(db *gorm.DB, table, name string) (exists, valid bool, err error) {
	switch db.Dialector.Name() {
	case "postgres":
		var found []bool
		err = db.Raw(`SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(?)`, pgIndexRef(table, name)).Scan(&found).Error
		if err != nil || len(found) == 0 {
			return false, false, err
		}
		return true, found[0], nil
	case "mysql":
		var n int64
		err = db.Raw(`SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE()`+
			` AND table_name = ? AND index_name = ?`, table, name).Scan(&n).Error
		return n > 0, n > 0, err
	default:
		var n int64
		err = db.Raw(`SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = ?`, name).Scan(&n).Error
		return n > 0, n > 0, err
	}
}

// pgIndexRef is index name of table, quoted and qualified with the table's schema when it has one.
func pgIndexRef(table, name string) string {
	qualified := sqlname.PGIdent(name)
	if i := strings.LastIndex(table, "."); i >= 0 {
		qualified = sqlname.PG(table[:i]) + "." + qualified
	}
	return qualified
}

// errMissingIndex: the worker found an index it needs missing or invalid.
var errMissingIndex = errors.New("the outbox table lacks an index the relay needs")
