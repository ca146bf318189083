// Package outboxui is a web console for the outbox table of github.com/gorm-outbox/outboxplugin:
// counts per state, the oldest pending event's age, recent throughput and lag, the events with
// filters, one event with its payload and last error, and the dead events grouped by type and error
// with requeue and discard, and deliver-now of scheduled (delayed) events. It is an http.Handler
// over the core's Admin; its pages are server-rendered HTML with their assets embedded, so it needs
// no build step and nothing from the network.
//
//	admin, err := outboxplugin.NewAdmin(db)
//	console, err := outboxui.New(admin, outboxui.WithWrites(outboxui.BasicAuth(map[string]string{"oncall": secret})))
//	mux.Handle("/outbox/", console)
//
// It is read-only unless WithWrites is given, and every mutation then needs a user the Authenticator
// accepts, a POST with the page's CSRF token, and a confirmation; each one is logged with its user.
// Guide: https://github.com/gorm-outbox/outboxplugin/blob/main/docs/ui.md
package outboxui

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorm-outbox/outboxplugin"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console is the console's http.Handler.
type Console struct {
	admin  *outboxplugin.Admin
	cfg    config
	csrf   *csrf
	pages  map[string]*template.Template
	static http.Handler
	cop    *http.CrossOriginProtection
}

var _ http.Handler = (*Console)(nil)

// New returns the console of admin's outbox table, or an error wrapping ErrInvalidOption.
func New(admin *outboxplugin.Admin, opts ...Option) (*Console, error) {
	if admin == nil {
		return nil, fmt.Errorf("%w: nil *outboxplugin.Admin", ErrInvalidOption)
	}
	cfg := config{logger: slog.Default(), refresh: 10, title: "outbox"}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	c := &Console{admin: admin, cfg: cfg, cop: http.NewCrossOriginProtection()}
	var err error
	if c.csrf, err = newCSRF(cfg.csrfKey); err != nil {
		return nil, err
	}
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	c.static = http.FileServerFS(sub)
	c.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusForbidden, "This request came from another site, and was refused.")
	}))
	return c, nil
}

// Handler is New for a mux.Handle call: it panics on an invalid option, as template.Must does.
func Handler(admin *outboxplugin.Admin, opts ...Option) http.Handler {
	c, err := New(admin, opts...)
	if err != nil {
		panic(err)
	}
	return c
}

// maxForm bounds a POST's body: a selection of a thousand message ids fits many times over.
const maxForm = 1 << 20

// ServeHTTP routes a request to its page. Paths are relative to the base path (see WithBasePath).
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	base := c.basePath(r)
	rel, ok := strings.CutPrefix(r.URL.Path, base)
	if !ok {
		if r.URL.Path+"/" == base {
			http.Redirect(w, r, base, http.StatusMovedPermanently)
			return
		}
		c.fail(w, r, http.StatusNotFound, "No such page.")
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'")
	if strings.HasPrefix(rel, "static/") {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			c.fail(w, r, http.StatusMethodNotAllowed, "Static files are read with GET.")
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=3600")
		http.StripPrefix(base+"static", c.static).ServeHTTP(w, r)
		return
	}
	if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
		// r.URL.Query() drops what it cannot decode; a filter silently dropped would list too much.
		c.fail(w, r, http.StatusBadRequest, "The query string could not be read.")
		return
	}
	req := &request{w: w, r: r, base: base}
	if c.cfg.readAuth != nil {
		user, err := c.cfg.readAuth(r)
		if err != nil {
			c.unauthorized(w, r, err)
			return
		}
		req.user = user
	}
	switch {
	case r.Method == http.MethodPost && rel == "action":
		c.cop.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { c.action(req) })).ServeHTTP(w, r)
		return
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		c.fail(w, r, http.StatusMethodNotAllowed, "This page is read with GET; changes are made with the forms of the pages.")
		return
	}
	switch {
	case rel == "":
		c.overview(req)
	case rel == "events":
		c.events(req)
	case strings.HasPrefix(rel, "events/") && !strings.Contains(rel[len("events/"):], "/"):
		c.event(req, rel[len("events/"):])
	case rel == "dead":
		c.dead(req)
	default:
		c.fail(w, r, http.StatusNotFound, "No such page.")
	}
}

// basePath is the path the console is mounted at: WithBasePath's, else the ServeMux pattern that
// routed r ("GET example.com/outbox/" → "/outbox/"), else "/".
func (c *Console) basePath(r *http.Request) string {
	if c.cfg.basePath != "" {
		return c.cfg.basePath
	}
	p := r.Pattern
	if _, path, ok := strings.Cut(p, " "); ok { // "GET /outbox/"
		p = path
	}
	if i := strings.Index(p, "/"); i > 0 { // "example.com/outbox/"
		p = p[i:]
	}
	if !strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/") || strings.ContainsAny(p, "{}") {
		return "/"
	}
	return p
}

// request is one request being answered, with what its pages need.
type request struct {
	w    http.ResponseWriter
	r    *http.Request
	base string
	user string // "" unless an Authenticator named one
}

func (q *request) ctx() context.Context { return q.r.Context() }

// unauthorized answers a request without the credentials it needs: 401, with the challenge of the
// Authenticator that refused it (BasicAuth's makes the browser ask for a user and password), and
// none for an application's own.
func (c *Console) unauthorized(w http.ResponseWriter, r *http.Request, err error) {
	var ch challenger
	if errors.As(err, &ch) {
		w.Header().Set("WWW-Authenticate", ch.challenge())
	}
	c.fail(w, r, http.StatusUnauthorized, "This needs a user the console accepts.")
}

// fail answers with an error page of its own: no stack trace, no database error text (the log has
// it).
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, message string) {
	c.render(w, r, status, "error", c.basePath(r), "", map[string]any{"Status": status, "StatusText": http.StatusText(status), "Message": message})
}

// adminError answers a failed Admin call: 400 for a filter it refused, 404 for an event it does not
// have, and otherwise 500 with the error in the log only (a driver's error may quote a DSN or data).
func (c *Console) adminError(q *request, what string, err error) {
	switch {
	case errors.Is(err, outboxplugin.ErrInvalidFilter):
		c.fail(q.w, q.r, http.StatusBadRequest, "The filter cannot be used: "+strings.TrimPrefix(errText(err), "outboxplugin: "))
	case errors.Is(err, outboxplugin.ErrEventNotFound):
		c.fail(q.w, q.r, http.StatusNotFound, "No event has this message id.")
	case errors.Is(err, context.Canceled):
		// The client went away; nothing to answer.
	default:
		c.cfg.logger.LogAttrs(q.ctx(), slog.LevelError, "outboxui: "+what, slog.String("error", err.Error()))
		c.fail(q.w, q.r, http.StatusInternalServerError, "The database returned an error while reading "+what+"; the log has it.")
	}
}

// errText is the last part of an Admin error, the part that says what was wrong with the input.
func errText(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, "invalid filter: "); i >= 0 {
		return s[i+len("invalid filter: "):]
	}
	return s
}

// badRequest answers 400 for a query or form the console cannot parse.
func (c *Console) badRequest(q *request, message string) {
	c.fail(q.w, q.r, http.StatusBadRequest, message)
}

// now is the console's clock.
var now = time.Now
