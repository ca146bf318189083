package outboxui_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outboxplugin"
	outboxui "github.com/gorm-outbox/outboxplugin/ui"
	"gorm.io/gorm"
)

// client is a browser-like HTTP client of one console: it keeps cookies and does not follow
// redirects, so that tests see them.
type client struct {
	t    *testing.T
	base string // the server's URL
	http *http.Client
	user string
	pass string
}

func newClient(t *testing.T, base string) *client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &client{t: t, base: base, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (c *client) do(req *http.Request) (*http.Response, string) {
	c.t.Helper()
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	res, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return res, string(b)
}

func (c *client) get(path string) (*http.Response, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.base+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.do(req)
}

func (c *client) post(path string, form url.Values, header ...string) (*http.Response, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return c.do(req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrfOf returns the CSRF token of a page's forms.
func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", body)
	}
	return m[1]
}

func wantStatus(t *testing.T, res *http.Response, body string, status int) {
	t.Helper()
	if res.StatusCode != status {
		t.Fatalf("%s %s: %d, want %d\n%s", res.Request.Method, res.Request.URL, res.StatusCode, status, body)
	}
}

func stateOf(t *testing.T, d *testDB, messageID string) outboxplugin.EventState {
	t.Helper()
	admin, err := outboxplugin.NewAdmin(d.db)
	if err != nil {
		t.Fatal(err)
	}
	e, err := admin.Event(context.Background(), messageID)
	if errors.Is(err, outboxplugin.ErrEventNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return e.State
}

func TestPagesShowTheTable(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		srv, _ := serve(t, d)
		c := newClient(t, srv.URL)

		res, body := c.get("/outbox/")
		wantStatus(t, res, body, http.StatusOK)
		for _, want := range []string{`data-count="pending">2<`, `data-count="due">1<`, `data-count="waiting">1<`,
			`data-count="dead">3<`, `data-count="processed">1<`, `data-age="oldest"`, `href="/outbox/events?state=due"`,
			"PaymentFailed", "read-only", `<meta http-equiv="refresh" content="10">`, `data-lag="p50">2.0 s<`} {
			if !strings.Contains(body, want) {
				t.Errorf("overview lacks %s", want)
			}
		}
		if strings.Contains(body, `name="csrf"`) {
			t.Error("a read-only console renders forms")
		}

		res, body = c.get("/outbox/events?state=dead&order=oldest")
		wantStatus(t, res, body, http.StatusOK)
		if i, j := strings.Index(body, f.deadA1), strings.Index(body, f.deadB); i < 0 || j < 0 || i > j || strings.Contains(body, f.due) {
			t.Errorf("dead events, oldest first: want %s before %s and not %s:\n%s", f.deadA1, f.deadB, f.due, body)
		}
		res, body = c.get("/outbox/events?aggregate_type=Payment&aggregate_id=5")
		wantStatus(t, res, body, http.StatusOK)
		if !strings.Contains(body, f.deadB) || strings.Contains(body, f.deadA1) {
			t.Errorf("filter by key: %s", body)
		}
		res, body = c.get("/outbox/events?limit=2")
		wantStatus(t, res, body, http.StatusOK)
		next := regexp.MustCompile(`href="(/outbox/events\?[^"]*cursor=[^"]+)" rel="next"`).FindStringSubmatch(body)
		if next == nil {
			t.Fatalf("a page of 2 of 6 events has no next link:\n%s", body)
		}
		seen := strings.Count(body, `data-message-id=`)
		for page := 0; next != nil && page < 5; page++ {
			res, body = c.get(strings.ReplaceAll(next[1], "&amp;", "&"))
			wantStatus(t, res, body, http.StatusOK)
			seen += strings.Count(body, `data-message-id=`)
			next = regexp.MustCompile(`href="(/outbox/events\?[^"]*cursor=[^"]+)" rel="next"`).FindStringSubmatch(body)
		}
		if seen != 6 {
			t.Errorf("paging by 2 showed %d events, want 6", seen)
		}

		res, body = c.get("/outbox/events/" + f.deadB)
		wantStatus(t, res, body, http.StatusOK)
		for _, want := range []string{`&#34;reason&#34;: &#34;card declined&#34;`, "payload too large", "Payment/5", `data-field="state">dead<`, ">tenant<", ">acme<"} {
			if !strings.Contains(body, want) {
				t.Errorf("event page lacks %s", want)
			}
		}

		res, body = c.get("/outbox/dead")
		wantStatus(t, res, body, http.StatusOK)
		if !strings.Contains(body, "broker said no: 503") || !strings.Contains(body, "payload too large") {
			t.Errorf("dead page lacks a group:\n%s", body)
		}
		if i, j := strings.Index(body, "broker said no: 503"), strings.Index(body, "payload too large"); i > j {
			t.Error("the larger group (2 events) is not first")
		}
		res, body = c.get("/outbox/dead?" + url.Values{"type": {f.orderType}, "error": {"broker said no: 503"}}.Encode())
		wantStatus(t, res, body, http.StatusOK)
		if !strings.Contains(body, f.deadA1) || !strings.Contains(body, f.deadA2) || strings.Contains(body, `data-message-id="`+f.deadB) {
			t.Errorf("one group's events: %s", body)
		}

		req, _ := http.NewRequest(http.MethodHead, srv.URL+"/outbox/", nil)
		res, body = c.do(req)
		if res.StatusCode != http.StatusOK || body != "" {
			t.Errorf("HEAD: %d %q", res.StatusCode, body)
		}
		res, body = c.get("/outbox/static/console.css")
		if res.StatusCode != http.StatusOK || !strings.Contains(res.Header.Get("Content-Type"), "text/css") {
			t.Errorf("static css: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
		}
		res, _ = c.get("/outbox") // ServeMux's own redirect
		if res.StatusCode/100 != 3 || res.Header.Get("Location") != "/outbox/" {
			t.Errorf("/outbox: %d to %q", res.StatusCode, res.Header.Get("Location"))
		}
	})
}

// A request the console cannot use gets a 400 (or 404, 405) page of its own: never a 500, never a
// stack trace or a database error.
// The event page has the event's failed attempts, oldest first: a refusal with its worker, time and
// error (escaped), and a delivery that did not finish, under the relay that crashed holding it.
func TestEventPageShowsTheFailedAttempts(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		ctx := context.Background()
		refuse := outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
			failed := map[string]error{}
			for _, m := range msgs {
				failed[m.ID] = errors.New(`schema <script>alert(1)</script> refused`)
			}
			return outboxplugin.FailedMessages(failed)
		})
		quiet := outboxplugin.WithLogger(slog.New(slog.DiscardHandler))
		w, err := outboxplugin.NewWorker(d.db, refuse, quiet,
			outboxplugin.WithRetryPolicy(outboxplugin.ExponentialBackoff{Base: time.Millisecond, Max: time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.ProcessOnce(ctx); err != nil {
			t.Fatal(err)
		}
		// The second delivery's relay dies holding the lease; another takes the event over and publishes it.
		time.Sleep(5 * time.Millisecond)
		if err := d.db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("message_id = ?", f.due).
			Updates(map[string]any{"locked_by": "crashed-relay-9", "locked_until": time.Now().UTC().Add(-time.Second), "attempts": 2}).Error; err != nil {
			t.Fatal(err)
		}
		ok := outboxplugin.PublisherFunc(func(context.Context, []outboxplugin.Message) error { return nil })
		w2, err := outboxplugin.NewWorker(d.db, ok, quiet)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := w2.ProcessOnce(ctx); err != nil || n != 1 {
			t.Fatalf("takeover: published %d, %v", n, err)
		}

		srv, _ := serve(t, d)
		res, body := newClient(t, srv.URL).get("/outbox/events/" + f.due)
		wantStatus(t, res, body, http.StatusOK)
		first := regexp.MustCompile(`<tr data-attempt="1"><td>1</td><td><time datetime="[^"]+">\d{4}-[^<]+ UTC</time></td><td class="mono">` +
			regexp.QuoteMeta(w.Owner()) + `</td>\s*<td>\d+ ms</td><td><pre class="err">schema &lt;script&gt;alert\(1\)&lt;/script&gt; refused</pre></td></tr>`)
		second := regexp.MustCompile(`<tr data-attempt="2">.*<td class="mono">crashed-relay-9</td>\s*<td><span title="[^"]+">did not finish</span></td>`)
		if i, j := first.FindStringIndex(body), second.FindStringIndex(body); i == nil || j == nil || i[0] > j[0] {
			t.Errorf("event page lacks the attempts, oldest first (refusal %v, unfinished %v):\n%s", i, j, body)
		}
		if strings.Contains(body, "<script>alert") {
			t.Error("an error text is not escaped")
		}
		_, body = newClient(t, srv.URL).get("/outbox/events/" + f.deadB)
		if !strings.Contains(body, `<p data-field="history">None recorded.</p>`) {
			t.Errorf("an event failed without a history says so:\n%s", body)
		}
	})
}

func TestBadRequestsAre400(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		addFixture(t, d)
		srv, _ := serve(t, d, outboxui.WithWrites(outboxui.BasicAuth(map[string]string{"ops": "pw"})))
		c := newClient(t, srv.URL)
		for path, status := range map[string]int{
			"/outbox/events?state=bogus":                 400,
			"/outbox/events?since=yesterday":             400,
			"/outbox/events?until=2026-13-45":            400,
			"/outbox/events?limit=0":                     400,
			"/outbox/events?limit=100000":                400,
			"/outbox/events?limit=ten":                   400,
			"/outbox/events?order=sideways":              400,
			"/outbox/events?cursor=not-a-cursor":         400,
			"/outbox/events?cursor=1.2.3":                400,
			"/outbox/events?aggregate_id=5":              400,
			"/outbox/events?state=%ZZ":                   400,
			"/outbox/events/" + strings.Repeat("x", 300): 400,
			"/outbox/events/no-such-id":                  404,
			"/outbox/dead?type=x&cursor=garbage":         400,
			"/outbox/nope":                               404,
			"/outbox/events/a/b":                         404,
		} {
			res, body := c.get(path)
			if res.StatusCode != status {
				t.Errorf("GET %s: %d, want %d\n%s", path, res.StatusCode, status, body)
			}
			noStackTrace(t, body)
		}
		res, body := c.post("/outbox/events", url.Values{})
		if res.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST to a page: %d", res.StatusCode)
		}
		noStackTrace(t, body)

		// Forms it cannot use, from a user with a valid token.
		c.user, c.pass = "ops", "pw"
		_, page := c.get("/outbox/dead")
		token := csrfOf(t, page)
		for _, form := range []url.Values{
			{"op": {"explode"}, "scope": {"ids"}, "ids": {"x"}},
			{"op": {"requeue"}, "scope": {"everything"}},
			{"op": {"requeue"}, "scope": {"ids"}},
			{"op": {"requeue"}, "scope": {"group"}, "error": {"x"}},
			{"op": {"requeue"}, "scope": {"group"}, "type": {"Order_create"}},
			{"op": {"requeue"}, "scope": {"ids"}, "ids": make([]string, 0)},
		} {
			form.Set("csrf", token)
			res, body := c.post("/outbox/action", form)
			if res.StatusCode != http.StatusBadRequest {
				t.Errorf("POST %v: %d, want 400\n%s", form, res.StatusCode, body)
			}
			noStackTrace(t, body)
		}
		big := url.Values{"op": {"requeue"}, "scope": {"ids"}, "csrf": {token}}
		for i := 0; i < 1001; i++ {
			big.Add("ids", "id")
		}
		if res, _ := c.post("/outbox/action", big); res.StatusCode != http.StatusBadRequest {
			t.Errorf("1001 ids: %d, want 400", res.StatusCode)
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/outbox/action", strings.NewReader("%%%&&&=;"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if res, body := c.do(req); res.StatusCode != http.StatusBadRequest && res.StatusCode != http.StatusForbidden {
			t.Errorf("unparsable body: %d\n%s", res.StatusCode, body)
		}
	})
}

// Mutations: refused when the console is read-only, without credentials, without the CSRF token or
// cross-origin; behind a confirmation; logged with their user; and they change exactly what they
// name.
func TestMutations(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)

		ro, _ := serve(t, d)
		if res, body := newClient(t, ro.URL).post("/outbox/action", url.Values{"op": {"requeue"}, "scope": {"ids"}, "ids": {f.deadA1}}); res.StatusCode != http.StatusForbidden {
			t.Errorf("read-only console: POST answered %d\n%s", res.StatusCode, body)
		}

		srv, logs := serve(t, d, outboxui.WithWrites(outboxui.BasicAuth(map[string]string{"alice": "s3cret-pw"})))
		c := newClient(t, srv.URL)
		_, page := c.get("/outbox/dead") // reads need no user: only mutations do
		token := csrfOf(t, page)
		requeueA1 := url.Values{"op": {"requeue"}, "scope": {"ids"}, "ids": {f.deadA1}, "csrf": {token}, "confirm": {"yes"}, "back": {"/outbox/dead"}}

		res, _ := c.post("/outbox/action", requeueA1)
		if res.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Basic") {
			t.Errorf("without credentials: %d %q", res.StatusCode, res.Header.Get("WWW-Authenticate"))
		}
		c.user, c.pass = "alice", "wrong"
		if res, _ := c.post("/outbox/action", requeueA1); res.StatusCode != http.StatusUnauthorized {
			t.Errorf("wrong password: %d", res.StatusCode)
		}
		c.user, c.pass = "alice", "s3cret-pw"
		noToken := cloneForm(requeueA1)
		noToken.Del("csrf")
		if res, _ := c.post("/outbox/action", noToken); res.StatusCode != http.StatusForbidden {
			t.Errorf("without the CSRF token: %d", res.StatusCode)
		}
		otherToken := cloneForm(requeueA1)
		otherToken.Set("csrf", strings.Repeat("A", 43))
		if res, _ := c.post("/outbox/action", otherToken); res.StatusCode != http.StatusForbidden {
			t.Errorf("with a forged CSRF token: %d", res.StatusCode)
		}
		fresh := newClient(t, srv.URL) // another browser: the token is not its cookie's
		fresh.user, fresh.pass = c.user, c.pass
		if res, _ := fresh.post("/outbox/action", requeueA1); res.StatusCode != http.StatusForbidden {
			t.Errorf("a token without its cookie: %d", res.StatusCode)
		}
		if res, _ := c.post("/outbox/action", requeueA1, "Sec-Fetch-Site", "cross-site"); res.StatusCode != http.StatusForbidden {
			t.Errorf("cross-site: %d", res.StatusCode)
		}
		if got := stateOf(t, d, f.deadA1); got != outboxplugin.StateDead {
			t.Fatalf("a refused mutation changed the event: %s", got)
		}

		// The confirmation, then the change.
		ask := cloneForm(requeueA1)
		ask.Del("confirm")
		res, body := c.post("/outbox/action", ask)
		wantStatus(t, res, body, http.StatusOK)
		if !strings.Contains(body, "Yes, requeue") || !strings.Contains(body, f.deadA1) || !strings.Contains(body, "· alice") {
			t.Errorf("confirmation page:\n%s", body)
		}
		if got := stateOf(t, d, f.deadA1); got != outboxplugin.StateDead {
			t.Fatalf("asking for a confirmation changed the event: %s", got)
		}
		res, body = c.post("/outbox/action", requeueA1)
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/outbox/dead?done=requeue&n=1" {
			t.Fatalf("confirmed requeue: %d to %q\n%s", res.StatusCode, res.Header.Get("Location"), body)
		}
		if got := stateOf(t, d, f.deadA1); got != outboxplugin.StateDue {
			t.Errorf("requeued event is %s, want due", got)
		}
		if got := stateOf(t, d, f.deadA2); got != outboxplugin.StateDead {
			t.Errorf("the other event of the group is %s, want dead", got)
		}
		_, body = c.get(res.Header.Get("Location"))
		if !strings.Contains(body, "Requeued 1 event") {
			t.Error("the page after the requeue does not say so")
		}
		if l := logs.String(); !strings.Contains(l, "outboxui: requeue") || !strings.Contains(l, "user=alice") || !strings.Contains(l, f.deadA1) {
			t.Errorf("the requeue is not logged with its user:\n%s", l)
		}

		// One event's own button, in a form of selected ones: that event only.
		one := url.Values{"one": {"discard " + f.deadB}, "scope": {"ids"}, "ids": {f.deadA2}, "csrf": {token}, "confirm": {"yes"}}
		res, _ = c.post("/outbox/action", one)
		if res.StatusCode != http.StatusSeeOther {
			t.Fatalf("discard one: %d", res.StatusCode)
		}
		if stateOf(t, d, f.deadB) != "" || stateOf(t, d, f.deadA2) != outboxplugin.StateDead {
			t.Error("the discard button of one event did not discard that one only")
		}

		// A whole group, by type and error.
		group := url.Values{"op": {"requeue"}, "scope": {"group"}, "type": {f.orderType}, "error": {"broker said no: 503"}, "csrf": {token}}
		res, body = c.post("/outbox/action", group)
		wantStatus(t, res, body, http.StatusOK)
		if !strings.Contains(body, "(1 now)") {
			t.Errorf("the group's confirmation does not count it:\n%s", body)
		}
		group.Set("confirm", "yes")
		if res, _ = c.post("/outbox/action", group); res.StatusCode != http.StatusSeeOther {
			t.Fatalf("group requeue: %d", res.StatusCode)
		}
		if got := stateOf(t, d, f.deadA2); got != outboxplugin.StateDue {
			t.Errorf("group requeue left %s", got)
		}

		// Another site as the place to go back to: the console's own page instead.
		evil := url.Values{"op": {"requeue"}, "scope": {"ids"}, "ids": {f.waiting}, "csrf": {token}, "confirm": {"yes"}, "back": {"//evil.example/x"}}
		res, _ = c.post("/outbox/action", evil)
		if loc := res.Header.Get("Location"); !strings.HasPrefix(loc, "/outbox/dead?") {
			t.Errorf("back to another site: redirected to %q", loc)
		}
	})
}

func cloneForm(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

func TestReadAuthHidePayloadsAndBasePath(t *testing.T) {
	d := newSQLite(t)
	f := addFixture(t, d)
	srv, _ := serve(t, d, outboxui.WithReadAuth(outboxui.BearerToken(map[string]string{"tok-123": "grafana"})), outboxui.WithHidePayloads())
	c := newClient(t, srv.URL)
	res, body := c.get("/outbox/")
	if res.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer ") {
		t.Errorf("read auth: GET without a token answered %d, challenge %q", res.StatusCode, res.Header.Get("WWW-Authenticate"))
	}
	noStackTrace(t, body)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/outbox/events/"+f.deadB, nil)
	req.Header.Set("Authorization", "Bearer tok-123")
	res, body = c.do(req)
	wantStatus(t, res, body, http.StatusOK)
	if strings.Contains(body, "card declined") || !strings.Contains(body, `data-field="payload-hidden"`) {
		t.Errorf("hidden payloads: the page shows the payload:\n%s", body)
	}
	if !strings.Contains(body, `href="/outbox/dead"`) {
		t.Error("links do not start at the mount path /outbox/")
	}
	if !strings.Contains(body, "· grafana") {
		t.Error("the page does not name its user")
	}

	// The application's own Authenticator: a 401 without a challenge of ours.
	own, _ := serve(t, d, outboxui.WithReadAuth(func(*http.Request) (string, error) { return "", errors.New("no session") }))
	res, _ = newClient(t, own.URL).get("/outbox/")
	if res.StatusCode != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") != "" {
		t.Errorf("own authenticator: %d, challenge %q", res.StatusCode, res.Header.Get("WWW-Authenticate"))
	}

	// WithBasePath for routers other than ServeMux; bad options.
	admin, err := outboxplugin.NewAdmin(d.db)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []outboxui.Option{outboxui.WithWrites(nil), outboxui.WithReadAuth(nil), outboxui.WithBasePath("outbox"),
		outboxui.WithBasePath("/a b/"), outboxui.WithRefresh(-1), outboxui.WithCSRFKey([]byte("short")), outboxui.WithLogger(nil), outboxui.WithTitle(" ")} {
		if _, err := outboxui.New(admin, bad); !errors.Is(err, outboxui.ErrInvalidOption) {
			t.Errorf("bad option: %v", err)
		}
	}
	if _, err := outboxui.New(nil); !errors.Is(err, outboxui.ErrInvalidOption) {
		t.Errorf("nil admin: %v", err)
	}
	h, err := outboxui.New(admin, outboxui.WithBasePath("/ops/outbox"))
	if err != nil {
		t.Fatal(err)
	}
	srv2 := newTestServer(t, http.StripPrefix("", h))
	res, body = newClient(t, srv2).get("/ops/outbox/events")
	wantStatus(t, res, body, http.StatusOK)
	if !strings.Contains(body, `href="/ops/outbox/dead"`) {
		t.Error("WithBasePath: links do not start at it")
	}
}
