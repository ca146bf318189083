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
read.

Under "table health" it prints the table's size, its indexes' size, free space (MySQL/MariaDB
DATA_FREE; SQLite's free pages, of the whole file), live and dead rows, the last vacuum and analyze
(PostgreSQL), InnoDB's purge lag (history list length), and each partition of a partitioned table with
its range, age, size and rows; "unknown" for a figure the database does not keep or the user may not
read. All of it comes from the catalog and statistics views, never from counting rows. A threshold
those figures cross (docs/operations.md, "Table health") is printed as an ALERT line on stderr and
listed in JSON under "health"."alerts"; it does not change the exit code either.`,
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
	if len(st.ByType) > 0 {
		fmt.Fprintln(a.stdout)
		w = tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "EVENT TYPE\tPENDING\tSCHEDULED\tDEAD")
		for _, t := range st.ByType {
			fmt.Fprintf(w, "%s\t%d\t%d\t%d\n", t.EventType, t.Pending, t.Scheduled, t.Dead)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	return a.printHealth(st.Health, st.At)
}

// printHealth prints the table health part of status: its alerts on stderr, like the warnings, and
// its figures, then its partitions, on stdout.
func (a *app) printHealth(h outboxplugin.TableHealth, at time.Time) error {
	for _, al := range h.Alerts {
		fmt.Fprintf(a.stderr, "ALERT: %s\n", al.Text)
	}
	for _, u := range h.Unread {
		fmt.Fprintf(a.stderr, "note: table health: could not read %s\n", u)
	}
	kind, _, _ := parseDSN(a.dsn)
	keeps := healthFigures[kind]
	fmt.Fprintln(a.stdout)
	fmt.Fprintln(a.stdout, "TABLE HEALTH")
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	// A figure the database keeps is printed always, "unknown" when it could not be read; another
	// only when known.
	line := func(figure, text string, known bool) {
		if keeps[figure] || known {
			fmt.Fprintf(w, "%s\t%s\n", figure, text)
		}
	}
	size := bytesText(h.TotalBytes)
	if kind == kindSQLite && h.TotalBytes != nil {
		size += ", the whole database file"
	}
	line("size", size, h.TotalBytes != nil)
	line("  rows", bytesText(h.TableBytes), h.TableBytes != nil)
	line("  indexes", bytesText(h.IndexBytes), h.IndexBytes != nil)
	line("free space", bytesText(h.FreeBytes), h.FreeBytes != nil)
	line("live rows", countText(h.LiveRows, "~"), h.LiveRows != nil)
	line("dead rows", countText(h.DeadRows, ""), h.DeadRows != nil)
	line("last vacuum", timeText(h.LastVacuum, at, h.DeadRows != nil), h.LastVacuum != nil)
	line("last analyze", timeText(h.LastAnalyze, at, h.DeadRows != nil), h.LastAnalyze != nil)
	line("purge lag", countText(h.PurgeLag, ""), h.PurgeLag != nil)
	partitions := unknown
	if h.TotalBytes != nil { // read with the partitions (PostgreSQL) or beside them (MySQL)
		partitions = "none (not partitioned)"
	}
	if len(h.Partitions) > 0 {
		partitions = fmt.Sprint(len(h.Partitions))
	}
	line("partitions", partitions, len(h.Partitions) > 0)
	if err := w.Flush(); err != nil {
		return err
	}
	if len(h.Partitions) == 0 {
		return nil
	}
	fmt.Fprintln(a.stdout)
	w = tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "PARTITION\tFROM\tTO\tAGE\tSIZE\tROWS\tDEAD ROWS")
	for _, p := range h.Partitions {
		from, to := boundText(p.From), boundText(p.To)
		if p.Default {
			to = "DEFAULT"
			if p.From == nil {
				from = "-"
			}
		}
		age := "-"
		if p.Age != nil {
			age = p.Age.Round(time.Second).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, from, to, age, bytesText(p.TotalBytes),
			countText(p.Rows, "~"), countText(p.DeadRows, ""))
	}
	return w.Flush()
}

// unknown is how status writes a figure the database did not give.
const unknown = "unknown"

// healthFigures are the table health figures each database keeps (outboxplugin.TableHealth): status
// prints those always, "unknown" when they could not be read, and the others only when known.
var healthFigures = map[string]map[string]bool{
	kindPostgres: {"size": true, "  rows": true, "  indexes": true, "live rows": true, "dead rows": true,
		"last vacuum": true, "last analyze": true, "partitions": true},
	kindMySQL: {"size": true, "  rows": true, "  indexes": true, "free space": true, "live rows": true, "purge lag": true,
		"partitions": true},
	kindSQLite: {"size": true, "free space": true},
}

// bytesText writes a size in binary units, with the exact number of bytes.
func bytesText(n *int64) string {
	if n == nil {
		return unknown
	}
	v, unit := float64(*n), 0
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	for v >= 1024 && unit < len(units)-1 {
		v, unit = v/1024, unit+1
	}
	if unit == 0 {
		return fmt.Sprintf("%d B", *n)
	}
	return fmt.Sprintf("%.1f %s (%d bytes)", v, units[unit], *n)
}

// countText writes a count, after prefix ("~" for an estimate).
func countText(n *int64, prefix string) string {
	if n == nil {
		return unknown
	}
	return prefix + fmt.Sprint(*n)
}

// timeText writes a time of the table's upkeep and how long before at it was: "never" when the
// statistics were read (read) and have none, "unknown" when they were not.
func timeText(t *time.Time, at time.Time, read bool) string {
	switch {
	case t == nil && read:
		return "never"
	case t == nil:
		return unknown
	}
	return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), at.Sub(*t).Round(time.Second))
}

// boundText writes a partition's bound, "-" for an open end.
func boundText(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
