package outboxui

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/gorm-outbox/outboxplugin"
)

// maxSelection bounds the message ids of one mutation: a page of the console lists at most 100.
const maxSelection = 1000

// mutation is a requeue, discard or deliver-now the console has been asked for, as its form says.
type mutation struct {
	Op    string   // requeue, discard (failed events) or deliver-now (scheduled events)
	Scope string   // ids, group (one event type and error text) or cause (one error text, any type)
	IDs   []string // scope ids
	Type  string   // scope group: the event type
	Error string   // scope group and cause: the error text
	Back  string   // where to go afterwards: a path of the console
	CSRF  string
	Count int64 // scope group and cause: how many events it has now (for the confirmation)
	Types int64 // scope cause: how many event types its events have now
}

// action runs a mutation: writes enabled, an authenticated user, a form that parses, the CSRF token
// of the form's cookie, and then a confirmation page, whose own form (confirm=yes) runs it. Every
// mutation is logged with its user.
func (c *Console) action(q *request) {
	if c.cfg.writeAuth == nil {
		c.fail(q.w, q.r, http.StatusForbidden, "The console is read-only: it was started without writes.")
		return
	}
	user, err := c.cfg.writeAuth(q.r)
	if err != nil {
		c.unauthorized(q.w, q.r, err)
		return
	}
	q.user = user
	q.r.Body = http.MaxBytesReader(q.w, q.r.Body, maxForm)
	if err := q.r.ParseForm(); err != nil {
		c.badRequest(q, "The form could not be read.")
		return
	}
	if !c.csrf.check(q.r) {
		c.fail(q.w, q.r, http.StatusForbidden, "The form's security token is missing or out of date: reload the page and try again.")
		return
	}
	m, msg := c.parseMutation(q)
	if msg != "" {
		c.badRequest(q, msg)
		return
	}
	if q.r.PostFormValue("confirm") != "yes" {
		if m.Scope != "ids" {
			list := c.admin.DeadGroups
			if m.Scope == "cause" {
				list = c.admin.DeadCauses
			}
			groups, _, err := list(q.ctx(), outboxplugin.MaxDeadGroups)
			if err != nil {
				c.adminError(q, "the dead events", err)
				return
			}
			for _, g := range groups {
				if g.EventType == m.Type && g.LastError == m.Error {
					m.Count, m.Types = g.Count, g.EventTypes
				}
			}
		}
		m.CSRF = q.r.PostFormValue("csrf")
		c.show(q, "confirm", m)
		return
	}
	var n int64
	switch {
	case m.Scope == "ids" && m.Op == "requeue":
		n, err = c.admin.Requeue(q.ctx(), m.IDs...)
	case m.Scope == "ids" && m.Op == "deliver-now":
		n, err = c.admin.DeliverNow(q.ctx(), m.IDs...)
	case m.Scope == "ids":
		n, err = c.admin.Discard(q.ctx(), m.IDs...)
	case m.Op == "requeue":
		n, err = c.admin.RequeueWhere(q.ctx(), m.groupFilter())
	default:
		n, err = c.admin.DiscardWhere(q.ctx(), m.groupFilter())
	}
	attrs := []slog.Attr{slog.String("user", user), slog.String("remote", q.r.RemoteAddr), slog.String("scope", m.Scope),
		slog.Int64("events", n)}
	switch m.Scope {
	case "ids":
		attrs = append(attrs, slog.Any("message_ids", m.IDs))
	case "cause":
		attrs = append(attrs, slog.String("last_error", m.Error))
	default:
		attrs = append(attrs, slog.String("event_type", m.Type), slog.String("last_error", m.Error))
	}
	if err != nil {
		// Every attempt is logged with its user; one the Admin refused as bad input is the
		// client's, not an error of the console's.
		level, what := slog.LevelError, " failed"
		if errors.Is(err, outboxplugin.ErrInvalidFilter) {
			level, what = slog.LevelWarn, " refused"
		}
		c.cfg.logger.LogAttrs(q.ctx(), level, "outboxui: "+m.Op+what, append(attrs, slog.String("error", err.Error()))...)
		c.adminError(q, "the events to "+m.Op, err)
		return
	}
	c.cfg.logger.LogAttrs(q.ctx(), slog.LevelInfo, "outboxui: "+m.Op, attrs...)
	back := m.Back
	sep := "?"
	if strings.Contains(back, "?") {
		sep = "&"
	}
	http.Redirect(q.w, q.r, back+sep+url.Values{"done": {m.Op}, "n": {strconv.FormatInt(n, 10)}}.Encode(), http.StatusSeeOther)
}

// groupFilter selects the dead events of a group, or of a cause (m.Type is "": every type). Dead only:
// a waiting event of the same error keeps its retry, and a scheduled one has no error.
func (m mutation) groupFilter() outboxplugin.EventFilter {
	return outboxplugin.EventFilter{State: outboxplugin.StateDead, EventType: m.Type, LastError: m.Error}
}

// parseMutation reads the mutation of q's form, or says what in it cannot be used.
func (c *Console) parseMutation(q *request) (mutation, string) {
	f := q.r.PostForm
	m := mutation{Op: f.Get("op"), Scope: f.Get("scope"), Type: f.Get("type"), Error: f.Get("error"), Back: c.back(q, f.Get("back"))}
	one := f.Get("one") // one event's own button in a form of selectable events: "<op> <message id>"
	if one != "" {
		m.Op, one, _ = strings.Cut(one, " ")
	}
	switch m.Op {
	case "requeue", "discard":
	case "deliver-now":
		if m.Scope == "group" || m.Scope == "cause" {
			return m, "A group is dead events: deliver now is for scheduled events, select them instead."
		}
	default:
		return m, "Unknown action " + strconv.Quote(m.Op) + ": requeue, discard or deliver-now."
	}
	switch m.Scope {
	case "ids":
		if one != "" {
			m.IDs = []string{one}
		} else {
			for _, id := range f["ids"] {
				if id = strings.TrimSpace(id); id != "" {
					m.IDs = append(m.IDs, id)
				}
			}
		}
		if len(m.IDs) == 0 {
			return m, "No event selected."
		}
		if len(m.IDs) > maxSelection {
			return m, "At most " + strconv.Itoa(maxSelection) + " events at a time."
		}
	case "group":
		if m.Type == "" {
			return m, "A group is an event type and an error text: the type is missing."
		}
		if m.Error == "" {
			// An empty LastError filter selects every dead event of the type, not this group.
			return m, "This group has no error text to select it by: select its events instead."
		}
	case "cause":
		m.Type = "" // every event type
		if m.Error == "" {
			// An empty LastError filter selects every dead event, not this cause.
			return m, "This cause has no error text to select it by: select its events instead."
		}
	default:
		return m, "Unknown scope " + strconv.Quote(m.Scope) + ": ids, group or cause."
	}
	return m, ""
}

// back is where a mutation returns to: the form's path when it is one of the console's, else the
// dead events page. Never another site: no scheme, no host, no //.
func (c *Console) back(q *request, path string) string {
	if u, err := url.Parse(path); err == nil && u.Scheme == "" && u.Host == "" && strings.HasPrefix(u.Path, q.base) &&
		!strings.HasPrefix(path, "//") && !strings.Contains(path, "\\") {
		// Without a notice of an earlier mutation, which the redirect sets again.
		v := u.Query()
		v.Del("done")
		v.Del("n")
		u.RawQuery = v.Encode()
		return u.RequestURI()
	}
	return q.base + "dead"
}
