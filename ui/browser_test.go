package outboxui_test

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/gorm-outbox/outboxplugin"
	outboxui "github.com/gorm-outbox/outboxplugin/ui"
)

// The browser tests drive the console in headless Chromium (Debian's package), as an operator
// would: they read the pages, fill and submit the filter form, click the buttons, and save a
// screenshot of every page into the test's artifact directory:
//
//	go test -run Browser -artifacts -outputdir /tmp/outboxui .
//
// keeps them under /tmp/outboxui/_artifacts/ (docs/ui.md shows them). Without Chromium the tests
// skip, unless OUTBOX_REQUIRE_BROWSER=1 makes that a failure (as CI does).

const chromiumPath = "/usr/bin/chromium"

// browserTestTimeout bounds each test's browser, and with it every wait of the test: the browser
// is started under it, so when it ends every action fails.
const browserTestTimeout = 60 * time.Second

// The laptop window of every screenshot, and the phone of one.
const (
	laptopWidth, laptopHeight = 1280, 900
	phoneWidth, phoneHeight   = 390, 844
)

// browser is one test's headless Chromium, with one tab.
type browser struct {
	t   *testing.T
	ctx context.Context // the tab's; it ends at browserTestTimeout

	mu      sync.Mutex
	console []chromedp.ConsoleMessage // what the pages logged
}

// needChromium skips t when Chromium is not installed, or fails it with OUTBOX_REQUIRE_BROWSER=1.
func needChromium(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("OUTBOX_REQUIRE_BROWSER") == "1" {
			t.Fatalf("Chromium is missing and OUTBOX_REQUIRE_BROWSER=1: %v", err)
		}
		t.Skipf("Chromium is missing (apt-get install chromium): %v", err)
	}
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	needChromium(t)
	profile := t.TempDir() // before the cleanup below, so removed after the browser has exited
	bounded, cancelBound := context.WithTimeout(context.Background(), browserTestTimeout)
	// The machine may have no network: without these flags Chromium's own background connections
	// (updates, sync, QUIC probes) fail and log noisily.
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(laptopWidth, laptopHeight),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(bounded, opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	b := &browser{t: t, ctx: ctx}
	t.Cleanup(func() {
		if err := chromedp.Cancel(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			t.Logf("closing Chromium: %v", err)
		}
		cancelTab()
		cancelAlloc() // waits for the browser process to exit
		cancelBound()
	})
	// The first action starts the browser.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(laptopWidth, laptopHeight)); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return // the tab is closing
			}
			b.mu.Lock()
			b.console = append(b.console, m)
			b.mu.Unlock()
		}
	}()
	return b
}

// open loads url and returns the status of its response.
func (b *browser) open(url string) int64 {
	b.t.Helper()
	res, err := chromedp.Run(b.ctx, chromedp.NavigateResponse(url))
	if err != nil {
		b.t.Fatalf("open %s: %v", url, err)
	}
	return res.Status
}

// click clicks the element sel selects (a button of a form, a link), waits for the page it loads and
// returns the status of its response.
func (b *browser) click(sel string) int64 {
	b.t.Helper()
	res, err := chromedp.RunResponse(b.ctx, chromedp.Click(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("click %s: %v", sel, err)
	}
	return res.Status
}

func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// text is the text of the first element sel selects, as a person reads it.
func (b *browser) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

func (b *browser) location() string {
	b.t.Helper()
	loc, err := chromedp.Run(b.ctx, chromedp.Location())
	if err != nil {
		b.t.Fatal(err)
	}
	return loc
}

// evaluate runs a JavaScript expression in the page and returns its value.
func evaluate[T any](b *browser, expression string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expression))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expression, err)
	}
	return v
}

// rows is the message ids of the event table's rows, in the page's order.
func (b *browser) rows() []string {
	b.t.Helper()
	return evaluate[[]string](b, `[...document.querySelectorAll("tr[data-message-id]")].map(r => r.dataset.messageId)`)
}

// setCredentials makes every request of the tab carry basic authentication as user, or none when
// user is "".
func (b *browser) setCredentials(user, password string) {
	b.t.Helper()
	h := network.Headers{}
	if user != "" {
		h["Authorization"] = "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
	}
	if _, err := chromedp.Call(b.ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: h}); err != nil {
		b.t.Fatalf("set the Authorization header: %v", err)
	}
}

// dismissAuthPrompts answers the browser's prompt for a user and password (the console's 401
// carries a Basic challenge) as a person without credentials does, with Cancel, after which the
// browser shows the 401 page. Headless Chromium has no prompt: without an answer the load fails
// with ERR_INVALID_AUTH_CREDENTIALS. Only the console's POSTs are intercepted.
func (b *browser) dismissAuthPrompts(actionURL string) {
	b.t.Helper()
	paused := chromedp.Events(b.ctx, fetch.RequestPaused)
	challenged := chromedp.Events(b.ctx, fetch.AuthRequired)
	go func() { // the goroutines end with the tab, when the test cleans up
		for ev, err := range paused {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(b.ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
		}
	}()
	go func() {
		for ev, err := range challenged {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(b.ctx, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: ev.RequestID,
				AuthChallengeResponse: &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseCancelAuth}})
		}
	}()
	if _, err := chromedp.Call(b.ctx, fetch.Enable, fetch.EnableParams{
		Patterns: []*fetch.RequestPattern{{URLPattern: actionURL}}, HandleAuthRequests: new(true)}); err != nil {
		b.t.Fatalf("intercept the authentication prompts: %v", err)
	}
}

// pageProblems lists what is wrong with the page as a person (or a screen reader) meets it: a page
// wider than the window, the stylesheet not applied, form fields without a label, buttons and links
// without a name, not one h1, two columns of a table with one name, duplicate ids.
const pageProblems = `(() => {
  const p = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) p.push("the page is " + root.scrollWidth + " px wide in a window of " + root.clientWidth);
  // The header's background (#24292f) comes from console.css only.
  if (getComputedStyle(document.querySelector("header")).backgroundColor !== "rgb(36, 41, 47)") p.push("console.css is not applied");
  if (!root.lang) p.push("no lang on html");
  if (document.querySelectorAll("h1").length !== 1) p.push(document.querySelectorAll("h1").length + " h1 headings");
  for (const e of document.querySelectorAll("input:not([type=hidden]), select, textarea")) {
    if (!e.labels.length && !e.getAttribute("aria-label")) p.push("a field without a label: " + e.outerHTML);
  }
  for (const e of document.querySelectorAll("button, a[href]")) {
    if (!(e.innerText || e.getAttribute("aria-label") || "").trim()) p.push("no accessible name: " + e.outerHTML);
  }
  for (const tr of document.querySelectorAll("thead tr")) {
    const names = [...tr.children].map(th => th.innerText.trim()).filter(n => n);
    for (const n of new Set(names)) if (names.indexOf(n) !== names.lastIndexOf(n)) p.push("two columns named " + n);
  }
  const ids = [...document.querySelectorAll("[id]")].map(e => e.id);
  for (const id of new Set(ids)) if (ids.indexOf(id) !== ids.lastIndexOf(id)) p.push("duplicate id " + id);
  return p;
})()`

// screenshot checks the page for pageProblems and saves a full-page PNG of it as name.png in the
// test's artifact directory.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	for _, p := range evaluate[[]string](b, pageProblems) {
		b.t.Errorf("%s (%s): %s", name, b.location(), p)
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(b.t.ArtifactDir(), name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s: %s", name, path)
}

// noConsoleErrors fails the test for what the pages logged that a person would not see: a script
// error, a resource refused by the Content-Security-Policy, a broken link to an asset. Refused
// requests the test makes on purpose (401, 403) are expected.
func (b *browser) noConsoleErrors(expected ...string) {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.console {
		if m.Type != chromedp.ConsoleException && m.Type != "error" {
			continue
		}
		if slices.ContainsFunc(expected, func(s string) bool { return strings.Contains(m.Text, s) }) {
			continue
		}
		b.t.Errorf("the page logged %s: %s (%s)", m.Type, m.Text, m.URL)
	}
}

// waitFor polls cond until it holds, or fails the test when the browser's time is up. It measures
// no duration: a slow machine waits longer, and only a condition that never holds fails.
func (b *browser) waitFor(what string, cond func() bool) {
	b.t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("%s: not before the test's deadline", what)
		case <-tick.C:
		}
	}
}

func eventOf(t *testing.T, d *testDB, messageID string) outboxplugin.EventInfo {
	t.Helper()
	admin, err := outboxplugin.NewAdmin(d.db)
	if err != nil {
		t.Fatal(err)
	}
	e, err := admin.Event(context.Background(), messageID)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// sameDeadEvent fails t when after, the event as a refused mutation left it, is not the dead event
// before was.
func sameDeadEvent(t *testing.T, before, after outboxplugin.EventInfo) {
	t.Helper()
	if after.State != outboxplugin.StateDead || after.Attempts != before.Attempts || after.LastError != before.LastError ||
		after.DeadAt == nil || before.DeadAt == nil || !after.DeadAt.Equal(*before.DeadAt) {
		t.Errorf("a refused mutation changed the event:\nbefore %+v\nafter  %+v", before, after)
	}
}

// The pages show the fixture as it is: the counts, the filtered list, one event's pretty-printed
// payload and error, and the dead groups.
func TestBrowserReadsTheConsole(t *testing.T) {
	needChromium(t) // before the databases are made
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		srv, _ := serve(t, d)
		b := newBrowser(t)
		base := srv.URL + "/outbox/"

		if status := b.open(base); status != 200 {
			t.Fatalf("overview: %d", status)
		}
		counts := evaluate[map[string]string](b, `Object.fromEntries([...document.querySelectorAll("[data-count]")].map(e => [e.dataset.count, e.innerText.trim()]))`)
		want := map[string]string{"pending": "2", "due": "1", "leased": "0", "waiting": "1", "scheduled": "0", "dead": "3", "processed": "1"}
		if !maps.Equal(counts, want) {
			t.Errorf("overview counts %v, want %v", counts, want)
		}
		if got := b.text(`[data-lag="p50"]`); got != "2.0 s" {
			t.Errorf("median lag %q, want 2.0 s", got)
		}
		b.screenshot("overview")
		b.do("phone viewport", chromedp.EmulateViewport(phoneWidth, phoneHeight, chromedp.EmulateMobile))
		b.open(base)
		b.screenshot("overview-phone")
		b.do("laptop viewport", chromedp.EmulateViewport(laptopWidth, laptopHeight))

		// The filter form, as a person fills it: the dead events of the Order type, oldest first.
		b.open(base + "events")
		b.do("fill the filter",
			chromedp.SetValue(chromedp.ID("f-state"), "dead"),
			chromedp.SendKeys(chromedp.ID("f-type"), f.orderType),
			chromedp.SetValue(chromedp.ID("f-order"), "oldest"),
		)
		if status := b.click(`form.filters button[type=submit]`); status != 200 {
			t.Fatalf("filter: %d", status)
		}
		if got, want := b.rows(), []string{f.deadA1, f.deadA2}; !slices.Equal(got, want) {
			t.Errorf("filtered rows %v, want %v (dead %s events, oldest first)", got, want, f.orderType)
		}
		q, err := url.Parse(b.location())
		if err != nil {
			t.Fatal(err)
		}
		if v := q.Query(); v.Get("state") != "dead" || v.Get("type") != f.orderType || v.Get("order") != "oldest" {
			t.Errorf("the filter's URL %s", q)
		}
		if got := evaluate[string](b, `document.getElementById("f-type").value`); got != f.orderType {
			t.Errorf("the form after filtering shows type %q, want %q", got, f.orderType)
		}
		b.screenshot("events")

		// One event, reached by its link in the list.
		b.open(base + "events?state=dead")
		if status := b.click(`a[href$="/events/` + f.deadB + `"]`); status != 200 {
			t.Fatalf("event page: %d", status)
		}
		payload := evaluate[string](b, `document.querySelector("[data-field=payload]").textContent`)
		if want := "{\n  \"order\": 5,\n  \"reason\": \"card declined\"\n}"; payload != want {
			t.Errorf("payload shown as\n%s\nwant\n%s", payload, want)
		}
		if got := b.text(`[data-field=last-error]`); got != "payload too large" {
			t.Errorf("last error %q", got)
		}
		if got := b.text(`[data-field=state]`); got != "dead" {
			t.Errorf("state %q", got)
		}
		b.screenshot("event")

		b.open(base + "dead")
		causes := evaluate[[]string](b, `[...document.querySelectorAll("tr[data-cause]")].map(r => r.dataset.cause + " | " + r.querySelector("td[data-types]").innerText.trim() + " | " + r.querySelector("td.n:not([data-types])").innerText.trim())`)
		if want := []string{"broker said no: 503 | 1 | 2", "payload too large | 1 | 1"}; !slices.Equal(causes, want) {
			t.Errorf("dead causes %q, want %q", causes, want)
		}
		if status := b.click(`a[href$="dead?by=type"]`); status != 200 {
			t.Fatalf("the per-type view: %d", status)
		}
		groups := evaluate[[]string](b, `[...document.querySelectorAll("tr[data-group-type]")].map(r => r.dataset.groupType + " | " + r.querySelector("td.err").innerText.trim() + " | " + r.querySelector("td.n").innerText.trim())`)
		if want := []string{f.orderType + " | broker said no: 503 | 2", "PaymentFailed | payload too large | 1"}; !slices.Equal(groups, want) {
			t.Errorf("dead groups %q, want %q", groups, want)
		}
		b.screenshot("dead-readonly")
		b.noConsoleErrors()
	})
}

// A dead event requeued through the console, confirmed, is published by a running worker.
func TestBrowserRequeueIsPublished(t *testing.T) {
	needChromium(t) // before the databases are made
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		srv, logs := serve(t, d, outboxui.WithWrites(outboxui.BasicAuth(map[string]string{"oncall": "s3cret-pw"})))

		var mu sync.Mutex
		published := map[string]bool{}
		w, err := outboxplugin.NewWorker(d.db, outboxplugin.PublisherFunc(func(_ context.Context, msgs []outboxplugin.Message) error {
			mu.Lock()
			defer mu.Unlock()
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
		wasPublished := func(id string) bool {
			mu.Lock()
			defer mu.Unlock()
			return published[id]
		}

		b := newBrowser(t)
		b.setCredentials("oncall", "s3cret-pw")
		base := srv.URL + "/outbox/"
		b.open(base + "dead?by=type")
		if status := b.click(`tr[data-group-type="` + f.orderType + `"] a[href*="/dead?"]`); status != 200 {
			t.Fatalf("the group's events: %d", status)
		}
		if got := b.rows(); !slices.Equal(got, []string{f.deadA1, f.deadA2}) {
			t.Fatalf("the group lists %v", got)
		}
		if n := evaluate[int](b, `document.querySelectorAll("thead input[type=checkbox]").length`); n != 1 {
			t.Errorf("console.js added %d select-all boxes, want 1", n)
		}
		b.screenshot("dead")
		if status := b.click(`button[name=one][value="requeue ` + f.deadA1 + `"]`); status != 200 {
			t.Fatalf("requeue button: %d", status)
		}
		if h := b.text("h1"); h != "Requeue?" || !strings.Contains(b.text("form.confirm"), f.deadA1) {
			t.Errorf("confirmation page: %q, %q", h, b.text("form.confirm"))
		}
		b.screenshot("confirm")
		if got := eventOf(t, d, f.deadA1).State; got != outboxplugin.StateDead {
			t.Fatalf("the confirmation page changed the event: %s", got)
		}
		if status := b.click(`form.confirm button[type=submit]`); status != 200 {
			t.Fatalf("confirm: %d", status)
		}
		if got := b.text(".notice"); !strings.HasPrefix(got, "Requeued 1 event:") {
			t.Errorf("notice after the requeue: %q", got)
		}

		b.waitFor("the worker publishes the requeued event "+f.deadA1, func() bool { return wasPublished(f.deadA1) })
		b.waitFor("the event page shows "+f.deadA1+" processed", func() bool {
			b.open(base + "events/" + f.deadA1)
			return b.text(`[data-field=state]`) == "processed"
		})
		if wasPublished(f.deadA2) || eventOf(t, d, f.deadA2).State != outboxplugin.StateDead {
			t.Errorf("the other dead event of the group was published too")
		}
		if l := logs.String(); !strings.Contains(l, "outboxui: requeue") || !strings.Contains(l, "user=oncall") {
			t.Errorf("the requeue is not logged with its user:\n%s", l)
		}
		b.noConsoleErrors()
	})
}

// A mutation without credentials gets the 401 page, and one without the CSRF token the 403 page;
// neither changes the event.
func TestBrowserRefusesMutations(t *testing.T) {
	needChromium(t) // before the databases are made
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		srv, _ := serve(t, d, outboxui.WithWrites(outboxui.BasicAuth(map[string]string{"oncall": "s3cret-pw"})))
		base := srv.URL + "/outbox/"
		groupURL := base + "dead?" + url.Values{"type": {f.orderType}, "error": {"broker said no: 503"}}.Encode()
		before := eventOf(t, d, f.deadA1)
		b := newBrowser(t)
		b.dismissAuthPrompts(base + "action")

		// Without credentials: the pages are readable, the button is refused.
		b.open(groupURL)
		if status := b.click(`button[name=one][value="requeue ` + f.deadA1 + `"]`); status != 401 {
			t.Errorf("requeue without credentials: %d, want 401", status)
		}
		if h := b.text("h1"); h != "401 Unauthorized" {
			t.Errorf("401 page heading %q", h)
		}
		b.screenshot("unauthorized")
		sameDeadEvent(t, before, eventOf(t, d, f.deadA1))

		// With credentials, the confirmation's form without its CSRF token.
		b.setCredentials("oncall", "s3cret-pw")
		b.open(groupURL)
		if status := b.click(`button[name=one][value="requeue ` + f.deadA1 + `"]`); status != 200 {
			t.Fatalf("requeue button: %d", status)
		}
		if n := evaluate[int](b, `(() => { const e = document.querySelectorAll("form.confirm input[name=csrf]"); e.forEach(i => i.remove()); return e.length; })()`); n != 1 {
			t.Fatalf("the confirmation has %d csrf inputs, want 1", n)
		}
		if status := b.click(`form.confirm button[type=submit]`); status != 403 {
			t.Errorf("confirmed requeue without the CSRF token: %d, want 403", status)
		}
		if h, msg := b.text("h1"), b.text(".error-message"); h != "403 Forbidden" || !strings.Contains(msg, "security token") {
			t.Errorf("403 page: %q, %q", h, msg)
		}
		b.screenshot("forbidden")
		sameDeadEvent(t, before, eventOf(t, d, f.deadA1))
		b.noConsoleErrors("401", "403")
	})
}
