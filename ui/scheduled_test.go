package outboxui_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	outboxui "github.com/gorm-outbox/outboxplugin/ui"
)

// addReminder writes a Reminder event delayed by a day, and returns its message id.
func addReminder(t *testing.T, d *testDB) string {
	t.Helper()
	if err := d.db.Transaction(func(tx *gorm.DB) error {
		return outboxplugin.Emit(tx, "Reminder", map[string]int{"order": 2}, outboxplugin.DeliverAfter(24*time.Hour))
	}); err != nil {
		t.Fatal(err)
	}
	var e outboxplugin.OutboxEvent
	if err := d.db.Session(&gorm.Session{NewDB: true}).Order("id DESC").First(&e).Error; err != nil {
		t.Fatal(err)
	}
	return e.MessageID
}

// A delayed event whose time has not come is scheduled on every page: counted apart, listed under
// its own state, shown with its time; no requeue button shows for it and a requeue leaves it; its
// Deliver now button, behind the same writes, CSRF token and confirmation as a requeue, makes it due.
func TestScheduledEventsInTheConsole(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		sched := addReminder(t, d)
		at := eventOf(t, d, sched).NextAttemptAt

		ro, _ := serve(t, d)
		rc := newClient(t, ro.URL)
		res, body := rc.get("/outbox/")
		wantStatus(t, res, body, http.StatusOK)
		for _, want := range []string{`data-count="scheduled">1<`, `data-count="pending">2<`, `data-count="waiting">1<`,
			`href="/outbox/events?state=scheduled"`, `href="/outbox/events?state=scheduled&amp;type=Reminder">1<`} {
			if !strings.Contains(body, want) {
				t.Errorf("overview has no %s", want)
			}
		}
		rowRE := regexp.MustCompile(`data-message-id="([^"]+)" data-state="([a-z]+)"`)
		rows := func(body string) map[string]string {
			out := map[string]string{}
			for _, m := range rowRE.FindAllStringSubmatch(body, -1) {
				out[m[1]] = m[2]
			}
			return out
		}
		_, body = rc.get("/outbox/events?state=scheduled")
		if got := rows(body); len(got) != 1 || got[sched] != "scheduled" {
			t.Errorf("state=scheduled lists %v", got)
		}
		_, body = rc.get("/outbox/events?state=waiting")
		if got := rows(body); len(got) != 1 || got[f.waiting] != "waiting" {
			t.Errorf("state=waiting lists %v", got)
		}
		if _, body = rc.get("/outbox/events"); !strings.Contains(body, `<option value="scheduled"`) {
			t.Error("the state filter offers no scheduled")
		}
		res, body = rc.get("/outbox/events/" + sched)
		wantStatus(t, res, body, http.StatusOK)
		if !strings.Contains(body, `data-field="state">scheduled<`) || !strings.Contains(body, "<dt>Scheduled for</dt>") {
			t.Errorf("event page of a scheduled event:\n%s", body)
		}
		if strings.Contains(body, `value="deliver-now"`) {
			t.Error("a read-only console shows Deliver now")
		}
		if res, body := rc.post("/outbox/action", url.Values{"op": {"deliver-now"}, "scope": {"ids"}, "ids": {sched}}); res.StatusCode != http.StatusForbidden {
			t.Errorf("read-only console: deliver-now answered %d\n%s", res.StatusCode, body)
		}

		srv, logs := serve(t, d, outboxui.WithWrites(outboxui.BasicAuth(map[string]string{"alice": "s3cret-pw"})))
		c := newClient(t, srv.URL)
		c.user, c.pass = "alice", "s3cret-pw"
		_, body = c.get("/outbox/events/" + sched)
		token := csrfOf(t, body)
		if strings.Contains(body, `value="requeue"`) || !strings.Contains(body, `name="op" value="deliver-now">Deliver now<`) {
			t.Errorf("event page of a scheduled event, writes on: want Deliver now and no Requeue\n%s", body)
		}
		_, body = c.get("/outbox/events")
		if strings.Contains(body, `value="requeue `+sched+`"`) || !strings.Contains(body, `value="deliver-now `+sched+`"`) {
			t.Error("the list shows Requeue, or no Deliver now, for the scheduled event")
		}
		if !strings.Contains(body, `value="requeue `+f.waiting+`"`) || strings.Contains(body, `value="deliver-now `+f.waiting+`"`) {
			t.Error("the list shows no Requeue, or a Deliver now, for the waiting retry")
		}

		// A requeue of both (a selection): the waiting retry only.
		res, _ = c.post("/outbox/action", url.Values{"op": {"requeue"}, "scope": {"ids"}, "ids": {sched, f.waiting}, "csrf": {token}, "confirm": {"yes"}, "back": {"/outbox/events"}})
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/outbox/events?done=requeue&n=1" {
			t.Fatalf("requeue: %d to %q", res.StatusCode, res.Header.Get("Location"))
		}
		e := eventOf(t, d, sched)
		if e.State != outboxplugin.StateScheduled || e.NextAttemptAt == nil || !e.NextAttemptAt.Equal(*at) {
			t.Errorf("the requeue moved the scheduled event: %s, %v (was %v)", e.State, e.NextAttemptAt, at)
		}
		if got := stateOf(t, d, f.waiting); got != outboxplugin.StateDue {
			t.Errorf("the waiting retry is %s after its requeue, want due", got)
		}

		// Deliver now: refused without the token, a group, then asked, then done.
		deliver := url.Values{"one": {"deliver-now " + sched}, "scope": {"ids"}, "csrf": {token}, "back": {"/outbox/events"}}
		noToken := cloneForm(deliver)
		noToken.Del("csrf")
		if res, _ := c.post("/outbox/action", noToken); res.StatusCode != http.StatusForbidden {
			t.Errorf("deliver-now without the CSRF token: %d", res.StatusCode)
		}
		res, body = c.post("/outbox/action", url.Values{"op": {"deliver-now"}, "scope": {"group"}, "type": {"Reminder"}, "error": {"x"}, "csrf": {token}, "confirm": {"yes"}})
		wantStatus(t, res, body, http.StatusBadRequest)
		res, body = c.post("/outbox/action", deliver)
		wantStatus(t, res, body, http.StatusOK)
		if !strings.Contains(body, "Deliver now?") || !strings.Contains(body, "Yes, deliver now") || !strings.Contains(body, sched) {
			t.Errorf("confirmation page:\n%s", body)
		}
		if got := stateOf(t, d, sched); got != outboxplugin.StateScheduled {
			t.Fatalf("asking for a confirmation changed the event: %s", got)
		}
		deliver.Set("confirm", "yes")
		res, _ = c.post("/outbox/action", deliver)
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/outbox/events?done=deliver-now&n=1" {
			t.Fatalf("deliver-now: %d to %q", res.StatusCode, res.Header.Get("Location"))
		}
		if e := eventOf(t, d, sched); e.State != outboxplugin.StateDue || e.NextAttemptAt != nil {
			t.Errorf("after deliver-now: %s, %v", e.State, e.NextAttemptAt)
		}
		if _, body = c.get(res.Header.Get("Location")); !strings.Contains(body, "Made 1 scheduled event due now") {
			t.Error("the page after deliver-now does not say so")
		}
		if l := logs.String(); !strings.Contains(l, "outboxui: deliver-now") || !strings.Contains(l, "user=alice") || !strings.Contains(l, sched) {
			t.Errorf("deliver-now is not logged with its user:\n%s", l)
		}
		// Deliver now of a failed event: nothing.
		res, _ = c.post("/outbox/action", url.Values{"op": {"deliver-now"}, "scope": {"ids"}, "ids": {f.deadB}, "csrf": {token}, "confirm": {"yes"}})
		if loc := res.Header.Get("Location"); !strings.HasSuffix(loc, "done=deliver-now&n=0") || stateOf(t, d, f.deadB) != outboxplugin.StateDead {
			t.Errorf("deliver-now of a dead event: %q, %s", loc, stateOf(t, d, f.deadB))
		}
	})
}

// A scheduled event delivered now through its event page's button, confirmed, is published by a
// running worker, which had left it alone before.
func TestBrowserDeliverNowIsPublished(t *testing.T) {
	needChromium(t) // before the databases are made
	forEachDB(t, func(t *testing.T, d *testDB) {
		addFixture(t, d)
		sched := addReminder(t, d)
		srv, _ := serve(t, d, outboxui.WithWrites(outboxui.BasicAuth(map[string]string{"oncall": "s3cret-pw"})))

		var mu sync.Mutex
		published := map[string]bool{}
		batches := 0
		w, err := outboxplugin.NewWorker(d.db, outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			defer mu.Unlock()
			batches++
			for _, m := range msgs {
				published[m.ID] = true
			}
			return nil
		}), outboxplugin.WithPollInterval(100*time.Millisecond), outboxplugin.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(context.Background())
		stopped := make(chan error, 1)
		go func() { stopped <- w.Run(runCtx) }()
		t.Cleanup(func() {
			stop()
			if err := <-stopped; err != nil {
				t.Errorf("worker: %v", err)
			}
		})
		b := newBrowser(t)
		b.waitFor("the worker publishes the due event", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return batches > 0
		})
		mu.Lock()
		early := published[sched]
		mu.Unlock()
		if early {
			t.Fatal("the scheduled event was published before its time")
		}

		b.setCredentials("oncall", "s3cret-pw")
		base := srv.URL + "/outbox/"
		b.open(base + "events/" + sched)
		if got := b.text(`[data-field=state]`); got != "scheduled" {
			t.Errorf("state %q", got)
		}
		if n := evaluate[int](b, `document.querySelectorAll("button[value=requeue]").length`); n != 0 {
			t.Errorf("the scheduled event's page shows %d requeue buttons", n)
		}
		b.screenshot("event-scheduled")
		if status := b.click(`button[value="deliver-now"]`); status != 200 {
			t.Fatalf("deliver now button: %d", status)
		}
		if h := b.text("h1"); h != "Deliver now?" {
			t.Errorf("confirmation page: %q", h)
		}
		if status := b.click(`form.confirm button[type=submit]`); status != 200 {
			t.Fatalf("confirm: %d", status)
		}
		if got := b.text(".notice"); !strings.HasPrefix(got, "Made 1 scheduled event due now:") {
			t.Errorf("notice after deliver-now: %q", got)
		}
		b.waitFor("the worker publishes "+sched, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return published[sched]
		})
		b.noConsoleErrors()
	})
}
