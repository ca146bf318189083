package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gorm-outbox/outboxplugin"
)

func init() { register(newEventsCmd) }

// maxLimit is the largest page events list asks for: the Admin's bound.
const maxLimit = 1000

// eventJSON is the JSON form of outboxplugin.EventInfo.
type eventJSON struct {
	ID            int64             `json:"id"`
	MessageID     string            `json:"message_id"`
	EventType     string            `json:"event_type"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	State         string            `json:"state"`
	Attempts      int               `json:"attempts"`
	LastError     string            `json:"last_error,omitempty"`
	CreatedAt     time.Time         `json:"created_at"`
	NextAttemptAt *time.Time        `json:"next_attempt_at,omitempty"`
	ProcessedAt   *time.Time        `json:"processed_at,omitempty"`
	DeadAt        *time.Time        `json:"dead_at,omitempty"`
	LockedBy      string            `json:"locked_by,omitempty"`
	LockedUntil   *time.Time        `json:"locked_until,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	// History is the event's last failed attempts, oldest first: events show only.
	History []attemptJSON `json:"history,omitempty"`
}

// attemptJSON is an entry of the history as events show --json prints it: the attempt_history
// column's own form (docs/relay.md, "Failure history"), with the time in RFC 3339 whichever database
// wrote it, and unfinished set for a delivery that never recorded an outcome.
type attemptJSON struct {
	At         time.Time `json:"at"`
	Attempt    int       `json:"attempt"`
	Worker     string    `json:"worker"`
	Error      string    `json:"error"`
	DurationMS *float64  `json:"duration_ms,omitempty"`
	Unfinished bool      `json:"unfinished,omitempty"`
}

func toAttemptsJSON(h []outboxplugin.Attempt) []attemptJSON {
	out := make([]attemptJSON, 0, len(h))
	for _, a := range h {
		j := attemptJSON{At: a.At, Attempt: a.Number, Worker: a.Worker, Error: a.Error, Unfinished: a.Unfinished()}
		if !a.Unfinished() {
			ms := float64(a.Duration.Microseconds()) / 1000
			j.DurationMS = &ms
		}
		out = append(out, j)
	}
	return out
}

func toEventJSON(e outboxplugin.EventInfo, withPayload bool) eventJSON {
	out := eventJSON{
		ID: e.ID, MessageID: e.MessageID, EventType: e.EventType, AggregateType: e.AggregateType,
		AggregateID: e.AggregateID, State: string(e.State), Attempts: e.Attempts, LastError: e.LastError,
		CreatedAt: e.CreatedAt, NextAttemptAt: e.NextAttemptAt, ProcessedAt: e.ProcessedAt, DeadAt: e.DeadAt,
		LockedBy: e.LockedBy, LockedUntil: e.LockedUntil, Headers: e.Headers,
	}
	if withPayload && json.Valid(e.Payload) {
		out.Payload = e.Payload
	}
	return out
}

func newEventsCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "events",
		Short: "List events, show one, or deliver scheduled ones now",
		Args:  noArgs,
	}
	cmd.AddCommand(newEventsListCmd(a), newEventsShowCmd(a), newRepairCmd(a, repairAction{
		parent: "events", name: "deliver-now", past: "made due now:", states: "scheduled",
		short: "Make scheduled events (delayed, their time not come) due now, ahead of their time",
		long: `deliver-now makes scheduled events — delayed events (DeliverAfter, DeliverAt) whose time has
not come — due now: workers publish them at their next poll, ahead of the time they were written
with. It acts on scheduled events only; failed ones are requeued with "outbox dead requeue".`,
		acts:  []outboxplugin.EventState{outboxplugin.StateScheduled},
		byIDs: (*outboxplugin.Admin).DeliverNow,
		where: (*outboxplugin.Admin).DeliverNowWhere,
	}))
	return cmd
}

func newEventsListCmd(a *app) *cobra.Command {
	var (
		ff     filterFlags
		state  string
		limit  int
		cursor string
		oldest bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List events, newest first, one page at a time",
		Long: `list prints one page of the events the filter selects, newest first (--oldest: oldest first).
When there are more, it prints the cursor of the next page (on stderr in text, as "next_cursor" in
JSON): pass it back with --cursor and the same filter and --oldest.

States: due, leased, waiting (failed, retried at next_attempt_at), scheduled (delayed, not yet at
its time), dead, processed; pending (due, leased and waiting); all (the default).
A --type or aggregate filter among processed events, which no index holds, reads at most 20000
processed events per page: a page that did not fill within them says the search stopped there (on
stderr, and "partial": true with "searched_to" in JSON), and its cursor searches on from where it
stopped. There may be no more matching events at all: bound the search with --since/--until.`,
		Example: `  outbox events list --db shop.db --state dead --type OrderPlaced
  outbox events list --db shop.db --since 2h --limit 100 --json
  outbox events list --db shop.db --cursor 1767369600000000000.42`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			if f.State, err = outboxplugin.ParseEventState(state); err != nil {
				return err
			}
			if limit < 1 || limit > maxLimit {
				// The Admin reads 0 as its default page; here 0 is a typo or a script's bug.
				return usagef("--limit %d: want 1..%d", limit, maxLimit)
			}
			f.Limit, f.Cursor, f.Oldest = limit, cursor, oldest
			adm, closeDB, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			page, err := adm.ListEvents(cmd.Context(), f)
			if err != nil {
				return err
			}
			if a.json {
				out := struct {
					Events     []eventJSON `json:"events"`
					NextCursor string      `json:"next_cursor"`
					// Partial: the search among processed events stopped after MaxProcessedScan rows
					// before it filled the page; SearchedTo is the creation time it got to, and
					// NextCursor continues from there.
					Partial    bool       `json:"partial"`
					SearchedTo *time.Time `json:"searched_to,omitempty"`
				}{Events: []eventJSON{}, NextCursor: page.Next, Partial: page.Partial}
				if page.Partial {
					out.SearchedTo = &page.SearchedTo
				}
				for _, e := range page.Events {
					out.Events = append(out.Events, toEventJSON(e, false))
				}
				return a.printJSON(out)
			}
			return a.printEventList(page, oldest)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&state, "state", "", "only events in this state: due, leased, waiting, scheduled, dead, processed, pending or all")
	ff.register(fs)
	fs.IntVar(&limit, "limit", 50, fmt.Sprintf("events per page, 1..%d", maxLimit))
	fs.StringVar(&cursor, "cursor", "", "continue after the page that printed this cursor")
	fs.BoolVar(&oldest, "oldest", false, "oldest events first")
	return cmd
}

func (a *app) printEventList(page outboxplugin.Page, oldest bool) error {
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "MESSAGE ID\tTYPE\tAGGREGATE\tSTATE\tATTEMPTS\tCREATED\tLAST ERROR")
	for _, e := range page.Events {
		agg := "-"
		if e.AggregateType != "" || e.AggregateID != "" {
			agg = e.AggregateType + "/" + e.AggregateID
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.MessageID, e.EventType, agg, e.State, e.Attempts,
			e.CreatedAt.UTC().Format(time.RFC3339), oneLine(e.LastError, 60))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	switch {
	case page.Partial:
		// Not "more events": there may be none. The search read its bound of processed rows and
		// stopped; the cursor goes on from where it stopped.
		dir := "back to"
		if oldest {
			dir = "up to"
		}
		fmt.Fprintf(a.stderr, "the search stopped after reading %d processed events (%s %s) with %d of the page found: "+
			"there may be more matching events past it: add --cursor %s (with the same filter) to search on, "+
			"or narrow the search with --since/--until\n",
			outboxplugin.MaxProcessedScan, dir, page.SearchedTo.UTC().Format(time.RFC3339Nano), len(page.Events), page.Next)
	case page.Next != "":
		fmt.Fprintf(a.stderr, "more events: add --cursor %s (with the same filter) for the next page\n", page.Next)
	}
	return nil
}

// oneLine shortens s to one line of at most n runes.
func oneLine(s string, n int) string {
	r := []rune(s)
	for i, c := range r {
		if c == '\n' || c == '\r' {
			r = append(r[:i:i], '…')
			break
		}
	}
	if len(r) > n {
		r = append(r[:n-1:n-1], '…')
	}
	return string(r)
}

func newEventsShowCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "show MESSAGE_ID",
		Short: "Show one event: payload, headers, attempts and their history, last error, timestamps, state",
		Long: `show prints the event with the message id, with its payload (pretty-printed JSON), headers,
attempts, last error, timestamps and state, and the history of its last failed attempts (oldest first:
when, on which worker, how long the publish took, the error). A message id that is not in the table
exits with 3.`,
		Example: `  outbox events show --db shop.db 0194c7a2-5f1e-7d3a-9b1c-2a4e6f8d0b12
  outbox events show --db shop.db 0194c7a2-5f1e-7d3a-9b1c-2a4e6f8d0b12 --json | jq .payload`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("events show takes one MESSAGE_ID, got %d arguments", len(args))
			}
			return nil
		},
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			adm, closeDB, err := a.admin(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			e, err := adm.Event(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json {
				out := toEventJSON(e, true)
				out.History = toAttemptsJSON(e.History)
				return a.printJSON(out)
			}
			return a.printEvent(e)
		}),
	}
}

func (a *app) printEvent(e outboxplugin.EventInfo) error {
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(w, "%s\t%s\n", k, v) }
	at := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	row("message id", e.MessageID)
	row("id", fmt.Sprint(e.ID))
	row("type", e.EventType)
	row("aggregate", e.AggregateType+"/"+e.AggregateID)
	row("state", string(e.State))
	row("attempts", fmt.Sprint(e.Attempts))
	row("created", at(&e.CreatedAt))
	if e.State == outboxplugin.StateScheduled {
		row("scheduled for", at(e.NextAttemptAt))
	} else {
		row("next attempt", at(e.NextAttemptAt))
	}
	row("processed", at(e.ProcessedAt))
	row("dead", at(e.DeadAt))
	if e.LockedBy != "" || e.LockedUntil != nil {
		row("leased by", e.LockedBy+" until "+at(e.LockedUntil))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, "\nlast error:")
	if e.LastError == "" {
		fmt.Fprintln(a.stdout, "  -")
	} else {
		fmt.Fprintln(a.stdout, "  "+e.LastError)
	}
	if err := a.printHistory(e.History); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, "\nheaders:")
	if len(e.Headers) == 0 {
		fmt.Fprintln(a.stdout, "  -")
	}
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		fmt.Fprintf(a.stdout, "  %s: %s\n", k, e.Headers[k])
	}
	fmt.Fprintln(a.stdout, "\npayload:")
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, e.Payload, "", "  "); err != nil {
		pretty.Reset()
		pretty.Write(e.Payload) // not JSON (written by hand): as stored
	}
	_, err := fmt.Fprintln(a.stdout, pretty.String())
	return err
}

// printHistory prints the failed attempts as a table, oldest first; an error's line breaks become
// spaces, so that each attempt is one line.
func (a *app) printHistory(h []outboxplugin.Attempt) error {
	fmt.Fprintln(a.stdout, "\nhistory (last failed attempts, oldest first):")
	if len(h) == 0 {
		fmt.Fprintln(a.stdout, "  -")
		return nil
	}
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  attempt\tat\tworker\ttook\terror")
	flat := strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ", "\t", " ")
	for _, at := range h {
		took := "-" // a delivery that did not finish: nobody saw it end
		if !at.Unfinished() {
			took = at.Duration.String()
		}
		fmt.Fprintf(w, "  %d\t%s\t%s\t%s\t%s\n", at.Number, at.At.UTC().Format(time.RFC3339Nano), at.Worker, took, flat.Replace(at.Error))
	}
	return w.Flush()
}
