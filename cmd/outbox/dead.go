package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/gorm-outbox/outboxplugin"
)

func init() { register(newDeadCmd) }

func newDeadCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "Group, requeue or discard failed events",
		Args:  noArgs,
	}
	cmd.AddCommand(newDeadGroupsCmd(a),
		newRepairCmd(a, repairAction{
			parent: "dead", name: "requeue", past: "requeued", states: "dead or waiting",
			short: "Make failed events (dead, or waiting for a retry) due now, with their attempts reset",
			long: `requeue makes failed events due now, with their attempts reset; their last error stays until
the next delivery. By default it acts on dead events and on events waiting for a retry; --state dead
or --state waiting narrows that. Events being delivered or already processed are left alone, and so
are scheduled events (delayed events whose time has not come: they keep their time; a message id of
one is named on stderr, and in JSON as "left_scheduled"): "outbox events deliver-now" is the command
that moves them.`,
			acts:          []outboxplugin.EventState{outboxplugin.StateDead, outboxplugin.StateWaiting},
			withState:     true,
			nameScheduled: true,
			byIDs:         (*outboxplugin.Admin).Requeue,
			where:         (*outboxplugin.Admin).RequeueWhere,
		}),
		newRepairCmd(a, repairAction{
			parent: "dead", name: "discard", past: "discarded", states: "dead",
			short: "Delete dead events",
			long:  `discard deletes dead events. Events of any other state are left alone.`,
			acts:  []outboxplugin.EventState{outboxplugin.StateDead},
			byIDs: (*outboxplugin.Admin).Discard,
			where: (*outboxplugin.Admin).DiscardWhere,
		}),
	)
	return cmd
}

// repairAction is one of the commands that change events (dead requeue, dead discard, events
// deliver-now): what it does by message ids and by filter.
type repairAction struct {
	parent             string // the command it is under: dead or events
	name, past, states string
	short, long        string
	acts               []outboxplugin.EventState // the states it acts on
	withState          bool                      // takes --state (requeue: dead or waiting)
	// nameScheduled: the message ids it left alone are looked up, and those of scheduled events named
	// (requeue: the operator may have meant deliver-now).
	nameScheduled bool
	byIDs         func(*outboxplugin.Admin, context.Context, ...string) (int64, error)
	where         func(*outboxplugin.Admin, context.Context, outboxplugin.EventFilter) (int64, error)
}

func newRepairCmd(a *app, act repairAction) *cobra.Command {
	var (
		ff    filterFlags
		state string
		all   bool
		yes   bool
	)
	cmd := &cobra.Command{
		Use:   act.name + " [MESSAGE_ID...]",
		Short: act.short,
		Long: act.long + `

Give the message ids of the events, or --all to act on every ` + act.states + ` event the filter flags
select (no filter: every one). An --all run asks for confirmation on the terminal, unless --yes;
without a terminal and without --yes it refuses (exit 4).`,
		Example: fmt.Sprintf(`  outbox %[2]s %[1]s --db shop.db 0194c7a2-5f1e-7d3a-9b1c-2a4e6f8d0b12
  outbox %[2]s %[1]s --db shop.db --all --type OrderPlaced --since 1d
  outbox %[2]s %[1]s --db shop.db --all --yes --json`, act.name, act.parent),
		RunE: a.runE(func(cmd *cobra.Command, ids []string) error {
			if len(ids) > 0 && (all || ff.set() || state != "") {
				return usagef("give message ids, or --all with filter flags, not both")
			}
			if len(ids) == 0 && !all {
				return usagef("give the message ids to %s, or --all (with filter flags) to %s every %s event they select", act.name, act.name, act.states)
			}
			if len(ids) > 0 {
				return a.repairByIDs(cmd.Context(), act, ids)
			}
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			if f.State, err = outboxplugin.ParseEventState(state); err != nil {
				return err
			}
			if f.State != "" && f.State != outboxplugin.StateDead && f.State != outboxplugin.StateWaiting {
				return usagef("--state %s: requeue acts on dead or waiting events", state) // scheduled ones: events deliver-now
			}
			if !yes {
				if err := a.confirm(fmt.Sprintf("%s every %s event in %s%s?", act.name, describeStates(act, f.State), a.table, describeFilter(ff))); err != nil {
					return err
				}
			}
			adm, closeDB, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			n, err := act.where(adm, cmd.Context(), f)
			if err != nil {
				return err
			}
			return a.printAffected(act, n, nil, nil)
		}),
	}
	fs := cmd.Flags()
	fs.BoolVar(&all, "all", false, "act on every "+act.states+" event the filter flags select, instead of on message ids")
	fs.BoolVar(&yes, "yes", false, "do not ask for confirmation")
	if act.withState {
		fs.StringVar(&state, "state", "", "with --all: only dead, or only waiting events (default both)")
	}
	ff.register(fs)
	return cmd
}

// repairByIDs acts on the events of the message ids. Each id is looked up first: one that is not in
// the table is named on stderr and in JSON ("not_found"), the others are acted on, and the run then
// ends with an error wrapping ErrEventNotFound (exit 3, as events show of an unknown id). An id whose
// event is in a state the action leaves alone is named with its state, and does not change the exit
// code: the event is there, and already not what the action would change.
func (a *app) repairByIDs(ctx context.Context, act repairAction, ids []string) error {
	adm, closeDB, err := a.admin(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	var (
		known, notFound []string
		before          = map[string]outboxplugin.EventInfo{}
	)
	for _, id := range ids {
		e, err := adm.Event(ctx, id)
		switch {
		case errors.Is(err, outboxplugin.ErrEventNotFound):
			notFound = append(notFound, id)
			continue
		case err != nil:
			return err
		}
		known = append(known, id)
		before[id] = e
	}
	var n int64
	if len(known) > 0 {
		if n, err = act.byIDs(adm, ctx, known...); err != nil {
			return err
		}
	}
	var scheduled []string
	for _, id := range known {
		e := before[id]
		if slices.Contains(act.acts, e.State) {
			continue
		}
		if act.nameScheduled && e.State == outboxplugin.StateScheduled {
			// The operator may have meant deliver-now.
			scheduled = append(scheduled, id)
			if !a.json {
				fmt.Fprintf(a.stderr, "%s is scheduled for %s: %s leaves it; outbox events deliver-now %s makes it due now\n",
					id, e.NextAttemptAt.UTC().Format(time.RFC3339), act.name, id)
			}
			continue
		}
		if !a.json {
			fmt.Fprintf(a.stderr, "%s is %s: %s acts on %s events only, and left it alone\n", id, e.State, act.name, act.states)
		}
	}
	if !a.json && n < int64(len(known)) {
		fmt.Fprintf(a.stderr, "%d of the %d message ids matched no %s event\n", int64(len(known))-n, len(known), act.states)
	}
	if err := a.printAffected(act, n, scheduled, notFound); err != nil {
		return err
	}
	if len(notFound) > 0 {
		return fmt.Errorf("%s: %d of the %d message ids are not in the table %s: %s: %w",
			act.name, len(notFound), len(ids), a.table, strings.Join(notFound, ", "), outboxplugin.ErrEventNotFound)
	}
	return nil
}

// printAffected prints how many events act changed, and in JSON the message ids of the scheduled
// events it left alone (requeue by message id) and of those not in the table.
func (a *app) printAffected(act repairAction, n int64, leftScheduled, notFound []string) error {
	if a.json {
		return a.printJSON(struct {
			Action        string   `json:"action"`
			Affected      int64    `json:"affected"`
			LeftScheduled []string `json:"left_scheduled,omitempty"`
			NotFound      []string `json:"not_found,omitempty"`
		}{act.name, n, leftScheduled, notFound})
	}
	_, err := fmt.Fprintf(a.stdout, "%s %d events\n", act.past, n)
	return err
}

func describeStates(act repairAction, st outboxplugin.EventState) string {
	if st != "" {
		return string(st)
	}
	return act.states
}

// describeFilter spells out the filter flags for the confirmation question.
func describeFilter(ff filterFlags) string {
	var parts []string
	for _, p := range []struct{ name, v string }{
		{"type", ff.eventType}, {"aggregate-type", ff.aggregateType}, {"aggregate-id", ff.aggregateID},
		{"message-id", ff.messageID}, {"error", ff.lastError}, {"since", ff.since}, {"until", ff.until},
	} {
		if p.v != "" {
			parts = append(parts, p.name+"="+p.v)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " with " + strings.Join(parts, " ")
}

// confirm asks question on the terminal and returns nil for a yes, or an error wrapping errRefused:
// for a no, and when stdin is not a terminal (a script must say --yes).
func (a *app) confirm(question string) error {
	if !term.IsTerminal(int(a.stdin.Fd())) {
		return fmt.Errorf("%w: this asks for confirmation and stdin is not a terminal: add --yes", errRefused)
	}
	return askYesNo(a.stdin, a.stderr, question)
}

// askYesNo writes question with a [y/N] prompt to out and reads the answer from in: nil for y or
// yes, an error wrapping errRefused otherwise.
func askYesNo(in io.Reader, out io.Writer, question string) error {
	fmt.Fprintf(out, "%s [y/N] ", question)
	answer, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && answer == "" {
		return fmt.Errorf("%w: no answer", errRefused)
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return fmt.Errorf("%w: not confirmed", errRefused)
}
