package outboxui_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	outboxui "github.com/gorm-outbox/outboxplugin/ui"
)

// addDead writes an event of eventType and makes it dead with text, and returns its message id.
func addDead(t *testing.T, d *testDB, eventType, text string) string {
	t.Helper()
	if err := d.db.Transaction(func(tx *gorm.DB) error {
		return outboxplugin.Emit(tx, eventType, map[string]int{"n": 1})
	}); err != nil {
		t.Fatal(err)
	}
	var e outboxplugin.OutboxEvent
	plain := d.db.Session(&gorm.Session{NewDB: true})
	if err := plain.Order("id DESC").First(&e).Error; err != nil {
		t.Fatal(err)
	}
	if err := plain.Model(&outboxplugin.OutboxEvent{}).Where("id = ?", e.ID).
		Updates(map[string]any{"dead_at": time.Now().UTC(), "attempts": 8, "last_error": text}).Error; err != nil {
		t.Fatal(err)
	}
	return e.MessageID
}

var causeRowRE = regexp.MustCompile(`(?s)<tr data-cause="([^"]*)">.*?data-types>(\d+)</td>\s*<td class="n">(\d+)</td>`)

// The dead page groups by error alone by default: one cause over several event types is one row, and
// its Requeue button, confirmed, requeues all of it in one go and nothing else. The per-type view
// stays a link away.
func TestDeadEventsByCause(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d) // deadA1, deadA2: orderType, "broker said no: 503"; deadB: PaymentFailed, "payload too large"
		const cause = "broker said no: 503"
		shipment := addDead(t, d, "ShipmentFailed", cause)
		reminder := addReminder(t, d)
		srv, logs := serve(t, d, outboxui.WithWrites(outboxui.BasicAuth(map[string]string{"alice": "pw"})))
		c := newClient(t, srv.URL)

		res, body := c.get("/outbox/dead")
		wantStatus(t, res, body, http.StatusOK)
		got := map[string]string{}
		for _, m := range causeRowRE.FindAllStringSubmatch(body, -1) {
			got[m[1]] = m[2] + " types, " + m[3] + " events"
		}
		if want := map[string]string{cause: "2 types, 3 events", "payload too large": "1 types, 1 events"}; len(got) != 2 ||
			got[cause] != want[cause] || got["payload too large"] != want["payload too large"] {
			t.Errorf("causes %v, want %v\n%s", got, want, body)
		}
		if !strings.Contains(body, `data-group-by="error"`) || !strings.Contains(body, `href="/outbox/dead?by=type"`) {
			t.Errorf("the dead page does not say it groups by error, or has no link to the per-type view:\n%s", body)
		}
		if i, j := strings.Index(body, `data-cause="`+cause), strings.Index(body, `data-cause="payload too large`); i < 0 || i > j {
			t.Error("the larger cause is not first")
		}

		res, body = c.get("/outbox/dead?by=type")
		wantStatus(t, res, body, http.StatusOK)
		if n := strings.Count(body, "<tr data-group-type="); n != 3 || strings.Contains(body, "data-cause=") {
			t.Errorf("by type: %d groups, want 3\n%s", n, body)
		}

		// One cause's events, of every type.
		res, body = c.get("/outbox/dead?" + url.Values{"error": {cause}}.Encode())
		wantStatus(t, res, body, http.StatusOK)
		for _, id := range []string{f.deadA1, f.deadA2, shipment} {
			if !strings.Contains(body, `data-message-id="`+id) {
				t.Errorf("the cause's list lacks %s", id)
			}
		}
		if strings.Contains(body, `data-message-id="`+f.deadB) || !strings.Contains(body, "Every event type: "+cause) {
			t.Errorf("the cause's list:\n%s", body)
		}

		// Requeue the whole cause: a confirmation that counts it, then one requeue.
		c.user, c.pass = "alice", "pw"
		_, page := c.get("/outbox/dead")
		form := url.Values{"op": {"requeue"}, "scope": {"cause"}, "error": {cause}, "csrf": {csrfOf(t, page)}, "back": {"/outbox/dead"}}
		res, body = c.post("/outbox/action", form)
		wantStatus(t, res, body, http.StatusOK)
		if !strings.Contains(body, "Every dead event, of every event type, that failed with") || !strings.Contains(body, "(3 now, of 2 event types)") {
			t.Errorf("the cause's confirmation:\n%s", body)
		}
		if st := stateOf(t, d, f.deadA1); st != outboxplugin.StateDead {
			t.Fatalf("the confirmation page changed an event: %s", st)
		}
		form.Set("confirm", "yes")
		res, _ = c.post("/outbox/action", form)
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/outbox/dead?done=requeue&n=3" {
			t.Fatalf("requeue of the cause: %d, Location %q", res.StatusCode, res.Header.Get("Location"))
		}
		for id, want := range map[string]outboxplugin.EventState{
			f.deadA1: outboxplugin.StateDue, f.deadA2: outboxplugin.StateDue, shipment: outboxplugin.StateDue,
			f.deadB: outboxplugin.StateDead, f.waiting: outboxplugin.StateWaiting, reminder: outboxplugin.StateScheduled,
		} {
			if st := stateOf(t, d, id); st != want {
				t.Errorf("after the requeue of the cause, %s is %s, want %s", id, st, want)
			}
		}
		if l := logs.String(); !strings.Contains(l, "outboxui: requeue") || !strings.Contains(l, "scope=cause") || !strings.Contains(l, "events=3") {
			t.Errorf("the cause's requeue is not logged:\n%s", l)
		}

		for _, bad := range []url.Values{
			{"op": {"requeue"}, "scope": {"cause"}},                                     // no error text
			{"op": {"deliver-now"}, "scope": {"cause"}, "error": {"payload too large"}}, // dead events are not scheduled
		} {
			bad.Set("csrf", form.Get("csrf"))
			if res, body := c.post("/outbox/action", bad); res.StatusCode != http.StatusBadRequest {
				t.Errorf("POST %v: %d, want 400\n%s", bad, res.StatusCode, body)
			}
		}
		if res, body := c.get("/outbox/dead?by=sideways"); res.StatusCode != http.StatusBadRequest {
			t.Errorf("?by=sideways: %d, want 400\n%s", res.StatusCode, body)
		}
	})
}
