package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gorm-outbox/outboxplugin"
)

func newDeadGroupsCmd(a *app) *cobra.Command {
	var (
		by    string
		limit int
	)
	cmd := &cobra.Command{
		Use:   "groups",
		Short: "Count the dead events by the error they died with (--by type: by event type and error)",
		Long: `groups counts the dead events by the error text they died with, whatever their event type
(--by error, the default): one cause, such as a stream that does not exist, is one group however many
event types it stopped, with how many types it spans. --by type counts them by event type and error,
as the console's per-type view does. Largest groups first, at most --limit of them.

A cause is requeued or discarded whole with the filter flag --error of dead requeue and dead discard:
  outbox dead requeue --all --error 'TEXT'      (its dead events, and waiting ones of that error)
  outbox dead requeue --all --state dead --error 'TEXT'
A group of one type adds --type. Events that died without an error text cannot be selected by it.`,
		Example: `  outbox dead groups --db shop.db
  outbox dead groups --db shop.db --by type --json`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if by != "error" && by != "type" {
				return usagef("--by %q: want error or type", by)
			}
			if limit < 1 || limit > outboxplugin.MaxDeadGroups {
				return usagef("--limit %d: want 1..%d", limit, outboxplugin.MaxDeadGroups)
			}
			adm, closeDB, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			list := adm.DeadCauses
			if by == "type" {
				list = adm.DeadGroups
			}
			groups, more, err := list(cmd.Context(), limit)
			if err != nil {
				return err
			}
			if a.json {
				if groups == nil {
					groups = []outboxplugin.DeadGroup{}
				}
				return a.printJSON(struct {
					By     string                   `json:"by"`
					Groups []outboxplugin.DeadGroup `json:"groups"`
					More   bool                     `json:"more"`
				}{by, groups, more})
			}
			return a.printDeadGroups(by, groups, more)
		}),
	}
	cmd.Flags().StringVar(&by, "by", "error", "group by the error text alone (error), or by event type and error (type)")
	cmd.Flags().IntVar(&limit, "limit", 100, fmt.Sprintf("at most this many groups, 1..%d", outboxplugin.MaxDeadGroups))
	return cmd
}

func (a *app) printDeadGroups(by string, groups []outboxplugin.DeadGroup, more bool) error {
	if len(groups) == 0 {
		_, err := fmt.Fprintln(a.stdout, "no dead events")
		return err
	}
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	if by == "type" {
		fmt.Fprintln(w, "EVENT TYPE\tEVENTS\tFIRST DEAD\tLAST DEAD\tERROR")
	} else {
		fmt.Fprintln(w, "EVENT TYPES\tEVENTS\tFIRST DEAD\tLAST DEAD\tERROR")
	}
	for _, g := range groups {
		text := oneLine(g.LastError, 100)
		if g.LastError == "" {
			text = "(no error text)"
		}
		first := g.FirstDead.UTC().Format(time.RFC3339)
		last := g.LastDead.UTC().Format(time.RFC3339)
		if by == "type" {
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", g.EventType, g.Count, first, last, text)
		} else {
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\n", g.EventTypes, g.Count, first, last, text)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(a.stderr, "more groups: raise --limit (at most %d)\n", outboxplugin.MaxDeadGroups)
	}
	fmt.Fprintln(a.stderr, "requeue a whole cause: outbox dead requeue --all --state dead --error 'TEXT' (add --type for one event type)")
	return nil
}
