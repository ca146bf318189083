package outboxui

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outboxplugin"
)

// pageNames are the templates/<name>.html pages, each rendered inside templates/layout.html.
var pageNames = []string{"overview", "events", "event", "dead", "confirm", "error"}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/partials.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("outboxui: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// view is what every page's template gets: the layout's fields, and the page's own in Data.
type view struct {
	Title   string
	Base    string
	Page    string
	Writes  bool
	CSRF    string
	User    string
	Refresh int
	Notice  string
	Now     time.Time
	Data    any
}

// show renders a page of q with status 200, naming q's user in its header.
func (c *Console) show(q *request, page string, data any) {
	c.render(q.w, q.r, http.StatusOK, page, q.base, q.user, data)
}

// render writes the page with status. A template error (a bug, not the request) is logged and
// answered with a bare 500.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page, base, user string, data any) {
	v := view{Title: c.cfg.title, Base: base, Page: page, Writes: c.cfg.writeAuth != nil, User: user, Now: now().UTC(), Data: data}
	if v.Writes {
		v.CSRF = c.csrf.token(w, r, base)
	}
	if page == "overview" {
		v.Refresh = c.cfg.refresh
	}
	v.Notice = notice(r.URL.Query())
	var buf bytes.Buffer
	if err := c.pages[page].Execute(&buf, v); err != nil {
		c.cfg.logger.Error("outboxui: render", "page", page, "error", err)
		http.Error(w, "outboxui: the page could not be rendered; the log has why", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

// notice is the message of a mutation that has just been done, from the redirect's query (done=,
// n=): only these fixed texts, so a link cannot make the console say anything else.
func notice(q url.Values) string {
	n, err := strconv.ParseInt(q.Get("n"), 10, 64)
	if err != nil || n < 0 {
		return ""
	}
	switch q.Get("done") {
	case "requeue":
		return fmt.Sprintf("Requeued %d event%s: workers publish them at their next poll.", n, plural(n))
	case "discard":
		return fmt.Sprintf("Discarded %d dead event%s.", n, plural(n))
	case "deliver-now":
		return fmt.Sprintf("Made %d scheduled event%s due now: workers publish them at their next poll.", n, plural(n))
	}
	return ""
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

var funcs = template.FuncMap{
	// rows hands the event table the page's view and the list it shows.
	"rows": func(v view, d *eventsData) map[string]any { return map[string]any{"V": v, "D": d} },
	"ts": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			if v.IsZero() {
				return "—"
			}
			return v.UTC().Format("2006-01-02 15:04:05.000 UTC")
		case *time.Time:
			if v == nil {
				return "—"
			}
			return v.UTC().Format("2006-01-02 15:04:05.000 UTC")
		}
		return ""
	},
	"iso": func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"age": humanDuration,
	"ago": func(now time.Time, t any) string {
		switch v := t.(type) {
		case time.Time:
			if v.IsZero() {
				return ""
			}
			return relative(now.Sub(v))
		case *time.Time:
			if v == nil {
				return ""
			}
			return relative(now.Sub(*v))
		}
		return ""
	},
	"trunc": func(n int, s string) string {
		r := []rune(s)
		if len(r) <= n {
			return s
		}
		return string(r[:n]) + "…"
	},
	"num": func(n int64) string { return groupDigits(n) },
	// bytes writes a size in binary units; "unknown" for a figure the database did not give.
	"bytes": humanBytes,
	"deref": func(n *int64) int64 {
		if n == nil {
			return 0
		}
		return *n
	},
	"derefTime": func(t *time.Time) time.Time {
		if t == nil {
			return time.Time{}
		}
		return *t
	},
	"positive": func(n *int64) bool { return n != nil && *n > 0 },
	// partAge writes a partition's age: "3 d 4 h", "in 20 h" for one made ahead, "—" when unknown.
	"partAge": func(d *time.Duration) string {
		if d == nil {
			return "—"
		}
		if *d < 0 {
			return "in " + humanDuration(-*d)
		}
		return humanDuration(*d)
	},

	"eventURL": func(base, id string) string { return base + "events/" + url.PathEscape(id) },
	"query": func(base, path string, kv ...string) string {
		q := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				q.Set(kv[i], kv[i+1])
			}
		}
		if len(q) == 0 {
			return base + path
		}
		return base + path + "?" + q.Encode()
	},
	// causeQuery is the query of one cause's list: error= even when the text is empty (events that
	// died without one), which query leaves out.
	"causeQuery": func(lastError string) string { return url.Values{"error": {lastError}}.Encode() },
	"key": func(e outboxplugin.EventInfo) string {
		if e.AggregateType == "" && e.AggregateID == "" {
			return ""
		}
		return e.AggregateType + "/" + e.AggregateID
	},
	// canRequeue: a failed event (dead, or waiting for a retry). Never a scheduled one, which keeps
	// its time unless someone asks to deliver it now (isScheduled).
	"canRequeue": func(s outboxplugin.EventState) bool {
		return s == outboxplugin.StateDead || s == outboxplugin.StateWaiting
	},
	"isDead":      func(s outboxplugin.EventState) bool { return s == outboxplugin.StateDead },
	"isScheduled": func(s outboxplugin.EventState) bool { return s == outboxplugin.StateScheduled },
	"states": func() []outboxplugin.EventState {
		return []outboxplugin.EventState{outboxplugin.StatePending, outboxplugin.StateDue, outboxplugin.StateLeased,
			outboxplugin.StateWaiting, outboxplugin.StateScheduled, outboxplugin.StateDead, outboxplugin.StateProcessed}
	},
}

// humanBytes writes a size the way a person reads it: "512 B", "40.0 KiB", "1.2 GiB"; "unknown" for
// nil.
func humanBytes(n *int64) string {
	if n == nil {
		return "unknown"
	}
	v, unit := float64(*n), 0
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	for v >= 1024 && unit < len(units)-1 {
		v, unit = v/1024, unit+1
	}
	if unit == 0 {
		return fmt.Sprintf("%d B", *n)
	}
	return fmt.Sprintf("%.1f %s", v, units[unit])
}

// humanDuration writes d the way a person reads an age: "3.2 s", "4 min 10 s", "2 h 5 min", "3 d 4 h".
func humanDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0 s"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%d d %d h", int(d.Hours())/24, int(d.Hours())%24)
}

func relative(d time.Duration) string {
	if d < 0 {
		return "in " + humanDuration(-d)
	}
	return humanDuration(d) + " ago"
}

// groupDigits writes n with thin spaces between groups of three digits: 1 234 567.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString("\u202f")
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
