package main

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// outbox ui serves the console as a user would start it: read-only by default, every page behind the
// user when one is given, writes only with one, and SIGTERM stops it with exit code 0.
func TestUI(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		f := addFixture(t, d)
		addr := freeAddr(t)
		p := startRelay(t, nil, "ui", "--db", d.dsn, "--http", addr)
		eventually(t, 15*time.Second, "the console listening", p, func() bool { return strings.Contains(p.stderr.String(), "console listening") })
		code, body, err := get(addr, "/")
		if err != nil || code != http.StatusOK || !strings.Contains(body, `data-count="dead">2<`) || !strings.Contains(body, "read-only") {
			t.Errorf("overview: %d %v\n%s", code, err, body)
		}
		if code, body, _ := get(addr, "/events/"+f.dead1); code != http.StatusOK || !strings.Contains(body, "broker down") {
			t.Errorf("event page: %d\n%s", code, body)
		}
		if code, _, _ := get(addr, "/events?state=bogus"); code != http.StatusBadRequest {
			t.Errorf("bad state: %d", code)
		}
		res, err := http.PostForm("http://"+addr+"/action", url.Values{"op": {"requeue"}, "scope": {"ids"}, "ids": {f.dead1}})
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("a POST to a read-only console: %d", res.StatusCode)
		}
		if code := p.stop(t); code != 0 {
			t.Errorf("exit %d after SIGTERM\n%s", code, p.stderr.String())
		}
	})
}

func TestUIUserAndWrites(t *testing.T) {
	const password = "Ui-S3cret-pw"
	d := newSQLiteDB(t)
	addFixture(t, d)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := startRelay(t, nil, "ui", "--db", d.dsn, "--http", addr, "--write", "--user", "oncall", "--password-file", pwFile, "--log-format", "json")
	eventually(t, 15*time.Second, "the console listening", p, func() bool { return strings.Contains(p.stderr.String(), "console listening") })
	if code, _, _ := get(addr, "/"); code != http.StatusUnauthorized {
		t.Errorf("a page without the user: %d", code)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/dead", nil)
	req.SetBasicAuth("oncall", password)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("the dead page with the user: %d", res.StatusCode)
	}
	if code := p.stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM", code)
	}
	if strings.Contains(p.stderr.String(), password) {
		t.Errorf("the password was logged:\n%s", p.stderr.String())
	}

	// Flags that do not go together are usage errors, before anything is served.
	for _, args := range [][]string{
		{"--write"},
		{"--user", "oncall"},
		{"--password-file", pwFile},
		{"--user", "oncall", "--password-file", filepath.Join(t.TempDir(), "missing")},
		{"--log-format", "xml"},
	} {
		wantCode(t, exitUsage, append([]string{"ui", "--db", d.dsn, "--http", freeAddr(t)}, args...)...)
	}
}

// outbox relay --ui serves the console at /ui/ of --http beside the relay's own endpoints.
func TestRelayUI(t *testing.T) {
	d := newSQLiteDB(t)
	f := addFixture(t, d)
	addr := freeAddr(t)
	p := startRelay(t, nil, "relay", "--db", d.dsn, "--broker", "nats://127.0.0.1:1", "--http", addr, "--ui", "--ui-hide-payloads")
	eventually(t, 15*time.Second, "the console", p, func() bool { return strings.Contains(p.stderr.String(), "serving the console") })
	code, body, err := get(addr, "/ui/")
	if err != nil || code != http.StatusOK || !strings.Contains(body, `href="/ui/dead"`) || !strings.Contains(body, `data-count="dead">2<`) {
		t.Errorf("/ui/: %d %v\n%s", code, err, body)
	}
	if code, body, _ := get(addr, "/ui/events/"+f.dead1); code != http.StatusOK || !strings.Contains(body, `data-field="payload-hidden"`) {
		t.Errorf("/ui/events/%s with --ui-hide-payloads: %d\n%s", f.dead1, code, body)
	}
	if code, _, _ := get(addr, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz beside the console: %d", code)
	}
	if code := p.stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM", code)
	}
	wantCode(t, exitUsage, "relay", "--db", d.dsn, "--broker", "nats://127.0.0.1:1", "--http", "", "--ui")
	wantCode(t, exitUsage, "relay", "--db", d.dsn, "--broker", "nats://127.0.0.1:1", "--http", freeAddr(t), "--ui", "--ui-write")
}
