package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
	outboxotel "github.com/gorm-outbox/outboxplugin/otel"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
)

// scopeName is the instrumentation scope of the service's own spans (HTTP and consumer).
const scopeName = "github.com/gorm-outbox/outboxplugin/examples/orders"

// outboxTable is the service's outbox table: a name of its own, since the default database may be
// shared with other programs.
const outboxTable = "orders_outbox"

// config is what the service is started with: the flags of main, or the test's choices.
type config struct {
	DB   string // PostgreSQL DSN
	NATS string // NATS server URL
	HTTP string // listen address; port 0 picks a free one

	Stream        string // JetStream stream, created over SubjectPrefix+">"
	SubjectPrefix string // every subject the service publishes to starts with it; ends with "."
	Consumer      string // durable consumer's name

	Spans  sdktrace.SpanExporter // where the spans go
	Logger *slog.Logger
}

func (c config) validate() error {
	if c.Stream == "" || strings.ContainsAny(c.Stream, ".*> \t") {
		return fmt.Errorf("stream %q: want a name without '.', '*', '>' or spaces", c.Stream)
	}
	if c.Consumer == "" || strings.ContainsAny(c.Consumer, ".*> \t") {
		return fmt.Errorf("consumer %q: want a name without '.', '*', '>' or spaces", c.Consumer)
	}
	if !strings.HasSuffix(c.SubjectPrefix, ".") || c.SubjectPrefix == "." ||
		strings.Contains(c.SubjectPrefix, "..") || strings.ContainsAny(c.SubjectPrefix, "*> \t") {
		return fmt.Errorf("subject prefix %q: want tokens ending with '.', such as \"orders.\"", c.SubjectPrefix)
	}
	if c.Spans == nil || c.Logger == nil {
		return errors.New("config: span exporter and logger must be set")
	}
	return nil
}

// subject is where a message goes: <prefix><aggregate>.<event>, orders.Order.OrderPlaced by default.
func (c config) subject(m outboxplugin.Message) string {
	aggregate, event := outboxplugin.RouteTokens(m)
	return c.SubjectPrefix + aggregate + "." + event
}

// app is the service: the HTTP API, the relay worker and the consumer, over one database pool and
// one NATS connection.
type app struct {
	cfg      config
	tel      *telemetry
	db       *gorm.DB
	nc       *nats.Conn
	server   *http.Server
	listener net.Listener
	worker   *outboxplugin.Worker
	consumer jetstream.Consumer
	notifier *notifier
}

// newApp connects to PostgreSQL and NATS, creates the service's tables, stream and consumer, and
// listens on cfg.HTTP. On error it closes what it had opened.
func newApp(ctx context.Context, cfg config) (a *app, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a = &app{cfg: cfg}
	defer func() {
		if err != nil {
			a.close(context.Background())
			a = nil
		}
	}()
	if a.tel, err = newTelemetry(cfg.Spans); err != nil {
		return nil, err
	}
	if err := a.openDB(ctx); err != nil {
		return nil, err
	}
	if err := a.openNATS(ctx); err != nil {
		return nil, err
	}
	admin, err := outboxplugin.NewAdmin(a.db)
	if err != nil {
		return nil, err
	}
	sqlDB, err := a.db.DB()
	if err != nil {
		return nil, err
	}
	api := &api{db: a.db, admin: admin, logger: cfg.Logger, healthy: func(ctx context.Context) error {
		if !a.nc.IsConnected() {
			return fmt.Errorf("nats: %s", a.nc.Status())
		}
		return sqlDB.PingContext(ctx)
	}}
	a.server = &http.Server{
		Handler:           api.handler(a.tel.tracer, a.tel.metrics),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	if a.listener, err = net.Listen("tcp", cfg.HTTP); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *app) openDB(ctx context.Context) error {
	gormLog := logger.New(log.New(slogWriter{a.cfg.Logger}, "", 0),
		logger.Config{SlowThreshold: time.Second, LogLevel: logger.Warn, IgnoreRecordNotFoundError: true})
	db, err := gorm.Open(postgres.Open(a.cfg.DB), &gorm.Config{Logger: gormLog})
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	a.db = db
	err = db.Use(outboxplugin.New(
		outboxplugin.WithTableName(outboxTable),
		// Each event carries the trace context of the GORM call that wrote it (db.WithContext(ctx)).
		outboxplugin.WithContextHeaders(outboxotel.ContextHeaders()),
		// Only orders are events: the consumer's own tables are not.
		outboxplugin.WithModels(&Order{}),
	))
	if err != nil {
		return err
	}
	db = db.WithContext(ctx)
	if err := db.AutoMigrate(&Order{}, &OrderNotification{}, &ProcessedMessage{}); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return outboxplugin.AutoMigrate(db)
}

func (a *app) openNATS(ctx context.Context) error {
	// Reconnect for ever: the publisher relies on the connection's reconnects.
	nc, err := nats.Connect(a.cfg.NATS, nats.Name("orders"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	a.nc = nc
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1000),
		jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		return err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     a.cfg.Stream,
		Subjects: []string{a.cfg.SubjectPrefix + ">"},
		// The window in which JetStream drops a republished message with the same Nats-Msg-Id.
		// Copies later than that are stored again: the consumer de-duplicates as well.
		Duplicates: 10 * time.Minute,
	})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", a.cfg.Stream, err)
	}
	a.consumer, err = stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       a.cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		FilterSubject: a.cfg.SubjectPrefix + "Order.>",
	})
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", a.cfg.Consumer, err)
	}
	a.notifier = &notifier{db: a.db, tracer: a.tel.tracer.Tracer(scopeName), logger: a.cfg.Logger}

	pub, err := outboxnats.New(js, outboxnats.WithSubject(a.cfg.subject), outboxnats.WithExpectedStream(a.cfg.Stream))
	if err != nil {
		return err
	}
	otelOpts := []outboxotel.Option{
		outboxotel.WithMessagingSystem("nats"),
		outboxotel.WithMeterProvider(a.tel.meter),
		outboxotel.WithTracerProvider(a.tel.tracer),
		outboxotel.WithDestination(a.cfg.subject),
	}
	obs, err := outboxotel.NewObserver(otelOpts...)
	if err != nil {
		return err
	}
	a.worker, err = outboxplugin.NewWorker(a.db, outboxotel.WrapPublisher(pub, otelOpts...),
		outboxplugin.WithTable(outboxTable),
		outboxplugin.WithObserver(obs),
		outboxplugin.WithLogger(a.cfg.Logger),
		outboxplugin.WithCleanup(time.Hour))
	return err
}

// run serves the API and runs the relay worker and the consumer until ctx ends or one of them fails,
// then shuts down: the HTTP server first (in-flight requests finish, no new writes), then the
// worker, then the consumer (messages already delivered are handled), then the exporters are
// flushed and the connections closed. It returns nil after a shutdown that ctx asked for.
func (a *app) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.cfg.Logger.Info("orders: listening", "addr", a.listener.Addr().String(), "stream", a.cfg.Stream,
		"subjects", a.cfg.SubjectPrefix+">")

	serverDone := make(chan error, 1)
	go func() { serverDone <- a.server.Serve(a.listener) }()
	workerDone := make(chan error, 1)
	go func() { workerDone <- a.worker.Run(ctx) }()
	consuming, err := a.notifier.consume(ctx, a.consumer)
	if err != nil {
		err = fmt.Errorf("consume: %w", err)
		cancel()
	}

	select {
	case <-ctx.Done():
	case err = <-serverDone:
		err = fmt.Errorf("http server: %w", err)
		serverDone <- nil
	case err = <-workerDone:
		err = fmt.Errorf("relay worker stopped: %w", err)
		workerDone <- nil
	}
	cancel()

	stopCtx, stop := context.WithTimeout(context.Background(), 15*time.Second)
	defer stop()
	errs := []error{err}
	if err := a.server.Shutdown(stopCtx); err != nil {
		errs = append(errs, fmt.Errorf("http shutdown: %w", err))
	}
	if err := <-serverDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
		errs = append(errs, fmt.Errorf("http server: %w", err))
	}
	if err := <-workerDone; err != nil {
		errs = append(errs, fmt.Errorf("relay worker: %w", err))
	}
	if consuming != nil {
		consuming.Drain()
		select {
		case <-consuming.Closed():
		case <-stopCtx.Done():
			errs = append(errs, errors.New("consumer: not drained in time"))
		}
	}
	errs = append(errs, a.close(stopCtx))
	return errors.Join(errs...)
}

// close flushes the telemetry and closes the connections that are open.
func (a *app) close(ctx context.Context) error {
	var errs []error
	if a.tel != nil {
		errs = append(errs, a.tel.shutdown(ctx))
	}
	if a.nc != nil {
		a.nc.Close()
	}
	if a.db != nil {
		if sqlDB, err := a.db.DB(); err == nil {
			errs = append(errs, sqlDB.Close())
		}
	}
	return errors.Join(errs...)
}

// slogWriter turns GORM's log lines into warnings of the service's logger.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn(strings.TrimSpace(string(p)))
	return len(p), nil
}
