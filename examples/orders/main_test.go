package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, for creating the test database
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/gorm-outbox/outboxplugin/outboxtest"
)

// TestOrderFlow runs the service against the local PostgreSQL and NATS, in a database, stream,
// subjects and consumer of its own: an order placed over HTTP reaches the consumer through the outbox,
// a second delivery of its message has no second effect, the relay's metrics are served, and one
// trace runs from the HTTP request through the publish to the consumer.
func TestOrderFlow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dsn := testDatabase(ctx, t)
	natsURL := testNATS(t)

	spans := tracetest.NewInMemoryExporter()
	cfg := config{
		DB: dsn, NATS: natsURL, HTTP: "127.0.0.1:0",
		Stream: testName("stream"), SubjectPrefix: testName("subject") + ".", Consumer: testName("consumer"),
		Spans: keepSpans{spans}, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	// Registered before the service creates the stream, so that a failed start leaves none behind.
	t.Cleanup(func() { deleteStream(t, natsURL, cfg.Stream) })
	a, err := newApp(ctx, cfg)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.run(runCtx) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
			<-done
		}
	})
	base := "http://" + a.listener.Addr().String()

	// Place an order.
	res := do(ctx, t, http.MethodPost, base+"/orders", `{"customer":"ann","amount":1250}`)
	require.Equal(t, http.StatusCreated, res.status, res.body)
	var order Order
	require.NoError(t, json.Unmarshal([]byte(res.body), &order))
	require.NotZero(t, order.ID)
	require.Equal(t, statusPlaced, order.Status)

	res = do(ctx, t, http.MethodPost, base+"/orders", `{"customer":"","amount":0}`)
	require.Equal(t, http.StatusBadRequest, res.status, res.body)
	res = do(ctx, t, http.MethodGet, base+"/orders/"+fmt.Sprint(order.ID), "")
	require.Equal(t, http.StatusOK, res.status, res.body)
	res = do(ctx, t, http.MethodGet, base+"/orders/999999", "")
	require.Equal(t, http.StatusNotFound, res.status, res.body)

	// The consumer records its notification once the relay has published the event.
	notifications := func() int64 {
		var n int64
		require.NoError(t, a.db.WithContext(ctx).Model(&OrderNotification{}).Where("order_id = ?", order.ID).Count(&n).Error)
		return n
	}
	waitFor(ctx, t, "the consumer's notification", func() bool { return notifications() > 0 })

	// Deliver the same message again, as JetStream does after a lost ack: the stored message, with
	// its headers, through the consumer's handler. The effect stays single.
	js, err := jetstream.New(a.nc)
	require.NoError(t, err)
	stream, err := js.Stream(ctx, cfg.Stream)
	require.NoError(t, err)
	raw, err := stream.GetLastMsgForSubject(ctx, cfg.SubjectPrefix+"Order.OrderPlaced")
	require.NoError(t, err)
	msgID := raw.Header.Get(jetstream.MsgIDHeader)
	require.NotEmpty(t, msgID)
	for range 2 {
		require.NoError(t, a.notifier.handle(ctx, raw.Subject, raw.Header, raw.Data))
	}
	require.EqualValues(t, 1, notifications())
	var processed int64
	require.NoError(t, a.db.WithContext(ctx).Model(&ProcessedMessage{}).Where("message_id = ?", msgID).Count(&processed).Error)
	require.EqualValues(t, 1, processed)

	// Cancel: once, then a conflict.
	res = do(ctx, t, http.MethodPost, base+"/orders/"+fmt.Sprint(order.ID)+"/cancel", "")
	require.Equal(t, http.StatusOK, res.status, res.body)
	res = do(ctx, t, http.MethodPost, base+"/orders/"+fmt.Sprint(order.ID)+"/cancel", "")
	require.Equal(t, http.StatusConflict, res.status, res.body)
	waitFor(ctx, t, "the cancellation's notification", func() bool { return notifications() == 2 })

	// The relay's metrics, in Prometheus' naming.
	waitFor(ctx, t, "messaging_client_sent_messages on /metrics", func() bool {
		res := do(ctx, t, http.MethodGet, base+"/metrics", "")
		return res.status == http.StatusOK && strings.Contains(res.body, "messaging_client_sent_messages")
	})
	res = do(ctx, t, http.MethodGet, base+"/healthz", "")
	require.Equal(t, http.StatusOK, res.status, res.body)
	waitFor(ctx, t, "an empty outbox", func() bool {
		res := do(ctx, t, http.MethodGet, base+"/outbox", "")
		var st outboxplugin.Stats
		require.Equal(t, http.StatusOK, res.status, res.body)
		require.NoError(t, json.Unmarshal([]byte(res.body), &st))
		return st.Pending == 0 && st.Processed >= 4 // Order_create, OrderPlaced, Order_update, OrderCancelled
	})

	// Shut down; the spans are flushed on the way.
	stop()
	stopped = true
	require.NoError(t, <-done)

	// One trace: POST /orders (server) → publish …OrderPlaced (producer) → process …OrderPlaced (consumer).
	byName := map[string][]tracetest.SpanStub{}
	for _, s := range spans.GetSpans() {
		byName[s.Name] = append(byName[s.Name], s)
	}
	server := only(t, byName, "POST /orders", trace.SpanKindServer, func(s tracetest.SpanStub) bool {
		return statusOf(s) == http.StatusCreated
	})
	placed := cfg.SubjectPrefix + "Order.OrderPlaced"
	publish := only(t, byName, "publish "+placed, trace.SpanKindProducer, nil)
	require.Equal(t, server.SpanContext.TraceID(), publish.SpanContext.TraceID())
	require.Equal(t, server.SpanContext.SpanID(), publish.Parent.SpanID())
	consumers := byName["process "+placed]
	require.Len(t, consumers, 3, "the delivery and the two redeliveries")
	for _, c := range consumers {
		require.Equal(t, trace.SpanKindConsumer, c.SpanKind)
		require.Equal(t, server.SpanContext.TraceID(), c.SpanContext.TraceID())
		require.Equal(t, publish.SpanContext.SpanID(), c.Parent.SpanID())
	}
}

// only returns the one span named name that keep accepts (all when keep is nil), of the kind given.
func only(t *testing.T, byName map[string][]tracetest.SpanStub, name string, kind trace.SpanKind, keep func(tracetest.SpanStub) bool) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range byName[name] {
		if keep == nil || keep(s) {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans named %q", name)
	require.Equal(t, kind, found[0].SpanKind)
	return found[0]
}

func statusOf(s tracetest.SpanStub) int {
	for _, kv := range s.Attributes {
		if kv.Key == "http.response.status_code" {
			return int(kv.Value.AsInt64())
		}
	}
	return 0
}

type response struct {
	status int
	body   string
}

func do(ctx context.Context, t *testing.T, method, url, body string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewBufferString(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{res.StatusCode, string(b)}
}

// waitFor polls cond until it holds, failing the test when ctx ends first.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

func postgresDSN() string {
	if dsn := os.Getenv("OUTBOX_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "host=127.0.0.1 port=5432 user=postgres dbname=postgres sslmode=disable"
}

// testDatabase creates a database of the test's own, outboxplugin_orders_<token>, dropped when the
// test ends, and returns its DSN. An unreachable server skips the test, or fails it under
// OUTBOX_REQUIRE_DBS=1.
func testDatabase(ctx context.Context, t *testing.T) string {
	t.Helper()
	admin, err := sql.Open("pgx", postgresDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := admin.PingContext(pingCtx); err != nil {
		if os.Getenv("OUTBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("PostgreSQL unreachable and OUTBOX_REQUIRE_DBS=1: %v", err)
		}
		t.Skipf("PostgreSQL unreachable: %v", err)
	}
	name := testName("db")
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return withDBName(postgresDSN(), name)
}

// withDBName returns the key=value DSN with its dbname replaced.
func withDBName(dsn, name string) string {
	fields := strings.Fields(dsn)
	for i, f := range fields {
		if strings.HasPrefix(f, "dbname=") {
			fields[i] = "dbname=" + name
			return strings.Join(fields, " ")
		}
	}
	return dsn + " dbname=" + name
}

// testNATS returns the NATS server's URL, skipping the test when it is unreachable (failing it under
// OUTBOX_REQUIRE_BROKERS=1).
func testNATS(t *testing.T) string {
	t.Helper()
	url := natsServerURL()
	outboxtest.RequireBroker(t, "NATS", strings.TrimPrefix(url, "nats://"))
	return url
}

// natsServerURL is the NATS server with JetStream: OUTBOX_NATS_URL, or the local one.
func natsServerURL() string {
	if url := os.Getenv("OUTBOX_NATS_URL"); url != "" {
		return url
	}
	return "nats://127.0.0.1:4222"
}

// deleteStream deletes the test's stream (and with it its consumer) over a connection of its own:
// the service's is closed by then. A stream that was never created (the service did not start) is
// no failure.
func deleteStream(t *testing.T, url, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Errorf("delete stream %s: %v", name, err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err == nil {
		err = js.DeleteStream(ctx, name)
	}
	if err != nil && !(t.Failed() && errors.Is(err, jetstream.ErrStreamNotFound)) {
		t.Errorf("delete stream %s: %v", name, err)
	}
}

// keepSpans keeps the exported spans past the tracer provider's shutdown, which would reset an
// InMemoryExporter.
type keepSpans struct{ *tracetest.InMemoryExporter }

func (keepSpans) Shutdown(context.Context) error { return nil }

// testWriter sends the service's log to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
