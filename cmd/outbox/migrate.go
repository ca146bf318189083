package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
)

func init() { register(newMigrateCmd) }

func newMigrateCmd(a *app) *cobra.Command {
	var dryRun, keyOrdering bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or update the outbox table and its indexes",
		Long: `migrate runs outboxplugin.AutoMigrate on --table: it creates the table, or brings one of an
earlier version up to date, with the indexes the relay and these commands need. On PostgreSQL it builds
the indexes of an existing table CONCURRENTLY.

--dry-run prints the statements instead of running them: the database is read (does the table exist,
which indexes does it have) but nothing is written.

--table may be schema-qualified (audit.events): the table is created in that schema.`,
		Example: `  outbox migrate --db postgres://app@db.internal/shop --dry-run
  outbox migrate --db shop.db --table events --key-ordering-index`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			db, err := a.openDB(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB(db)
			var opts []outboxplugin.MigrateOption
			if keyOrdering {
				opts = append(opts, outboxplugin.WithKeyOrderingIndex())
			}
			if dryRun {
				return a.migrateDryRun(cmd.Context(), db, opts)
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
	return cmd
}

// migrateDryRun runs AutoMigrate over a connection that runs its queries and records its statements
// instead of executing them, and prints those.
func (a *app) migrateDryRun(ctx context.Context, db *gorm.DB, opts []outboxplugin.MigrateOption) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	rec := &recordingConn{db: sqlDB}
	dry, err := gorm.Open(dialector(db.Dialector.Name(), "", rec), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return fmt.Errorf("open the dry run: %w", err)
	}
	if err := outboxplugin.AutoMigrate(dry.WithContext(ctx).Table(a.table), opts...); err != nil {
		return err
	}
	statements := make([]string, len(rec.statements))
	for i, s := range rec.statements {
		statements[i] = dry.Dialector.Explain(s.query, s.args...)
	}
	if a.json {
		out := struct {
			Table      string   `json:"table"`
			DryRun     bool     `json:"dry_run"`
			Statements []string `json:"statements"`
		}{Table: a.table, DryRun: true, Statements: statements}
		return a.printJSON(out)
	}
	if len(statements) == 0 {
		fmt.Fprintf(a.stdout, "-- %s is up to date: nothing to run\n", a.table)
	}
	for _, s := range statements {
		fmt.Fprintln(a.stdout, s+";")
	}
	return nil
}

// recordingConn is a gorm.ConnPool that runs queries (the migrator's look at what exists) and
// records every other statement instead of executing it. It has no transactions and no prepared
// statements: a migration that needs them fails the dry run instead of writing.
type recordingConn struct {
	db         *sql.DB
	statements []struct {
		query string
		args  []any
	}
}

var _ gorm.ConnPool = (*recordingConn)(nil)

var errDryRunPrepare = errors.New("dry run: prepared statements are not supported")

func (c *recordingConn) PrepareContext(context.Context, string) (*sql.Stmt, error) {
	return nil, errDryRunPrepare
}

func (c *recordingConn) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	c.statements = append(c.statements, struct {
		query string
		args  []any
	}{query, args})
	return driverResult{}, nil
}

func (c *recordingConn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return c.db.QueryContext(ctx, query, args...)
}

func (c *recordingConn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return c.db.QueryRowContext(ctx, query, args...)
}

// driverResult is the result of a statement a dry run did not execute.
type driverResult struct{}

func (driverResult) LastInsertId() (int64, error) { return 0, nil }
func (driverResult) RowsAffected() (int64, error) { return 0, nil }
