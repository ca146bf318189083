package outboxplugin

import (
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm/schema"

	"github.com/gorm-outbox/outboxplugin/internal/partition"
	"github.com/gorm-outbox/outboxplugin/internal/sqlname"
)

// The outbox table's schema, written out once per database: AutoMigrate creates a new table with it
// and upgrades an existing one with its pieces (migrate.go), SchemaSQL prints it, and MigrationFiles
// renders it, step by step, as the files of golang-migrate and goose (migrations.go). The table GORM
// would make of OutboxEvent is the same, column for column (GORM's own db.AutoMigrate still works);
// writing the DDL here instead of asking GORM's migrator for it is what lets AutoMigrate run nothing
// on an up-to-date table: GORM's migrator compares the columns it finds with the ones it would
// create, and re-types every column where the comparison is wrong (five timestamptz(6) columns on
// PostgreSQL, whose length it reads as 64 bits against the precision 6; the json columns of MariaDB,
// which reads them back as longtext), under an exclusive lock, at every start.

// Dialect names, as GORM's dialectors name themselves (gorm.Dialector.Name()).
const (
	dialectPostgres = "postgres"
	dialectMySQL    = "mysql"
	dialectSQLite   = "sqlite"
)

// schemaColumn is a column of the outbox table: its definition on each database, and the schema
// version that added it (see schemaSteps).
type schemaColumn struct {
	name                 string
	postgres, mysql, sql string // sql: SQLite
	since                int
	// mysqlDefault is the column's default on MySQL and MariaDB from schema version
	// leaseDefaultsVersion on (the lease columns: leaseDefaults), a constant set on the column
	// without touching its rows.
	mysqlDefault string
}

// leaseDefaultsVersion is the schema version that gave the lease columns their defaults on MySQL and
// MariaDB.
const leaseDefaultsVersion = 9

// definition is the column's definition on dialect, after its name, as schema version version has
// it.
func (c schemaColumn) definition(dialect string, version int) string {
	switch dialect {
	case dialectPostgres:
		return c.postgres
	case dialectMySQL:
		if c.mysqlDefault != "" && version >= leaseDefaultsVersion {
			return c.mysql + " DEFAULT " + c.mysqlDefault
		}
		return c.mysql
	}
	return c.sql
}

// schemaColumns are OutboxEvent's columns in its field order, typed as GORM types them (precision 6
// times; json payloads, text on SQLite; attempt_history jsonb on PostgreSQL, see AttemptHistory).
// A column added after the first version must be nullable or have a constant default, so that adding
// it to a live table is a change of the catalog, not a rewrite of every row.
var schemaColumns = []schemaColumn{
	{"id", "bigserial", "bigint AUTO_INCREMENT", "integer PRIMARY KEY AUTOINCREMENT", 1, ""},
	{"message_id", "varchar(36) NOT NULL", "varchar(36) NOT NULL", "text NOT NULL", 1, ""},
	{"event_type", "varchar(255) NOT NULL", "varchar(255) NOT NULL", "text NOT NULL", 1, ""},
	{"aggregate_type", "varchar(255) NOT NULL DEFAULT ''", "varchar(255) NOT NULL DEFAULT ''", "text NOT NULL DEFAULT ''", 1, ""},
	{"aggregate_id", "varchar(255) NOT NULL DEFAULT ''", "varchar(255) NOT NULL DEFAULT ''", "text NOT NULL DEFAULT ''", 1, ""},
	{"payload", "json NOT NULL", "json NOT NULL", "text NOT NULL", 1, ""},
	{"headers", "json", "json", "text", 1, ""},
	{"created_at", "timestamptz(6) NOT NULL", "datetime(6) NOT NULL", "datetime NOT NULL", 1, ""},
	{"processed", "boolean NOT NULL DEFAULT false", "boolean NOT NULL DEFAULT false", "numeric NOT NULL DEFAULT false", 1, ""},
	{"processed_at", "timestamptz(6)", "datetime(6) NULL", "datetime", 1, ""},
	{"attempts", "bigint NOT NULL DEFAULT 0", "bigint NOT NULL DEFAULT 0", "integer NOT NULL DEFAULT 0", 1, ""},
	{"next_attempt_at", "timestamptz(6)", "datetime(6) NULL", "datetime", 1, ""},
	{"last_error", "text", "text", "text", 1, ""},
	{"dead_at", "timestamptz(6)", "datetime(6) NULL", "datetime", 1, ""},
	{"locked_by", "varchar(64)", "varchar(64)", "text", 1, "'" + NoLeaseOwner + "'"},
	{"locked_until", "timestamptz(6)", "datetime(6) NULL", "datetime", 1, "'" + noLeaseUntil + "'"},
	{"attempt_history", "jsonb", "json", "text", 6, ""},
}

// noLeaseUntil is locked_until of a row no relay has claimed since it was written, on MySQL and
// MariaDB: a time long past, the column's default there (see NoLeaseOwner).
const noLeaseUntil = "1970-01-01 00:00:00"

// leaseDefaults are the lease columns, whose defaults on MySQL and MariaDB (NoLeaseOwner and
// noLeaseUntil) give every new row values of the size a claim stamps.
var leaseDefaults = func() []schemaColumn {
	var out []schemaColumn
	for _, c := range schemaColumns {
		if c.mysqlDefault != "" {
			out = append(out, c)
		}
	}
	return out
}()

// schemaIndex is a secondary index of the outbox table.
type schemaIndex struct {
	// suffix names the index: idx_<table>_<suffix>.
	suffix  string
	columns string
	// where is the predicate of the partial index on PostgreSQL and SQLite; MySQL and MariaDB have
	// no partial indexes, and index every row.
	where string
	// partialOnly: only PostgreSQL and SQLite get the index. Without its predicate it would cost
	// every insert on MySQL and MariaDB (and, for the reference index, every mark of a published
	// event), for queries the claim index's leading columns serve there.
	partialOnly bool
	// naming says how the name is made; the worker and the Admin look the indexes up by these names.
	naming indexNaming
}

// indexNaming is how an index's name is made of the table name and the index's suffix.
type indexNaming int

const (
	// namedAsGORM: as GORM names the indexes OutboxEvent's tags declare, after the table without its
	// schema (idx_events_claim for audit.events), through the naming strategy.
	namedAsGORM indexNaming = iota
	// namedWithSchema: after the whole name, schema included, through the naming strategy
	// (idx_audit_events_dead).
	namedWithSchema
	// namedPlainly: idx_<table, dots as underscores>_<suffix>, never shortened (keyIndexName).
	namedPlainly
)

// The indexes. The reference index serves cleanup and the Admin's reads of processed rows on
// PostgreSQL and SQLite; on MySQL and MariaDB the claim index does, since processed rows have neither
// a dead nor a next attempt time there (Admin.processedGroup); the claim index finds the next batch (see
// OutboxEvent); the dead index serves the Admin's lists of dead events; the key index is per-key
// ordering's (WithKeyOrderingIndex). The pending index is the one earlier versions had instead of the
// claim index, and the reference index on MySQL and MariaDB one they made there: AutoMigrate drops
// both.
var (
	referenceIndex = schemaIndex{suffix: "processed_created_at", columns: "processed, created_at", where: "processed = true", partialOnly: true}
	// firstReferenceIndex is the reference index as the first version made it, on every database.
	firstReferenceIndex = schemaIndex{suffix: referenceIndex.suffix, columns: referenceIndex.columns, where: referenceIndex.where}
	claimIndex          = schemaIndex{suffix: "claim", columns: "processed, dead_at, next_attempt_at, created_at, id", where: "processed = false AND dead_at IS NULL"}
	deadIndex           = schemaIndex{suffix: "dead", columns: "dead_at, id", where: "dead_at IS NOT NULL", partialOnly: true, naming: namedWithSchema}
	keyIndex            = schemaIndex{suffix: "key_pending", columns: "aggregate_type, aggregate_id, id", where: "processed = false", naming: namedPlainly}
	pendingIndex        = schemaIndex{suffix: "pending", columns: "created_at, id", where: "processed = false"}
)

// applies reports whether the index exists on dialect.
func (ix schemaIndex) applies(dialect string) bool { return !ix.partialOnly || dialect != dialectMySQL }

// name is the index's name on table, as namer (GORM's naming strategy) makes it.
func (ix schemaIndex) name(namer schema.Namer, table string) string {
	switch ix.naming {
	case namedWithSchema:
		return namer.IndexName(table, ix.suffix)
	case namedPlainly:
		return "idx_" + strings.ReplaceAll(table, ".", "_") + "_" + ix.suffix
	}
	return namer.IndexName(unqualified(table), ix.suffix)
}

// unqualified is table without its schema.
func unqualified(table string) string {
	if i := strings.LastIndex(table, "."); i >= 0 {
		return table[i+1:]
	}
	return table
}

// ddl writes the outbox table's statements for one database and one table name. Table and index
// names are quoted (PostgreSQL folds unquoted names to lower case); column names are plain
// lower-case identifiers that need no quotes on any of the three.
type ddl struct {
	dialect string
	table   string // validated (sqlname.Valid), possibly schema-qualified
	namer   schema.Namer
	// partitions, when not zero, is the width of the partitions of a new table made partitioned
	// (WithPartitions), and now the time its first partition holds.
	partitions time.Duration
	now        time.Time
}

// partitioned is the table as internal/partition manages it.
func (d ddl) partitioned() partition.Table { return partition.NewTable(d.dialect, d.table) }

// quote quotes a validated, possibly schema-qualified name.
func (d ddl) quote(name string) string {
	if d.dialect == dialectPostgres {
		return sqlname.PG(name)
	}
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = "`" + p + "`"
	}
	return strings.Join(parts, ".")
}

// quotedTable is the table, quoted.
func (d ddl) quotedTable() string { return d.quote(d.table) }

// indexRef is how DROP INDEX names an index: qualified with the table's schema on PostgreSQL and
// SQLite, where an index lives in its table's schema.
func (d ddl) indexRef(ix schemaIndex) string {
	name := ix.name(d.namer, d.table)
	if i := strings.LastIndex(d.table, "."); i >= 0 && d.dialect != dialectMySQL {
		return d.quote(d.table[:i]) + "." + d.quote(name)
	}
	return d.quote(name)
}

// createTable creates the table with the columns of schema version up to (and the indexes of the
// table as it was then created), in one statement on MySQL and MariaDB, where the indexes are part of
// the CREATE TABLE, or followed by CREATE INDEX statements elsewhere (which a new table takes at no
// cost). ifNotExists makes it a no-op on a table that exists: AutoMigrate's, where two replicas may
// start at once; the migration files fail instead, as the tools expect.
func (d ddl) createTable(version int, indexes []schemaIndex, ifNotExists bool) []string {
	var b strings.Builder
	b.WriteString("CREATE TABLE ")
	if ifNotExists {
		b.WriteString("IF NOT EXISTS ")
	}
	b.WriteString(d.quotedTable() + " (\n")
	for _, c := range schemaColumns {
		if c.since <= version {
			b.WriteString("\t" + c.name + " " + c.definition(d.dialect, version) + ",\n")
		}
	}
	var after []string
	switch d.dialect {
	case dialectSQLite: // the key is in id's definition
		s := b.String()
		b.Reset()
		b.WriteString(strings.TrimSuffix(s, ",\n") + "\n")
	case dialectMySQL:
		b.WriteString("\tPRIMARY KEY (" + d.primaryKey() + ")")
		for _, ix := range indexes {
			if ix.applies(d.dialect) {
				b.WriteString(",\n\tINDEX " + d.quote(ix.name(d.namer, d.table)) + " (" + ix.columns + ")")
			}
		}
		b.WriteString("\n")
	default:
		b.WriteString("\tPRIMARY KEY (" + d.primaryKey() + ")\n")
	}
	b.WriteString(")")
	if d.partitions > 0 {
		b.WriteString(" " + d.partitioned().PartitionBy(d.now, d.partitions))
	}
	if d.dialect != dialectMySQL {
		for _, ix := range indexes {
			if ix.applies(d.dialect) {
				after = append(after, d.createIndex(ix, false, ifNotExists))
			}
		}
	}
	return append([]string{b.String()}, after...)
}

// primaryKey is the primary key's columns: a partitioned table's holds the column it is partitioned
// by, as PostgreSQL and MySQL require of every unique key; id alone stays unique, as its sequence (or
// AUTO_INCREMENT) gives it.
func (d ddl) primaryKey() string {
	if d.partitions > 0 {
		return "id, created_at"
	}
	return "id"
}

// createIndex creates ix. online: on a table in use, without holding up its writes
// (CONCURRENTLY on PostgreSQL, which cannot run in a transaction; an in-place build that takes no
// lock on MySQL and MariaDB; SQLite has no such thing). ifNotExists where the database has it, so
// that a statement run twice does nothing the second time.
func (d ddl) createIndex(ix schemaIndex, online, ifNotExists bool) string {
	name := d.quote(ix.name(d.namer, d.table))
	switch d.dialect {
	case dialectMySQL:
		if online {
			return "ALTER TABLE " + d.quotedTable() + " ADD INDEX " + name + " (" + ix.columns + "), ALGORITHM=INPLACE, LOCK=NONE"
		}
		return "CREATE INDEX " + name + " ON " + d.quotedTable() + " (" + ix.columns + ")"
	case dialectPostgres:
		s := "CREATE INDEX "
		if online {
			s += "CONCURRENTLY "
		}
		if ifNotExists || online {
			s += "IF NOT EXISTS "
		}
		return s + name + " ON " + d.quotedTable() + " (" + ix.columns + ") WHERE " + ix.where
	}
	s := "CREATE INDEX "
	if ifNotExists || online {
		s += "IF NOT EXISTS "
	}
	// SQLite puts an index in its table's schema by naming it there.
	ref, table := d.indexRef(ix), d.quote(unqualified(d.table))
	return s + ref + " ON " + table + " (" + ix.columns + ") WHERE " + ix.where
}

// dropIndex drops ix where it exists; online as for createIndex.
func (d ddl) dropIndex(ix schemaIndex, online bool) string {
	switch d.dialect {
	case dialectMySQL:
		s := "ALTER TABLE " + d.quotedTable() + " DROP INDEX " + d.quote(ix.name(d.namer, d.table))
		if online {
			s += ", ALGORITHM=INPLACE, LOCK=NONE"
		}
		return s
	case dialectPostgres:
		if online {
			return "DROP INDEX CONCURRENTLY IF EXISTS " + d.indexRef(ix)
		}
		return "DROP INDEX IF EXISTS " + d.indexRef(ix)
	}
	return "DROP INDEX IF EXISTS " + d.indexRef(ix)
}

// clearProcessedNextAttempt clears the next attempt time of the processed rows that have one (those
// an earlier version marked after a retry or a delay), as the mark does now (markProcessed).
func (d ddl) clearProcessedNextAttempt() string {
	return "UPDATE " + d.quotedTable() + " SET next_attempt_at = NULL WHERE processed = true AND dead_at IS NULL AND next_attempt_at IS NOT NULL"
}

// addColumn adds c to the table. Every column added after the first version is nullable or has a
// constant default: PostgreSQL records it in the catalog without touching the rows; MySQL 8 and
// MariaDB add it instantly (ALGORITHM=INSTANT fails rather than copy the table); SQLite never
// rewrites for it.
func (d ddl) addColumn(c schemaColumn) string {
	s := "ALTER TABLE " + d.quotedTable() + " ADD COLUMN "
	switch d.dialect {
	case dialectPostgres:
		return s + "IF NOT EXISTS " + c.name + " " + c.definition(d.dialect, c.since)
	case dialectMySQL:
		return s + c.name + " " + c.definition(d.dialect, c.since) + ", ALGORITHM=INSTANT"
	}
	return s + c.name + " " + c.definition(d.dialect, c.since)
}

// setLeaseDefaults gives the lease columns their defaults on MySQL and MariaDB (leaseDefaults), or,
// with unset, takes them away: a change of the catalog, which neither rewrites the rows nor holds up
// the table's writes (ALGORITHM=INSTANT fails rather than copy the table). Rows written before keep
// NULL, which the relay takes for no lease as it takes the defaults.
func (d ddl) setLeaseDefaults(unset bool) string {
	var parts []string
	for _, c := range leaseDefaults {
		value := c.mysqlDefault
		if unset {
			value = "NULL"
		}
		parts = append(parts, "ALTER COLUMN "+c.name+" SET DEFAULT "+value)
	}
	return "ALTER TABLE " + d.quotedTable() + " " + strings.Join(parts, ", ") + ", ALGORITHM=INSTANT"
}

// dropColumn drops c.
func (d ddl) dropColumn(c schemaColumn) string {
	return "ALTER TABLE " + d.quotedTable() + " DROP COLUMN " + c.name
}

// setStorage sets the storage options settings ("name = value") on a PostgreSQL table: a change of
// the catalog, under a lock that lets writes go on (SHARE UPDATE EXCLUSIVE).
func (d ddl) setStorage(settings []string) string {
	return "ALTER TABLE " + d.quotedTable() + " SET (" + strings.Join(settings, ", ") + ")"
}

// storageSettings are all of pgStorageOptions, as setStorage takes them.
func storageSettings() []string {
	out := make([]string, len(pgStorageOptions))
	for i, o := range pgStorageOptions {
		out[i] = o.name + " = " + o.value
	}
	return out
}

// resetStorage removes the storage settings of pgStorageOptions from a PostgreSQL table.
func (d ddl) resetStorage() string {
	names := make([]string, len(pgStorageOptions))
	for i, o := range pgStorageOptions {
		names[i] = o.name
	}
	return "ALTER TABLE " + d.quotedTable() + " RESET (" + strings.Join(names, ", ") + ")"
}

// currentIndexes are the secondary indexes of the current schema on dialect, in the order AutoMigrate
// creates them.
func currentIndexes(dialect string, keyOrdering bool) []schemaIndex {
	var out []schemaIndex
	if referenceIndex.applies(dialect) {
		out = append(out, referenceIndex)
	}
	out = append(out, claimIndex)
	if deadIndex.applies(dialect) {
		out = append(out, deadIndex)
	}
	if keyOrdering {
		out = append(out, keyIndex)
	}
	return out
}

// createCurrent is the whole current schema of a new table: the table, its indexes and, on
// PostgreSQL, its storage settings. Every statement is a no-op on a table that exists already, and
// none needs to run outside a transaction: the indexes of a table nobody uses yet are built plainly.
func (d ddl) createCurrent(keyOrdering bool) []string {
	indexes := currentIndexes(d.dialect, keyOrdering)
	var stmts []string
	if d.dialect == dialectMySQL {
		// The indexes in the CREATE TABLE: CREATE INDEX has no IF NOT EXISTS on MySQL 8.
		stmts = d.createTable(latestSchemaVersion, indexes, true)
	} else {
		stmts = d.createTable(latestSchemaVersion, nil, true)
	}
	if d.dialect == dialectPostgres && d.partitions == 0 {
		stmts = append(stmts, d.setStorage(storageSettings()))
	}
	if d.dialect != dialectMySQL {
		for _, ix := range indexes {
			stmts = append(stmts, d.createIndex(ix, false, true))
		}
	}
	if d.partitions > 0 {
		// PostgreSQL: after the indexes, which each partition then gets as it is made; with the
		// storage settings, which a partitioned table does not keep.
		stmts = append(stmts, d.partitioned().NewPartitions(d.now, d.partitions, storageSettings())...)
	}
	return stmts
}

// SchemaSQL returns the statements that create the outbox table named table (DefaultTableName when
// empty; schema-qualified names are accepted) as AutoMigrate creates it on an empty database, for the
// database dialect ("postgres", "mysql" or "sqlite", as GORM's dialectors name themselves; "mariadb"
// is taken for "mysql"): the table, its indexes and PostgreSQL's storage settings, and with
// WithKeyOrderingIndex the per-key ordering index. With WithPartitions, the table is partitioned,
// with its first partitions: those of the current interval and the next two, at the time SchemaSQL
// is called (run as a migration later, the relay's maintenance makes the ones missing by then;
// until it does, writes land in the default partition). The statements run in one transaction on
// PostgreSQL and SQLite; each is a no-op on a table that exists. To upgrade a table of an earlier
// version, see MigrationFiles. It reads no database.
func SchemaSQL(dialect, table string, opts ...MigrateOption) ([]string, error) {
	d, err := newDDL(dialect, table)
	if err != nil {
		return nil, err
	}
	cfg := newMigrateConfig(opts)
	if err := d.partitionWith(cfg); err != nil {
		return nil, err
	}
	return d.createCurrent(cfg.keyOrdering), nil
}

// newDDL checks dialect and table, for the functions that write the schema without a database.
// They name indexes as GORM's default naming strategy does, as AutoMigrate does under it.
func newDDL(dialect, table string) (ddl, error) {
	switch strings.ToLower(dialect) {
	case dialectPostgres, "postgresql", "pgx":
		dialect = dialectPostgres
	case dialectMySQL, "mariadb":
		dialect = dialectMySQL
	case dialectSQLite, "sqlite3":
		dialect = dialectSQLite
	default:
		return ddl{}, fmt.Errorf("outboxplugin: %w: unknown database %q (want postgres, mysql or sqlite)", ErrInvalidOption, dialect)
	}
	if table == "" {
		table = DefaultTableName
	}
	if !sqlname.Valid(table) {
		return ddl{}, fmt.Errorf("outboxplugin: %w: %q", ErrInvalidTableName, table)
	}
	return ddl{dialect: dialect, table: table, namer: schema.NamingStrategy{}}, nil
}
