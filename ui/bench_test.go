package outboxui_test

import (
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// BenchmarkPagesAtScale serves every page of the console over a PostgreSQL outbox that keeps
// OUTBOX_BENCH_KEPT processed events (default 1 000 000; the target is 10 000 000), written over
// seven days, beside the fixture's pending and dead events, and reports each page's mean time
// (request to last byte, through net/http) as <page>-ms. Target: every page ≤ 200 ms at 10 million.
//
//	OUTBOX_BENCH_KEPT=10000000 go test -run '^$' -bench BenchmarkPagesAtScale -benchtime 20x -timeout 30m ./ui
func BenchmarkPagesAtScale(b *testing.B) {
	kept := 1000000
	if v := os.Getenv("OUTBOX_BENCH_KEPT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("OUTBOX_BENCH_KEPT=%q: want a count of rows", v)
		}
		kept = n
	}
	d := newPostgres(b)
	f := addFixture(b, d)
	step := (7 * 24 * time.Hour / time.Duration(kept)).Microseconds()
	if err := d.db.Exec(`INSERT INTO outbox_events (message_id, event_type, aggregate_type, aggregate_id, payload, created_at, processed, processed_at)
		SELECT md5(g::text)::uuid::text, 'Bench_create', 'Bench', g::text, jsonb_build_object('id', g),
		       now() - interval '1 microsecond' * ((? - g)::float8 * ?), true, now()
		FROM generate_series(1, ?) g`, kept, step, kept).Error; err != nil {
		b.Fatal(err)
	}
	// A processed event written as the plugin writes them (a UUIDv7 id): found by its time.
	var one outboxplugin.OutboxEvent
	if err := d.db.Transaction(func(tx *gorm.DB) error { return outboxplugin.Emit(tx, "Lookup", map[string]int{"n": 1}) }); err != nil {
		b.Fatal(err)
	}
	if err := d.db.Where("event_type = ?", "Lookup").First(&one).Error; err != nil {
		b.Fatal(err)
	}
	if err := d.db.Session(&gorm.Session{NewDB: true}).Model(&outboxplugin.OutboxEvent{}).Where("id = ?", one.ID).
		Updates(map[string]any{"processed": true, "processed_at": time.Now().UTC()}).Error; err != nil {
		b.Fatal(err)
	}
	if err := d.db.Exec("VACUUM ANALYZE outbox_events").Error; err != nil {
		b.Fatal(err)
	}
	srv, _ := serve(b, d)
	missing := "0190c1d2-3e4f-7a5b-8c6d-7e8f9a0b1c2d" // a UUIDv7 of 2024 that no event has
	pages := []struct{ name, path string }{
		{"overview", "/outbox/"},
		{"events", "/outbox/events"},
		{"events-dead", "/outbox/events?state=dead"},
		{"events-processed-type", "/outbox/events?state=processed&type=Bench_create"},
		{"events-key", "/outbox/events?aggregate_type=Bench&aggregate_id=42"},
		{"events-since", "/outbox/events?since=" + url.QueryEscape(time.Now().UTC().Add(-24*time.Hour).Format("2006-01-02T15:04"))},
		{"event-processed", "/outbox/events/" + one.MessageID},
		{"event-dead", "/outbox/events/" + f.deadB},
		{"event-missing", "/outbox/events/" + missing},
		{"dead", "/outbox/dead"},
		{"dead-group", "/outbox/dead?" + url.Values{"type": {f.orderType}, "error": {"broker said no: 503"}}.Encode()},
	}
	get := func(path string) {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if err != nil || (res.StatusCode != http.StatusOK && !(path == "/outbox/events/"+missing && res.StatusCode == http.StatusNotFound)) {
			b.Fatalf("GET %s: %d %v", path, res.StatusCode, err)
		}
	}
	for _, p := range pages {
		get(p.path) // warm: the first read of an index pays for its pages
	}
	spent := make([]time.Duration, len(pages))
	b.ResetTimer()
	for range b.N {
		for i, p := range pages {
			start := time.Now()
			get(p.path)
			spent[i] += time.Since(start)
		}
	}
	b.StopTimer()
	for i, p := range pages {
		b.ReportMetric(float64(spent[i].Microseconds())/1000/float64(b.N), p.name+"-ms")
	}
}
