package outboxui

import (
	"bytes"
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gorm-outbox/outboxplugin"
)

// The overview's chart: this many intervals of this length.
const (
	chartIntervals = 15
	chartInterval  = time.Minute
)

type overviewData struct {
	Stats    outboxplugin.Stats
	Activity outboxplugin.Activity
	Chart    chart
}

func (c *Console) overview(q *request) {
	st, err := c.admin.Stats(q.ctx())
	if err != nil {
		c.adminError(q, "the counts", err)
		return
	}
	act, err := c.admin.Activity(q.ctx(), chartIntervals, chartInterval)
	if err != nil {
		c.adminError(q, "the activity", err)
		return
	}
	c.show(q, "overview", overviewData{Stats: st, Activity: act, Chart: newChart(act)})
}

// chart is the overview's bar chart of Activity, drawn as inline SVG by the template.
type chart struct {
	Width, Height int
	Bars          []bar
	Max           int64
	MaxAtLeast    bool
	Total         int64
	PerSecond     float64 // over the complete intervals
}

type bar struct {
	X, Y, W, H int
	Value      int64
	AtLeast    bool
	Start      time.Time
}

func newChart(act outboxplugin.Activity) chart {
	ch := chart{Width: 600, Height: 120}
	for i, v := range act.Published {
		ch.Total += v
		if v > ch.Max {
			ch.Max = v
		}
		if act.AtLeast[i] {
			ch.MaxAtLeast = true
		}
	}
	n := len(act.Published)
	if n == 0 {
		return ch
	}
	w := ch.Width / n
	for i, v := range act.Published {
		h := 0
		if ch.Max > 0 {
			h = int(float64(v) / float64(ch.Max) * float64(ch.Height-4))
		}
		if v > 0 && h < 2 {
			h = 2
		}
		ch.Bars = append(ch.Bars, bar{X: i*w + 2, Y: ch.Height - h, W: w - 4, H: h, Value: v, AtLeast: act.AtLeast[i],
			Start: act.Start.Add(time.Duration(i) * act.Interval)})
	}
	if n > 1 {
		var complete int64
		for _, v := range act.Published[:n-1] {
			complete += v
		}
		ch.PerSecond = float64(complete) / (time.Duration(n-1) * act.Interval).Seconds()
	}
	return ch
}

type eventsData struct {
	Filter outboxplugin.EventFilter
	Form   url.Values // the filter as given, to fill the form again
	Page   outboxplugin.Page
	// NextURL continues the listing; FirstURL starts it again.
	NextURL, FirstURL string
	// Group is set on the dead page's list of one group.
	Group *outboxplugin.DeadGroup
	Back  string
}

// filterFields are the query parameters of the events page.
var filterFields = []string{"state", "type", "aggregate_type", "aggregate_id", "id", "since", "until", "order", "limit"}

func (c *Console) events(q *request) {
	f, form, msg := parseFilter(q.r.URL.Query())
	if msg != "" {
		c.badRequest(q, msg)
		return
	}
	page, err := c.admin.ListEvents(q.ctx(), f)
	if err != nil {
		c.adminError(q, "the events", err)
		return
	}
	d := eventsData{Filter: f, Form: form, Page: page, Back: q.r.URL.RequestURI()}
	d.FirstURL = q.base + "events"
	if enc := form.Encode(); enc != "" {
		d.FirstURL += "?" + enc
	}
	if page.Next != "" {
		next := cloneValues(form)
		next.Set("cursor", page.Next)
		d.NextURL = q.base + "events?" + next.Encode()
	}
	c.show(q, "events", &d)
}

// parseFilter reads the events page's query, or says what in it cannot be used.
func parseFilter(v url.Values) (outboxplugin.EventFilter, url.Values, string) {
	form := url.Values{}
	for _, k := range filterFields {
		if s := strings.TrimSpace(v.Get(k)); s != "" {
			form.Set(k, s)
		}
	}
	f := outboxplugin.EventFilter{
		EventType: form.Get("type"), AggregateType: form.Get("aggregate_type"), AggregateID: form.Get("aggregate_id"),
		MessageID: form.Get("id"), Cursor: strings.TrimSpace(v.Get("cursor")),
	}
	state, err := outboxplugin.ParseEventState(form.Get("state"))
	if err != nil {
		return f, form, "Unknown state " + strconv.Quote(form.Get("state")) + "."
	}
	f.State = state
	if (f.AggregateType == "") != (f.AggregateID == "") {
		return f, form, "A key is an aggregate type and an aggregate id: give both."
	}
	for _, b := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if s := form.Get(b.name); s != "" {
			t, ok := parseTime(s)
			if !ok {
				return f, form, "Cannot read " + b.name + " " + strconv.Quote(s) + ": want a UTC time such as 2026-12-01T14:30."
			}
			*b.dst = t
		}
	}
	switch form.Get("order") {
	case "", "newest":
	case "oldest":
		f.Oldest = true
	default:
		return f, form, "Order is newest or oldest."
	}
	if s := form.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return f, form, "Limit is a number of events, 1 to 1000."
		}
		f.Limit = n
	}
	return f, form, ""
}

// parseTime reads a time as a datetime-local input sends it (UTC, as the form says), or RFC 3339.
func parseTime(s string) (time.Time, bool) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

type eventData struct {
	Event         outboxplugin.EventInfo
	Payload       string // pretty-printed; "" when hidden
	PayloadHidden bool
	PayloadBytes  int
	HeaderNames   []string
	Back          string
}

func (c *Console) event(q *request, escaped string) {
	id, err := url.PathUnescape(escaped)
	// Not text (a NUL byte, bytes that are not UTF-8): no event has it, and PostgreSQL refuses it.
	if err != nil || id == "" || len(id) > 200 || !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
		c.badRequest(q, "Not a message id.")
		return
	}
	e, err := c.admin.Event(q.ctx(), id)
	if err != nil {
		c.adminError(q, "the event", err)
		return
	}
	d := eventData{Event: e, PayloadBytes: len(e.Payload), PayloadHidden: c.cfg.hidePayloads, Back: q.r.URL.RequestURI()}
	if !c.cfg.hidePayloads {
		var buf bytes.Buffer
		if json.Indent(&buf, e.Payload, "", "  ") == nil {
			d.Payload = buf.String()
		} else {
			d.Payload = string(e.Payload)
		}
	}
	for k := range e.Headers {
		d.HeaderNames = append(d.HeaderNames, k)
	}
	slices.Sort(d.HeaderNames)
	c.show(q, "event", d)
}

type deadData struct {
	Groups []outboxplugin.DeadGroup
	More   bool
	// ByType: the groups are of one event type and one error text each (?by=type); otherwise of one
	// error text each, whatever the type (the default: one cause, such as a stream that does not
	// exist, is one group however many event types it stopped).
	ByType bool
	// List is the events of one group, when the query names one: type= and error= (by type), or
	// error= alone (by error).
	List *eventsData
	Back string
}

func (c *Console) dead(q *request) {
	v := q.r.URL.Query()
	var byType bool
	switch v.Get("by") {
	case "", "error":
		byType = v.Has("type") // a link to one group of the per-type view
	case "type":
		byType = true
	default:
		c.badRequest(q, "Dead events are grouped by error or by type.")
		return
	}
	groups, more, err := c.admin.DeadCauses(q.ctx(), 0)
	if byType {
		groups, more, err = c.admin.DeadGroups(q.ctx(), 0)
	}
	if err != nil {
		c.adminError(q, "the dead events", err)
		return
	}
	d := deadData{Groups: groups, More: more, ByType: byType, Back: q.r.URL.RequestURI()}
	if v.Has("type") || (!byType && v.Has("error")) {
		g := outboxplugin.DeadGroup{EventType: v.Get("type"), LastError: v.Get("error")}
		for _, have := range groups {
			if have.EventType == g.EventType && have.LastError == g.LastError {
				g = have
			}
		}
		f := outboxplugin.EventFilter{State: outboxplugin.StateDead, EventType: g.EventType, LastError: g.LastError,
			Cursor: v.Get("cursor"), Oldest: true, Limit: 100}
		page, err := c.admin.ListEvents(q.ctx(), f)
		if err != nil {
			c.adminError(q, "the dead events", err)
			return
		}
		if g.LastError == "" {
			// No error text to select by: the filter took every dead event (of the type).
			var kept []outboxplugin.EventInfo
			for _, e := range page.Events {
				if e.LastError == "" {
					kept = append(kept, e)
				}
			}
			page.Events = kept
		}
		list := &eventsData{Filter: f, Page: page, Group: &g, Back: d.Back}
		if page.Next != "" {
			next := url.Values{"error": {g.LastError}, "cursor": {page.Next}}
			if byType {
				next.Set("type", g.EventType)
			}
			list.NextURL = q.base + "dead?" + next.Encode()
		}
		d.List = list
	}
	c.show(q, "dead", d)
}
