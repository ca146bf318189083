package outboxui_test

import (
	"net/url"
	"strings"
	"testing"

	outboxui "github.com/gorm-outbox/outboxplugin/ui"
)

// Bad input is the client's: every route answers it with 400 or 404 and a page of the console,
// never a 500, whatever the database makes of it (PostgreSQL refuses NUL bytes and invalid UTF-8 in
// text). Each path parameter and query parameter of the pages gets each bad value.
func TestBadValuesNever500(t *testing.T) {
	bad := []string{
		"\x00", "a\x00b", "\xff", "\xc3\x28", "\xed\xa0\x80", // NUL, invalid UTF-8, a surrogate
		strings.Repeat("x", 5000), "%", "../..", "'; DROP TABLE outbox_events; --", "\t", " ",
		"-1", "0", "99999999999999999999", "1e9", "NaN",
	}
	forEachDB(t, func(t *testing.T, d *testDB) {
		addFixture(t, d)
		srv, logs := serve(t, d, outboxui.WithWrites(outboxui.BasicAuth(map[string]string{"ops": "pw"})))
		c := newClient(t, srv.URL)
		var paths []string
		for _, v := range bad {
			paths = append(paths, "/outbox/events/"+url.PathEscape(v))
			for _, k := range []string{"state", "type", "aggregate_type", "id", "since", "until", "order", "limit", "cursor"} {
				q := url.Values{k: {v}}
				if k == "aggregate_type" {
					q.Set("aggregate_id", v)
				}
				paths = append(paths, "/outbox/events?"+q.Encode())
			}
			for _, k := range []string{"type", "error", "cursor"} {
				q := url.Values{"type": {"Order_create"}, k: {v}}
				paths = append(paths, "/outbox/dead?"+q.Encode(), "/outbox/?"+q.Encode())
			}
			q := url.Values{"done": {v}, "n": {v}}
			paths = append(paths, "/outbox/dead?"+q.Encode())
		}
		for _, p := range paths {
			res, body := c.get(p)
			if res.StatusCode >= 500 {
				t.Errorf("GET %s: %d\n%s", p, res.StatusCode, body)
				continue
			}
			noStackTrace(t, body)
			if res.StatusCode >= 400 && !strings.Contains(body, "<html") {
				t.Errorf("GET %s: %d without a page of the console:\n%s", p, res.StatusCode, body)
			}
		}
		// The forms of the mutations, asked and confirmed, with each bad value where a form has text.
		c.user, c.pass = "ops", "pw"
		_, page := c.get("/outbox/dead")
		token := csrfOf(t, page)
		for _, v := range bad {
			for _, form := range []url.Values{
				{"op": {"requeue"}, "scope": {"ids"}, "ids": {v}},
				{"op": {"discard"}, "scope": {"ids"}, "ids": {v}},
				{"op": {"deliver-now"}, "scope": {"ids"}, "ids": {v}},
				{"one": {"requeue " + v}, "scope": {"ids"}},
				{"op": {"requeue"}, "scope": {"group"}, "type": {v}, "error": {"broker said no: 503"}},
				{"op": {"discard"}, "scope": {"group"}, "type": {"Order_create"}, "error": {v}},
				{"op": {"requeue"}, "scope": {"cause"}, "error": {v}},
				{"op": {"requeue"}, "scope": {"ids"}, "ids": {"x"}, "back": {v}},
			} {
				for _, confirm := range []string{"", "yes"} {
					form.Set("csrf", token)
					form.Set("confirm", confirm)
					res, body := c.post("/outbox/action", form)
					if res.StatusCode >= 500 {
						t.Errorf("POST %v: %d\n%s", form, res.StatusCode, body)
					}
					noStackTrace(t, body)
				}
			}
		}
		if strings.Contains(logs.String(), "level=ERROR") {
			t.Errorf("bad input logged as an error:\n%s", logs.String())
		}
	})
}
