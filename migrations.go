package outboxplugin

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"time"
)

// The outbox table's history as migration files, for the teams that manage their schema with a tool
// rather than with AutoMigrate. Each version of the schema is one step; a fresh database takes them
// all, a table of an earlier version the ones after its own. The steps make what AutoMigrate makes
// (the migrations/tooltest module applies them with the real tools and compares the catalogs), but
// on PostgreSQL a table created before json replaced jsonb keeps its jsonb payload and headers, as
// under AutoMigrate. The files of DefaultTableName are in the repository's migrations folder; that
// they are what MigrationFiles renders is a test of this package.

// latestSchemaVersion is the version of the schema AutoMigrate makes: the last of schemaSteps.
const latestSchemaVersion = leaseDefaultsVersion

// schemaStep is one version of the schema: the statements that make it from the version before, per
// database, and the ones that undo them. A step that changes nothing on a database has no statements
// there, and its files hold a statement that does nothing, as a tool needs one.
type schemaStep struct {
	version int
	name    string
	// about says what the step does and why, for the header of its files.
	about []string
	// online: on PostgreSQL the statements cannot run in a transaction (CONCURRENTLY), and each such
	// step has exactly one, so that golang-migrate, which sends a file as one query, can run it.
	online   bool
	up, down func(d ddl) []string
}

// schemaSteps are the versions of the outbox table, oldest first.
var schemaSteps = []schemaStep{
	{
		version: 1, name: "create_table",
		about: []string{
			"The outbox table as the first version of the plugin created it: the reference design's",
			"columns, the relay's bookkeeping, the reference index for cleanup and the pending index that",
			"later versions replace with the claim index. (On PostgreSQL the first versions typed payload and",
			"headers jsonb; a table made then keeps them: the plugin reads and writes both.)",
		},
		up: func(d ddl) []string { return d.createTable(1, []schemaIndex{firstReferenceIndex, pendingIndex}, false) },
		down: func(d ddl) []string {
			return []string{"DROP TABLE " + d.quotedTable()}
		},
	},
	{
		version: 2, name: "storage_settings",
		about: []string{
			"PostgreSQL's storage settings for the relay's claims (fillfactor for in-place updates,",
			"autovacuum at a fixed number of dead rows): a change of the catalog, which writes do not wait",
			"for. It overwrites a value you set yourself; AutoMigrate keeps yours.",
		},
		up: func(d ddl) []string {
			if d.dialect != dialectPostgres {
				return nil
			}
			return []string{d.setStorage(storageSettings())}
		},
		down: func(d ddl) []string {
			if d.dialect != dialectPostgres {
				return nil
			}
			return []string{d.resetStorage()}
		},
	},
	{
		version: 3, name: "claim_index", online: true,
		about: []string{
			"The claim index, from which the relay takes each batch; the relay refuses a table without it.",
			"Built without holding up writes: CONCURRENTLY on PostgreSQL, in place without a lock on MySQL",
			"and MariaDB. On PostgreSQL a build that fails leaves an INVALID index of that name, which IF NOT",
			"EXISTS would keep: drop it (DROP INDEX CONCURRENTLY) before running this step again.",
		},
		up:   func(d ddl) []string { return []string{d.createIndex(claimIndex, true, true)} },
		down: func(d ddl) []string { return []string{d.dropIndex(claimIndex, true)} },
	},
	{
		version: 4, name: "drop_pending_index", online: true,
		about: []string{
			"Drops the pending index (created_at, id), whose work the claim index does: every insert paid",
			"for it.",
		},
		up:   func(d ddl) []string { return []string{d.dropIndex(pendingIndex, true)} },
		down: func(d ddl) []string { return []string{d.createIndex(pendingIndex, true, true)} },
	},
	{
		version: 5, name: "dead_index", online: true,
		about: []string{
			"The dead index, partial, for the Admin's counts and lists of dead events (PostgreSQL and",
			"SQLite: MySQL and MariaDB, without partial indexes, use the claim index's leading columns).",
		},
		up: func(d ddl) []string {
			if !deadIndex.applies(d.dialect) {
				return nil
			}
			return []string{d.createIndex(deadIndex, true, true)}
		},
		down: func(d ddl) []string {
			if !deadIndex.applies(d.dialect) {
				return nil
			}
			return []string{d.dropIndex(deadIndex, true)}
		},
	},
	{
		version: 6, name: "attempt_history",
		about: []string{
			"attempt_history, each event's last failed attempts: nullable without a default, so that adding",
			"it is a change of the catalog, not a rewrite of the rows. A worker keeping a history",
			"(the default) refuses a table without it.",
		},
		up:   func(d ddl) []string { return []string{d.addColumn(schemaColumns[len(schemaColumns)-1])} },
		down: func(d ddl) []string { return []string{d.dropColumn(schemaColumns[len(schemaColumns)-1])} },
	},
	{
		version: 7, name: "processed_next_attempt",
		about: []string{
			"MySQL and MariaDB: clears the next attempt time of processed rows (a retry or a delay that",
			"earlier versions left on the rows they marked), as the mark does now, so that the processed",
			"rows are one run of the claim index in creation order. Run it after the relays are upgraded:",
			"a relay of an earlier version marks rows the Admin's lists of processed events then miss",
			"(cleanup still deletes them). It has nothing to undo.",
		},
		up: func(d ddl) []string {
			if referenceIndex.applies(d.dialect) {
				return nil
			}
			return []string{d.clearProcessedNextAttempt()}
		},
		down: func(ddl) []string { return nil },
	},
	{
		version: 8, name: "drop_mysql_reference_index",
		about: []string{
			"MySQL and MariaDB: drops the reference index (processed, created_at), which covered every row",
			"there (no partial indexes): every insert and every mark of a published event paid for it. The",
			"claim index serves cleanup and the Admin's reads of processed rows instead. PostgreSQL and",
			"SQLite keep theirs, partial (processed rows only).",
		},
		up: func(d ddl) []string {
			if referenceIndex.applies(d.dialect) {
				return nil
			}
			return []string{d.dropIndex(firstReferenceIndex, true)}
		},
		down: func(d ddl) []string {
			if referenceIndex.applies(d.dialect) {
				return nil
			}
			return []string{d.createIndex(firstReferenceIndex, true, true)}
		},
	},
	{
		version: leaseDefaultsVersion, name: "mysql_lease_defaults",
		about: []string{
			"MySQL and MariaDB: gives the lease columns defaults (locked_by 32 spaces, locked_until",
			"1970-01-01), so that a new row holds values of the size a claim stamps and InnoDB updates it",
			"in place: from NULL, every claim made its rows longer, and a relay spent about half its time",
			"making room for them. A change of the catalog (ALGORITHM=INSTANT); rows written before keep",
			"NULL, which the relay reads as it reads the defaults: no lease. Run it after the relays are",
			"upgraded: a relay of an earlier version reads the placeholder as a lease's owner, and would",
			"publish every new event alone as a delivery that did not finish, with a false history entry.",
		},
		up: func(d ddl) []string {
			if d.dialect != dialectMySQL {
				return nil
			}
			return []string{d.setLeaseDefaults(false)}
		},
		down: func(d ddl) []string {
			if d.dialect != dialectMySQL {
				return nil
			}
			return []string{d.setLeaseDefaults(true)}
		},
	},
}

// noop is a statement that does nothing, for a step that changes nothing on the database: a tool
// needs a statement to run (MySQL answers an empty query with an error).
func (d ddl) noop() string {
	if d.dialect == dialectMySQL {
		return "DO 0"
	}
	return "SELECT 1"
}

// MigrationFormat is the layout of a migration tool's files.
type MigrationFormat string

const (
	// GolangMigrate is golang-migrate's layout: NNNNNN_name.up.sql and NNNNNN_name.down.sql per
	// version. golang-migrate sends a file as one query, so a statement that cannot run in a
	// transaction (PostgreSQL's CREATE INDEX CONCURRENTLY) is alone in its file; the other files of
	// PostgreSQL run as one implicit transaction. Every MySQL file is one statement, so that no
	// multiStatements DSN parameter is needed.
	GolangMigrate MigrationFormat = "golang-migrate"
	// Goose is goose's layout: NNNNN_name.sql per version, with -- +goose Up and -- +goose Down
	// sections; the files whose statements cannot run in a transaction are marked
	// -- +goose NO TRANSACTION.
	Goose MigrationFormat = "goose"
)

// MigrationFiles returns the migration files of the outbox table named table (DefaultTableName when
// empty; a schema-qualified name is accepted, and its schema must exist) for the database dialect
// ("postgres", "mysql" or "sqlite"; "mariadb" is taken for "mysql") in the layout of format, as a
// flat file system that golang-migrate (source/iofs) and goose (its provider's or SetBaseFS's file
// system) read as it is. There is one version per version of the schema, the first creating the
// table as the first version of the plugin did: a new database applies them all and ends with the
// table AutoMigrate makes; a table of an earlier version made by AutoMigrate takes the versions after
// its own (tell the tool which version the table is at first: golang-migrate's force, goose's
// version table; `outbox migrate --dry-run` on the database prints the steps it lacks). Every file
// has its down migration. The per-key ordering index (WithKeyOrderingIndex) is not among them:
// SchemaSQL with that option prints its statement, to add as a migration of your own; the option is
// refused here. It reads no database; the repository's migrations folder holds the files of
// DefaultTableName.
//
// With WithPartitions (PostgreSQL, MySQL/MariaDB) the files are those of a new partitioned table
// instead: a single version, numbered as the current schema (the versions of later releases follow
// it, as they follow the plain table's), named create_partitioned_table, that creates the table as
// AutoMigrate with the option does, with what SchemaSQL with the option returns: the partitions of
// the interval that holds the time MigrationFiles is called and of the next two, and the default
// partition. Applied later, the relay's maintenance makes the partitions missing by then (at its
// start, and every ten minutes); until it does, writes land in the default partition. Its down
// migration drops the table. WithKeyOrderingIndex is taken with it: the index is created with the
// table. An existing table is converted by hand, not by a migration: docs/operations.md, "Partitioned
// outbox".
func MigrationFiles(format MigrationFormat, dialect, table string, opts ...MigrateOption) (fs.FS, error) {
	d, err := newDDL(dialect, table)
	if err != nil {
		return nil, err
	}
	cfg := newMigrateConfig(opts)
	if err := d.partitionWith(cfg); err != nil {
		return nil, err
	}
	steps := schemaSteps
	switch {
	case cfg.partitioned:
		steps = []schemaStep{partitionedStep(cfg.keyOrdering)}
	case cfg.keyOrdering:
		return nil, fmt.Errorf("outboxplugin: %w: WithKeyOrderingIndex: the migration files of the plain table leave the per-key ordering index out; "+
			"SchemaSQL with the option returns its statement, to add as a migration of your own", ErrInvalidOption)
	}
	files := memFS{}
	for _, st := range steps {
		up, down := st.up(d), st.down(d)
		header := st.header(d)
		switch format {
		case GolangMigrate:
			base := fmt.Sprintf("%06d_%s", st.version, st.name)
			files[base+".up.sql"] = []byte(header + d.script(up))
			files[base+".down.sql"] = []byte(header + d.script(down))
		case Goose:
			var b strings.Builder
			if st.online && d.dialect == dialectPostgres {
				b.WriteString("-- +goose NO TRANSACTION\n")
			}
			b.WriteString(header + "\n-- +goose Up\n" + d.script(up) + "\n-- +goose Down\n" + d.script(down))
			files[fmt.Sprintf("%05d_%s.sql", st.version, st.name)] = []byte(b.String())
		default:
			return nil, fmt.Errorf("outboxplugin: %w: unknown migration format %q (want %q or %q)", ErrInvalidOption, format, GolangMigrate, Goose)
		}
	}
	return files, nil
}

// partitionedStep is the one version of a new partitioned table's files (MigrationFiles with
// WithPartitions): the current schema, partitioned, as SchemaSQL writes it.
func partitionedStep(keyOrdering bool) schemaStep {
	return schemaStep{
		version: latestSchemaVersion, name: "create_partitioned_table",
		about: []string{
			"The outbox table of the current schema, partitioned by range of created_at: the partitions of",
			"the interval that held the time these files were made and of the next two, and a default",
			"partition for the rows no other holds. The relay's maintenance makes the next partitions (at",
			"its start, and every ten minutes) and its cleanup drops the old ones whole.",
			"It stands for every version of the plain table up to its own: the versions of later releases",
			"follow it.",
		},
		up: func(d ddl) []string { return d.createCurrent(keyOrdering) },
		down: func(d ddl) []string {
			return []string{"DROP TABLE " + d.quotedTable()}
		},
	}
}

// header is the comment at the top of a step's files.
func (st schemaStep) header(d ddl) string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- outboxplugin schema version %d (%s) of table %s.\n", st.version, st.name, d.table)
	for _, l := range st.about {
		b.WriteString("-- " + l + "\n")
	}
	if st.online && d.dialect == dialectPostgres {
		b.WriteString("-- CONCURRENTLY cannot run in a transaction: the statement is alone in its file.\n")
	}
	return b.String()
}

// script is statements as a file holds them, each ended by a semicolon; a no-op when there is none.
func (d ddl) script(stmts []string) string {
	if len(stmts) == 0 {
		return "-- Nothing to change on this database.\n" + d.noop() + ";\n"
	}
	return strings.Join(stmts, ";\n\n") + ";\n"
}

// memFS is a flat, read-only file system held in memory: the rendered migration files.
type memFS map[string][]byte

var (
	_ fs.ReadDirFS  = memFS(nil)
	_ fs.ReadFileFS = memFS(nil)
)

// Open opens the file name, or "." for the directory of all of them.
func (m memFS) Open(name string) (fs.File, error) {
	if name == "." {
		entries, _ := m.ReadDir(".")
		return &memDir{entries: entries}, nil
	}
	b, ok := m[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return &memFile{info: memInfo{name: name, size: int64(len(b))}, Reader: bytes.NewReader(b)}, nil
}

// ReadDir lists the files, sorted by name; "." is the only directory.
func (m memFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if name != "." {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]fs.DirEntry, len(names))
	for i, n := range names {
		out[i] = fs.FileInfoToDirEntry(memInfo{name: n, size: int64(len(m[n]))})
	}
	return out, nil
}

// ReadFile returns a copy of the file name's contents.
func (m memFS) ReadFile(name string) ([]byte, error) {
	b, ok := m[name]
	if !ok {
		return nil, &fs.PathError{Op: "readfile", Path: name, Err: fs.ErrNotExist}
	}
	return bytes.Clone(b), nil
}

type memFile struct {
	info memInfo
	*bytes.Reader
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *memFile) Close() error               { return nil }

// memDir is memFS's only directory, open.
type memDir struct {
	entries []fs.DirEntry
	read    int
}

func (d *memDir) Stat() (fs.FileInfo, error) { return memInfo{name: ".", dir: true}, nil }
func (d *memDir) Close() error               { return nil }
func (d *memDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: ".", Err: fs.ErrInvalid}
}

// ReadDir returns the next n entries (all that are left when n <= 0).
func (d *memDir) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.read:]
	if n <= 0 {
		d.read = len(d.entries)
		return rest, nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	if n > len(rest) {
		n = len(rest)
	}
	d.read += n
	return rest[:n], nil
}

type memInfo struct {
	name string
	size int64
	dir  bool
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.dir }
func (i memInfo) Sys() any           { return nil }
func (i memInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}
