package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
	outboxui "github.com/gorm-outbox/outboxplugin/ui"
)

// readyTimeout bounds each check of /readyz: a database or broker slower than this is not ready.
const readyTimeout = 2 * time.Second

// newMetrics returns a MeterProvider whose measurements the returned handler serves as Prometheus
// text. The registry is the relay's own, not the global one: /metrics shows the relay's metrics and
// the Go runtime's, nothing a library registered behind its back.
func newMetrics() (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: Prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// readiness answers /readyz: ready when the database answers a ping, the broker is connected, and
// every worker is healthy (outboxplugin.Worker.Health: its claims succeed, and the broker does not
// refuse all it publishes for a configuration error).
type readiness struct {
	db     atomic.Pointer[gorm.DB] // nil until the first connection succeeded
	broker atomic.Pointer[broker]
	// starting is why the broker is not connected yet, when the start-up knows (a refused login).
	starting atomic.Pointer[string]
	workers  atomic.Pointer[[]*outboxplugin.Worker]
	// redact removes credentials from the reasons, which may quote a driver's or a broker's error.
	redact func(string) string
	// console is the web console of --ui, set once the database answered.
	console atomic.Pointer[outboxui.Console]
}

// check returns nil when ready, or a short reason without credentials: the database's and the
// broker's hold no error text, a worker's is its Health, redacted.
func (r *readiness) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	db := r.db.Load()
	if db == nil {
		return errors.New("database not connected yet")
	}
	sqlDB, err := db.DB()
	if err != nil || sqlDB.PingContext(ctx) != nil {
		return errors.New("database not reachable")
	}
	b := r.broker.Load()
	if b == nil {
		if why := r.starting.Load(); why != nil {
			return errors.New(*why)
		}
		return errors.New("broker not connected yet")
	}
	if err := b.connected(ctx); err != nil {
		return err
	}
	if ws := r.workers.Load(); ws != nil {
		for _, w := range *ws {
			if err := w.Health(); err != nil {
				reason := err.Error()
				if r.redact != nil {
					reason = r.redact(reason)
				}
				return fmt.Errorf("worker %s: %s", w.Owner(), reason)
			}
		}
	}
	return nil
}

// healthServer serves /metrics, /healthz and /readyz on a listener.
type healthServer struct {
	srv *http.Server
	ln  net.Listener
}

// listenHealth binds addr and returns the server of the relay's endpoints on it, and of the web
// console at /ui/ when withConsole (503 until the database has answered).
func listenHealth(addr string, metrics http.Handler, ready *readiness, withConsole bool, log *slog.Logger) (*healthServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeStatus(w, http.StatusOK, "ok", "")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		if err := ready.check(req.Context()); err != nil {
			writeStatus(w, http.StatusServiceUnavailable, "unavailable", err.Error())
			return
		}
		writeStatus(w, http.StatusOK, "ok", "")
	})
	if withConsole {
		mux.HandleFunc("/ui/", func(w http.ResponseWriter, req *http.Request) {
			c := ready.console.Load()
			if c == nil {
				w.Header().Set("Retry-After", "5")
				http.Error(w, "the console starts once the database answers", http.StatusServiceUnavailable)
				return
			}
			c.ServeHTTP(w, req)
		})
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return &healthServer{srv: srv, ln: ln}, nil
}

// serve serves until shutdown; it returns the error that stopped it, or nil after shutdown.
func (h *healthServer) serve() error {
	if err := h.srv.Serve(h.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	return nil
}

// shutdown stops the server, waiting for the requests in progress for at most timeout.
func (h *healthServer) shutdown(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if h.srv.Shutdown(ctx) != nil {
		_ = h.srv.Close()
	}
}

func writeStatus(w http.ResponseWriter, code int, status, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	body := map[string]string{"status": status}
	if reason != "" {
		body["reason"] = reason
	}
	_ = json.NewEncoder(w).Encode(body)
}
