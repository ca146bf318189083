package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gorm-outbox/outboxplugin"
)

func init() { register(newStatusCmd) }

func newStatusCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Count the outbox's events by state and by type",
		Long: `status counts the outbox table's events: pending (due, leased, waiting for a retry), scheduled
(delayed events whose time has not come), dead and processed, per event type, and the age of the
oldest pending event (how far behind the relay is; scheduled events do not count).

The processed count is exact up to 10000 rows; above that it is the database's estimate, and the
output says so ("~" in text, "processed_approximate": true in JSON).

It also checks the table's catalog for what makes the relay or the console slower than on a table
made by "outbox migrate" (a table made by GORM's own db.AutoMigrate lacks, on PostgreSQL, the storage
settings and the dead index): each is printed as a WARNING line on stderr, with its measured cost and
the fix, and listed in JSON as "table_warnings". They do not change the exit code: the counts were
read.`,
		Example: `  outbox status --db postgres://app@db.internal/shop
  outbox status --db shop.db --json`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			adm, closeDB, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			st, err := adm.Stats(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(st) // Stats's own JSON form
			}
			return a.printStats(st)
		}),
	}
}

func (a *app) printStats(st outboxplugin.Stats) error {
	// On stderr, like the other notes of the text output, so that stdout stays the counts.
	for _, w := range st.TableWarnings {
		fmt.Fprintf(a.stderr, "WARNING: %s\n", w)
	}
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	processed := fmt.Sprint(st.Processed)
	if st.ProcessedApproximate {
		processed = "~" + processed + "\t(approximate: the database's estimate)"
	}
	oldest := "-"
	if !st.OldestPending.IsZero() {
		oldest = fmt.Sprintf("%s\t(%s ago)", st.OldestPending.UTC().Format(time.RFC3339), st.OldestPendingAge.Round(time.Second))
	}
	fmt.Fprintf(w, "table\t%s\n", a.table)
	fmt.Fprintf(w, "pending\t%d\n", st.Pending)
	fmt.Fprintf(w, "  due\t%d\n", st.Due)
	fmt.Fprintf(w, "  leased\t%d\n", st.Leased)
	fmt.Fprintf(w, "  waiting\t%d\n", st.Waiting)
	fmt.Fprintf(w, "scheduled\t%d\n", st.Scheduled)
	fmt.Fprintf(w, "dead\t%d\n", st.Dead)
	fmt.Fprintf(w, "processed\t%s\n", processed)
	fmt.Fprintf(w, "oldest pending\t%s\n", oldest)
	if err := w.Flush(); err != nil {
		return err
	}
	if len(st.ByType) == 0 {
		return nil
	}
	fmt.Fprintln(a.stdout)
	w = tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "EVENT TYPE\tPENDING\tSCHEDULED\tDEAD")
	for _, t := range st.ByType {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\n", t.EventType, t.Pending, t.Scheduled, t.Dead)
	}
	return w.Flush()
}
