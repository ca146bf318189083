package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/gorm-outbox/outboxplugin"
)

func init() { register(newMigrateCmd) }

// Values of --format.
const (
	formatSQL           = "sql"
	formatGolangMigrate = string(outboxplugin.GolangMigrate)
	formatGoose         = string(outboxplugin.Goose)
)

func newMigrateCmd(a *app) *cobra.Command {
	var (
		dryRun, keyOrdering     bool
		dialect, format, output string
		partitions              time.Duration
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or update the outbox table, or print its schema and migration files",
		Long: `migrate runs outboxplugin.AutoMigrate on --table: it creates the table, or brings one of an
earlier version up to date, with the indexes the relay and these commands need. On an existing table
it only adds what is missing and never re-types a column: on PostgreSQL columns are added in the
catalog and indexes built CONCURRENTLY, on MySQL and MariaDB with ALGORITHM=INSTANT or INPLACE,
LOCK=NONE, so the application's writes go on. On an up-to-date table it runs nothing.

--dry-run prints the statements instead of running them. With --db, those migrate would run on that
database now (the catalog is read, nothing is written; nothing at all for an up-to-date table). With
--dialect (postgres, mysql or sqlite; mariadb is mysql) no database is needed:
  --format sql            (the default) the whole current schema of a new table, one script
  --format golang-migrate the schema's history as golang-migrate files (NNNNNN_name.up.sql/.down.sql)
  --format goose          the same as goose files (NNNNN_name.sql, marked NO TRANSACTION where needed)
Each file is printed after a "-- ==> name <==" line, or written into --output DIR. The files of the
default table are also in the repository's migrations folder; for another --table they are rendered
with that name, since a migration file cannot take the table name as a parameter.

--table may be schema-qualified (audit.events): the table is created in that schema, which must
exist.

--partitions WIDTH (PostgreSQL, MySQL/MariaDB) creates a new table partitioned by range of created_at,
in partitions WIDTH wide (24h: a day, from midnight UTC; a whole number of hours), with those of the
current interval and the next two and a default partition; the relay makes the next ones and its
cleanup drops the old ones whole. On a partitioned table it makes the partitions it lacks now; on a
table that is not partitioned it fails (docs/operations.md, "Partitioned outbox", converts one). With
--format golang-migrate or goose, the files are those of a new partitioned table: one version, that
creates it with the partitions of the current interval and the next two (the relay makes those
missing when the files are applied later). --key-ordering-index goes into those files; the plain
table's files leave it out (print its statement with --format sql).`,
		Example: `  outbox migrate --db postgres://app@db.internal/shop --dry-run
  outbox migrate --db shop.db --table events --key-ordering-index
  outbox migrate --dry-run --dialect postgres --table audit.events
  outbox migrate --db postgres://app@db.internal/shop --partitions 24h
  outbox migrate --dry-run --dialect mysql --format goose --output db/migrations/outbox`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			var opts []outboxplugin.MigrateOption
			if keyOrdering {
				opts = append(opts, outboxplugin.WithKeyOrderingIndex())
			}
			if cmd.Flags().Changed("partitions") {
				if partitions <= 0 {
					return usagef("--partitions %v: want a width of a whole number of hours, such as 24h", partitions)
				}
				opts = append(opts, outboxplugin.WithPartitions(partitions))
			}
			switch {
			case !dryRun && (dialect != "" || output != "" || cmd.Flags().Changed("format")):
				return usagef("--dialect, --format and --output print the schema: give --dry-run")
			case dialect == "" && (output != "" || cmd.Flags().Changed("format")):
				return usagef("--format and --output need --dialect (the files do not depend on a database's state)")
			case dialect != "":
				return a.printSchema(dialect, format, output, opts)
			}
			db, err := a.open(cmd.Context(), !dryRun) // a dry run creates no SQLite file
			if err != nil {
				return err
			}
			defer closeDB(db)
			if dryRun {
				statements, err := outboxplugin.PlanMigration(db.Table(a.table), opts...)
				if err != nil {
					return err
				}
				return a.printStatements(statements, "-- "+a.table+" is up to date: nothing to run")
			}
			if err := outboxplugin.AutoMigrate(db.Table(a.table), opts...); err != nil {
				return err
			}
			if a.json {
				return a.printJSON(struct {
					Table  string `json:"table"`
					DryRun bool   `json:"dry_run"`
				}{a.table, false})
			}
			_, err = fmt.Fprintf(a.stdout, "migrated %s\n", a.table)
			return err
		}),
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the statements instead of running them")
	cmd.Flags().BoolVar(&keyOrdering, "key-ordering-index", false, "also create the index a worker with WithKeyOrdering needs")
	cmd.Flags().DurationVar(&partitions, "partitions", 0, "create the table partitioned by created_at, in partitions this wide (24h: daily); PostgreSQL, MySQL/MariaDB")
	cmd.Flags().StringVar(&dialect, "dialect", "", "with --dry-run: print the schema of this database (postgres, mysql, sqlite) without connecting to one")
	cmd.Flags().StringVar(&format, "format", formatSQL, "with --dialect: sql, golang-migrate or goose")
	cmd.Flags().StringVar(&output, "output", "", "with --dialect: write the files into this directory instead of printing them")
	return cmd
}

// printStatements prints statements, each ended by a semicolon, or none as the line empty says.
func (a *app) printStatements(statements []string, none string) error {
	if a.json {
		return a.printJSON(struct {
			Table      string   `json:"table"`
			DryRun     bool     `json:"dry_run"`
			Statements []string `json:"statements"`
		}{Table: a.table, DryRun: true, Statements: append([]string{}, statements...)})
	}
	if len(statements) == 0 {
		_, err := fmt.Fprintln(a.stdout, none)
		return err
	}
	for _, s := range statements {
		if _, err := fmt.Fprintln(a.stdout, s+";"); err != nil {
			return err
		}
	}
	return nil
}

// printSchema prints, without a database, the current schema of dialect (format sql) or its
// migration files, or writes the files into output.
func (a *app) printSchema(dialect, format, output string, opts []outboxplugin.MigrateOption) error {
	switch format {
	case formatSQL:
		if output != "" {
			return usagef("--output writes migration files: give --format golang-migrate or goose")
		}
		statements, err := outboxplugin.SchemaSQL(dialect, a.table, opts...)
		if err != nil {
			return usageError{err}
		}
		return a.printStatements(statements, "")
	case formatGolangMigrate, formatGoose:
	default:
		return usagef("--format %q: want sql, golang-migrate or goose", format)
	}
	fsys, err := outboxplugin.MigrationFiles(outboxplugin.MigrationFormat(format), dialect, a.table, opts...)
	if err != nil {
		return usageError{err}
	}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return err
	}
	type file struct {
		Name    string `json:"name"`
		Content string `json:"content"`
	}
	files := make([]file, len(entries))
	for i, e := range entries {
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return err
		}
		files[i] = file{e.Name(), string(b)}
	}
	if output != "" {
		if err := os.MkdirAll(output, 0o755); err != nil {
			return err
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(output, f.Name), []byte(f.Content), 0o644); err != nil {
				return err
			}
		}
		if a.json {
			names := make([]string, len(files))
			for i, f := range files {
				names[i] = f.Name
			}
			return a.printJSON(struct {
				Table  string   `json:"table"`
				Output string   `json:"output"`
				Files  []string `json:"files"`
			}{a.table, output, names})
		}
		_, err := fmt.Fprintf(a.stdout, "wrote %d %s files of %s into %s\n", len(files), format, a.table, output)
		return err
	}
	if a.json {
		return a.printJSON(struct {
			Table string `json:"table"`
			Files []file `json:"files"`
		}{a.table, files})
	}
	for i, f := range files {
		if i > 0 {
			fmt.Fprintln(a.stdout)
		}
		if _, err := fmt.Fprintf(a.stdout, "-- ==> %s <==\n%s", f.Name, f.Content); err != nil {
			return err
		}
	}
	return nil
}
