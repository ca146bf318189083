package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gorm-outbox/outboxplugin"
)

// The exit codes, as the root command's help documents them.
const (
	exitOK       = 0
	exitFailed   = 1 // the operation failed: a database error, an unreadable table
	exitUsage    = 2 // a bad flag, argument or filter
	exitNotFound = 3 // a message id that is not there: events show, dead requeue/discard, events deliver-now
	exitRefused  = 4 // a confirmation declined, or not possible without a terminal
)

// usageError marks an error as the user's: a bad flag, argument or filter (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// errRefused: a run that needs a confirmation did not get one (exit 4).
var errRefused = errors.New("refused")

// app is the state one run of the command shares between its commands: the global flags, where
// output goes, and the DSN once read (which the error output is redacted against).
type app struct {
	stdin          *os.File
	stdout, stderr *os.File

	// The global flags, shared by every command that opens the database.
	db, dbFile, table string
	json              bool

	dsn string // the DSN in use, once read from --db or --db-file

	// running is set as a command's own work starts: an error before it (cobra's parsing, argument
	// counts, environment variables) is a usage error.
	running bool
}

// commands are the constructors of the root's subcommands; each command's file registers its own in
// an init function, so that a new command is one new file.
var commands []func(*app) *cobra.Command

func register(c func(*app) *cobra.Command) { commands = append(commands, c) }

const rootLong = `outbox relays and operates the outbox table of an application that uses
github.com/gorm-outbox/outboxplugin: the relay as a service (outbox relay), a web console (outbox ui),
counts per state, lists and single events, requeue and discard of failed events, cleanup of processed
rows, and the table's migration.

Selecting the database (--db, or --db-file with the DSN in a file):
  PostgreSQL   a URL starting postgres:// or postgresql://, or a key=value DSN containing host= or
               dbname= (host=db.internal user=app dbname=shop sslmode=require)
  MySQL        a go-sql-driver DSN, user:pass@tcp(host:3306)/db?params (any DSN with @tcp(, @unix(
               or @/), or a URL mysql://user:pass@host:3306/db?params, converted to that form;
               parseTime=true is added
  SQLite       a path ending .db, .sqlite or .sqlite3, a file: URI, or sqlite://PATH; the file must
               exist, except for migrate, which creates it
The rules are tried in this order; anything else is a usage error. Passwords in the DSN never appear
in the output: error messages show them, and any user:pass@ part, as xxxxx.

Every flag can also be set with an environment variable OUTBOX_<FLAG>, upper case with dashes as
underscores (OUTBOX_DB, OUTBOX_DB_FILE, OUTBOX_TABLE, OUTBOX_JSON, OUTBOX_OLDER_THAN, ...). A flag
given on the command line wins over its variable.

Exit codes:
  0  ok
  1  the operation failed (a database error, ...)
  2  usage error: a bad flag, argument or filter
  3  not found: a message id that is not in the table (events show; dead requeue, dead discard
     and events deliver-now name it, after acting on the ids that are there)
  4  refused: a confirmation was declined, or asked for without a terminal and without --yes`

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:           "outbox",
		Short:         "Inspect and repair a gorm-outbox outbox table",
		Long:          rootLong,
		SilenceErrors: true,
		SilenceUsage:  true,
		// No Run: "outbox" alone prints the help, and an unknown command is an error.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return applyEnv(cmd) },
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.CompletionOptions.DisableDefaultCmd = true

	pf := root.PersistentFlags()
	pf.StringVar(&a.db, "db", "", "the database: a PostgreSQL URL or key=value DSN, a MySQL DSN or mysql:// URL, or a SQLite path (see above)")
	pf.StringVar(&a.dbFile, "db-file", "", "read the --db DSN from this file (a mounted secret); surrounding whitespace is trimmed")
	pf.StringVar(&a.table, "table", outboxplugin.DefaultTableName, "the outbox table")
	pf.BoolVar(&a.json, "json", false, "print JSON instead of text")

	for _, c := range commands {
		root.AddCommand(c(a))
	}
	return root
}

// runE wraps a command's work so that errors before it count as usage errors (see app.running).
func (a *app) runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.running = true
		return fn(cmd, args)
	}
}

// applyEnv sets every flag not given on the command line from its OUTBOX_<FLAG> variable.
func applyEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		name := envName(f.Name)
		v, ok := os.LookupEnv(name)
		if !ok {
			return
		}
		if serr := cmd.Flags().Set(f.Name, v); serr != nil {
			err = usagef("environment variable %s: %v", name, serr)
		}
	})
	return err
}

// envName is the environment variable of the flag name: OUTBOX_ and the name upper-cased, dashes as
// underscores.
func envName(flag string) string {
	return "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// exitCode is the exit code of err, the error a run ended with.
func (a *app) exitCode(err error) int {
	var ue usageError
	switch {
	case errors.Is(err, errRefused):
		return exitRefused
	case errors.Is(err, outboxplugin.ErrEventNotFound):
		return exitNotFound
	case errors.As(err, &ue), errors.Is(err, outboxplugin.ErrInvalidFilter),
		errors.Is(err, outboxplugin.ErrInvalidTableName), !a.running:
		return exitUsage
	}
	return exitFailed
}

// printJSON writes v to stdout as indented JSON.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// noArgs refuses positional arguments as a usage error.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}
