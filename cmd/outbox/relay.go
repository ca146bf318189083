package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outboxplugin"
	outboxotel "github.com/gorm-outbox/outboxplugin/otel"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
	outboxui "github.com/gorm-outbox/outboxplugin/ui"
)

func init() { register(newRelayCmd) }

// relayFlags are the relay command's own flags. A zero value of a worker option means the core's
// default: the command passes only what was set.
type relayFlags struct {
	broker        string
	brokerFile    string
	subjectPrefix string
	stream        string
	topic         string
	kafkaCA       caFile
	exchange      string
	workers       int

	batchSize       int
	pollInterval    time.Duration
	publishTimeout  time.Duration
	lease           time.Duration
	maxAttempts     int
	keyOrdering     bool
	deleteOnPublish bool
	cleanupEvery    time.Duration
	retention       time.Duration
	withoutListen   bool
	listenDB        string
	listenDBFile    string

	http      string
	logFormat string
	logLevel  string

	ui      bool
	console consoleFlags
}

// The first connection to the database is retried with a backoff growing from connectBackoffMin
// to connectBackoffMax; each ping may take connectPingTimeout.
const (
	connectBackoffMin  = 250 * time.Millisecond
	connectBackoffMax  = 10 * time.Second
	connectPingTimeout = 5 * time.Second
	httpShutdownWait   = 5 * time.Second
)

const relayLong = `relay runs workers that publish the events of the outbox table to a broker, until SIGTERM or
SIGINT. The broker is chosen by the scheme of --broker:
  nats://host:4222[,nats://host2:4222]   NATS JetStream; each event goes to the subject
                                        <subject-prefix>.<aggregate>.<event>, which a stream must
                                        capture; --stream makes the server store it only in that stream
  kafka://host:9092[,host:9092]         Kafka (franz-go, acks by all in-sync replicas, idempotent); each
  kafkas://user:pass@host:9093,...      event goes to outbox.<aggregate>, or to --topic. kafkas:// is
                                        TLS (system roots, plus --kafka-ca-file). user:pass@ on the
                                        first seed (URL-encoded) logs in with SASL SCRAM-SHA-512, or
                                        the mechanism of ?sasl=plain|scram-sha-256|scram-sha-512
  amqp://user:pass@host:5672/vhost      RabbitMQ (publisher confirms); each event goes to the topic
  amqps://...                           exchange --exchange with the routing key <aggregate>.<event>,
                                        mandatory: a queue must be bound to receive it
  redis://[user:pass@]host:6379/0       Redis Streams (XADD); --stream names the one stream key of all
                                        events (default outbox:<aggregate>)

Several relays (replicas) may run on one table: each event is leased by one worker at a time.
The first connection to the database (and to RabbitMQ) is retried with backoff until it succeeds;
NATS, Kafka and Redis down at start-up are logged and connected to in the background. A broker that
refuses the configuration — credentials, a NATS subject no stream captures, a missing exchange, an
unknown --topic, a --stream key of another type — is logged at error, naming it and the broker; the
relay keeps running, not ready, spending no attempt, and recovers once it is fixed.

On SIGTERM or SIGINT the workers finish or hand back the batch in flight (within --publish-timeout)
and the command exits 0.

--http serves /metrics (Prometheus text: the metrics of github.com/gorm-outbox/outboxplugin/otel),
/healthz (200 while the process runs) and /readyz (200 when the database answers a ping, the
broker is connected and every worker is healthy — its claims succeed, and the broker does not refuse
all it publishes for a configuration error — else 503 with a JSON reason naming the cause).

PostgreSQL: each worker LISTENs for the commits' notifications and publishes at once, polling all the
same. Behind a transaction pooler such as PgBouncer in transaction mode, a LISTEN through the pooler
hears nothing: each worker finds that out as it starts, says so once at WARN and polls every
--poll-interval. --listen-db, a DSN of the PostgreSQL server itself, keeps the wake-up there: the
LISTEN connections (one per worker) go to it, and everything else, the notifications included, still
goes through --db. --without-listen turns the wake-up off instead.

The worker options left at 0 (or unset) take the defaults of the core package, shown in each flag.
Credentials in --db, --listen-db and --broker never appear in the logs, errors or HTTP responses. For
mounted secrets, --db-file, --listen-db-file and --broker-file read the DSNs and the broker URL from
files.`

func newRelayCmd(a *app) *cobra.Command {
	var f relayFlags
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish the outbox's events to a broker (NATS JetStream, Kafka, RabbitMQ, Redis Streams)",
		Long:  relayLong,
		Example: `  outbox relay --db postgres://app@db.internal/shop --broker nats://nats:4222 --workers 2
  OUTBOX_DB_FILE=/run/secrets/dsn OUTBOX_BROKER=redis://redis:6379/0 outbox relay --log-format json`,
		Args:    noArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error { return checkBrokerFlags(cmd.Flags(), &f) },
		RunE:    a.runE(func(cmd *cobra.Command, _ []string) error { return a.relay(cmd.Context(), &f) }),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.broker, "broker", "", "the broker URL: nats://, kafka:// or kafkas://, amqp:// or redis:// (see above)")
	fl.StringVar(&f.brokerFile, "broker-file", "", "a file holding the broker URL, instead of --broker (a mounted secret)")
	fl.StringVar(&f.subjectPrefix, "subject-prefix", "outbox", "NATS: the first tokens of every subject")
	fl.StringVar(&f.stream, "stream", "", "NATS: the stream that must store the messages (Nats-Expected-Stream); Redis: the stream key of every event (default outbox:<aggregate>)")
	fl.StringVar(&f.topic, "topic", "", "Kafka: the topic of every event (default outbox.<aggregate>)")
	fl.Var(&f.kafkaCA, "kafka-ca-file", "Kafka over TLS (kafkas://): a PEM file of CA certificates trusted besides the system's")
	fl.StringVar(&f.exchange, "exchange", outboxrabbitmq.DefaultExchange, "RabbitMQ: the topic exchange the events are published to (declared durable), routing key <aggregate>.<event>")
	fl.IntVar(&f.workers, "workers", 1, "workers in this process, at least 1")

	fl.IntVar(&f.batchSize, "batch-size", 0, fmt.Sprintf("events claimed per batch, 1..10000 (0: %d, %d on MySQL)", outboxplugin.DefaultBatchSize, outboxplugin.DefaultMySQLBatchSize))
	fl.DurationVar(&f.pollInterval, "poll-interval", 0, fmt.Sprintf("wait after a batch that was not full (0: %v)", outboxplugin.DefaultPollInterval))
	fl.DurationVar(&f.publishTimeout, "publish-timeout", 0, fmt.Sprintf("bound of each publish, and of the shutdown (0: %v)", outboxplugin.DefaultPublishTimeout))
	fl.DurationVar(&f.lease, "lease", 0, fmt.Sprintf("how long a claimed event stays reserved without renewal, at least %v (0: %v)", outboxplugin.MinLease, outboxplugin.DefaultLease))
	fl.IntVar(&f.maxAttempts, "max-attempts", 0, fmt.Sprintf("deliveries of an event before it is dead (0: %d)", outboxplugin.DefaultMaxAttempts))
	fl.BoolVar(&f.keyOrdering, "key-ordering", false, "publish the events of one aggregate strictly in order")
	fl.BoolVar(&f.deleteOnPublish, "delete-on-publish", false, "delete events once published instead of marking them processed")
	fl.DurationVar(&f.cleanupEvery, "cleanup-every", 0, "delete processed events older than --retention this often (0: no cleanup)")
	fl.DurationVar(&f.retention, "retention", 0, fmt.Sprintf("how long the cleanup keeps processed events (0: %v)", outboxplugin.DefaultRetention))
	fl.BoolVar(&f.withoutListen, "without-listen", false, "PostgreSQL: poll only, without LISTEN (for PgBouncer in transaction mode)")
	fl.StringVar(&f.listenDB, "listen-db", "", "PostgreSQL: a DSN of the PostgreSQL server itself (not through the pooler) for the LISTEN connection, "+
		"when --db goes through a transaction pooler such as PgBouncer; notifications are sent through --db")
	fl.StringVar(&f.listenDBFile, "listen-db-file", "", "a file holding the --listen-db DSN, instead of --listen-db (a mounted secret)")

	fl.StringVar(&f.http, "http", "127.0.0.1:9090", "address of /metrics, /healthz and /readyz (empty: no HTTP server)")
	fl.BoolVar(&f.ui, "ui", false, "also serve the web console at /ui/ of --http (see outbox ui --help; its flags here are --ui-*)")
	f.console.register(fl, "ui-")
	fl.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

// readSecretFiles sets the broker URL from --broker-file and the LISTEN DSN from --listen-db-file,
// when they are given.
func (f *relayFlags) readSecretFiles() error {
	if err := readSecretFile("broker", &f.broker, f.brokerFile); err != nil {
		return err
	}
	f.listenDB = strings.TrimSpace(f.listenDB)
	return readSecretFile("listen-db", &f.listenDB, f.listenDBFile)
}

// readSecretFile sets *value, the value of the flag --name, from path, the value of --name-file, when
// it is given; surrounding whitespace is trimmed. The file's content is never quoted in an error: it
// is a secret.
func readSecretFile(name string, value *string, path string) error {
	if path == "" {
		return nil
	}
	if *value != "" {
		return usagef("--%s and --%s-file are exclusive: give one", name, name)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return usagef("--%s-file: %w", name, err)
	}
	*value = strings.TrimSpace(string(b))
	if *value == "" {
		return usagef("--%s-file %s is empty", name, path)
	}
	return nil
}

// listenConfig returns pgx's configuration of --listen-db, or nil when it is not given. It is read
// with the other flags, so that a DSN the LISTEN connections could not use is a usage error before
// anything is opened, rather than a connection that fails at every retry while the relay polls.
func (f *relayFlags) listenConfig(dbKind string) (*pgx.ConnConfig, error) {
	if f.listenDB == "" {
		return nil, nil
	}
	if f.withoutListen {
		return nil, usagef("--listen-db and --without-listen are exclusive: --listen-db is where the LISTEN wake-up " +
			"connects, and --without-listen turns the wake-up off; give one")
	}
	if dbKind != kindPostgres {
		return nil, usagef("--listen-db is for PostgreSQL, and --db is %s, which has no LISTEN wake-up: remove --listen-db", dbKind)
	}
	// parseDSN's own errors name --db: this one names the flag, and quotes nothing of the DSN.
	kind, driverDSN, err := parseDSN(f.listenDB)
	if err != nil || kind != kindPostgres {
		return nil, usagef("--listen-db: not a PostgreSQL DSN: give a postgres:// URL or a key=value DSN with host= or " +
			"dbname=, of the PostgreSQL server itself (not of the pooler)")
	}
	cfg, err := pgx.ParseConfig(driverDSN)
	if err != nil {
		// pgx's message quotes the DSN with its password left out; the relay's redactor takes out
		// what pgx could not tell apart.
		return nil, usagef("--listen-db: %w", err)
	}
	return cfg, nil
}

// workerOptions returns the options of the flags that were set, and refuses negative values (the
// core refuses the rest).
func (f *relayFlags) workerOptions(table string) ([]outboxplugin.WorkerOption, error) {
	if f.workers < 1 {
		return nil, usagef("--workers %d: want at least 1", f.workers)
	}
	for name, v := range map[string]time.Duration{"--poll-interval": f.pollInterval, "--publish-timeout": f.publishTimeout,
		"--lease": f.lease, "--cleanup-every": f.cleanupEvery, "--retention": f.retention} {
		if v < 0 {
			return nil, usagef("%s %v: negative", name, v)
		}
	}
	if f.batchSize < 0 || f.maxAttempts < 0 {
		return nil, usagef("--batch-size and --max-attempts cannot be negative")
	}
	opts := []outboxplugin.WorkerOption{outboxplugin.WithTable(table)}
	add := func(set bool, o outboxplugin.WorkerOption) {
		if set {
			opts = append(opts, o)
		}
	}
	add(f.batchSize != 0, outboxplugin.WithBatchSize(f.batchSize))
	add(f.pollInterval != 0, outboxplugin.WithPollInterval(f.pollInterval))
	add(f.publishTimeout != 0, outboxplugin.WithPublishTimeout(f.publishTimeout))
	add(f.lease != 0, outboxplugin.WithLease(f.lease))
	add(f.maxAttempts != 0, outboxplugin.WithMaxAttempts(f.maxAttempts))
	add(f.keyOrdering, outboxplugin.WithKeyOrdering())
	add(f.deleteOnPublish, outboxplugin.WithDeleteOnPublish())
	add(f.cleanupEvery != 0, outboxplugin.WithCleanup(f.cleanupEvery))
	add(f.retention != 0, outboxplugin.WithRetention(f.retention))
	add(f.withoutListen, outboxplugin.WithoutListen())
	return opts, nil
}

// newLogger returns the logger of --log-format and --log-level, writing to w.
func (f *relayFlags) newLogger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	hopts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(f.logFormat) {
	case "text":
		return slog.New(slog.NewTextHandler(w, hopts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, hopts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", f.logFormat)
}

// startAttrs are the attributes of the relay's start line: its effective configuration, with dsn,
// listenDSN and brokerURL already redacted. Worker options left at 0 are shown as the core's defaults
// ("default").
func (f *relayFlags) startAttrs(scheme, kind, dsn, listenDSN, brokerURL, table string) []any {
	orDefault := func(set bool, v any) any {
		if set {
			return v
		}
		return "default"
	}
	attrs := []any{"database", kind, "db", dsn, "broker", brokerURL, "table", table, "workers", f.workers,
		"batch_size", orDefault(f.batchSize != 0, f.batchSize),
		"lease", orDefault(f.lease != 0, f.lease.String()),
		"poll_interval", orDefault(f.pollInterval != 0, f.pollInterval.String()),
		"publish_timeout", orDefault(f.publishTimeout != 0, f.publishTimeout.String()),
		"max_attempts", orDefault(f.maxAttempts != 0, f.maxAttempts),
		"key_ordering", f.keyOrdering, "delete_on_publish", f.deleteOnPublish, "listen", !f.withoutListen}
	if f.listenDB != "" {
		attrs = append(attrs, "listen_db", listenDSN)
	}
	if f.cleanupEvery != 0 {
		attrs = append(attrs, "cleanup_every", f.cleanupEvery.String(), "retention", orDefault(f.retention != 0, f.retention.String()))
	}
	switch scheme {
	case schemeNATS:
		attrs = append(attrs, "subject_prefix", f.subjectPrefix, "stream", f.stream)
	case schemeKafka:
		attrs = append(attrs, "topic", f.topic)
	case schemeAMQP, schemeAMQPS:
		attrs = append(attrs, "exchange", f.exchange)
	case schemeRedis:
		attrs = append(attrs, "stream", f.stream)
	}
	return append(attrs, "http", f.http)
}

// relayRedactor redacts what the relay prints: the app's redaction (the DSN) and the passwords of
// the broker URL and of the LISTEN DSN.
type relayRedactor struct {
	a       *app
	secrets []string
}

func (r relayRedactor) redact(text string) string {
	for _, s := range r.secrets {
		text = strings.ReplaceAll(text, s, redacted)
	}
	return r.a.redact(text)
}

// Write writes p to stderr, redacted; a log handler writes one record per call.
func (r relayRedactor) Write(p []byte) (int, error) {
	if _, err := r.a.stderr.WriteString(r.redact(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// redactedError is an error whose message has been redacted, keeping the error it wraps for exit
// codes.
type redactedError struct {
	msg string
	err error
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }

func (a *app) relay(ctx context.Context, f *relayFlags) error {
	if err := f.readSecretFiles(); err != nil {
		return err
	}
	r := relayRedactor{a: a, secrets: append(brokerPasswords(f.broker), passwordsOf(f.listenDB)...)}
	err := a.runRelay(ctx, f, r)
	if err != nil {
		return redactedError{msg: r.redact(err.Error()), err: err}
	}
	return nil
}

func (a *app) runRelay(ctx context.Context, f *relayFlags, r relayRedactor) error {
	// Every usage error first, before anything is opened.
	log, err := f.newLogger(r)
	if err != nil {
		return err
	}
	opts, err := f.workerOptions(a.table)
	if err != nil {
		return err
	}
	scheme, err := brokerScheme(f.broker)
	if err != nil {
		return err
	}
	if scheme == schemeNATS {
		if err := validateSubjectPrefix(f.subjectPrefix); err != nil {
			return err
		}
	}
	if (scheme == schemeAMQP || scheme == schemeAMQPS) && f.exchange == "" {
		return usagef("--exchange: empty (the AMQP default exchange does not route by topic)")
	}
	var consoleOpts []outboxui.Option
	if f.ui {
		if f.http == "" {
			return usagef("--ui needs --http: the console is served at /ui/ of it")
		}
		if consoleOpts, err = f.console.options("ui-", log); err != nil {
			return err
		}
	}
	dsn, err := a.readDSN()
	if err != nil {
		return err
	}
	kind, driverDSN, err := parseDSN(dsn)
	if err != nil {
		return err
	}
	listenCfg, err := f.listenConfig(kind)
	if err != nil {
		return err
	}
	if err := sqliteMustExist(kind, driverDSN); err != nil {
		return err
	}

	mp, metrics, err := newMetrics()
	if err != nil {
		return err
	}
	defer func() { _ = mp.Shutdown(context.Background()) }()
	obs, err := outboxotel.NewObserver(outboxotel.WithMeterProvider(mp), outboxotel.WithMessagingSystem(scheme))
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}

	ready := readiness{redact: r.redact}
	var wg sync.WaitGroup
	httpErr := make(chan error, 1)
	if f.http != "" {
		hs, err := listenHealth(f.http, metrics, &ready, f.ui, log)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			httpErr <- hs.serve()
		}()
		defer func() {
			hs.shutdown(httpShutdownWait)
			wg.Wait()
		}()
		log.Info("serving /metrics, /healthz and /readyz", "addr", hs.ln.Addr().String())
	}

	db, err := connectDB(ctx, kind, driverDSN, r, log)
	if err != nil {
		return err
	}
	if db == nil {
		log.Info("stopped before the database answered")
		return nil
	}
	defer closeDB(db)
	ready.db.Store(db)
	if f.ui {
		adm, err := outboxplugin.NewAdmin(db, outboxplugin.WithAdminTable(a.table))
		if err != nil {
			return usageError{err}
		}
		console, err := outboxui.New(adm, append(consoleOpts, outboxui.WithBasePath("/ui/"))...)
		if err != nil {
			return usageError{err}
		}
		ready.console.Store(console)
		log.Info("serving the console", "url", "http://"+f.http+"/ui/", "writes", f.console.write)
	}

	b, err := openBroker(ctx, scheme, brokerConfig{url: f.broker, subjectPrefix: f.subjectPrefix, stream: f.stream,
		topic: f.topic, kafkaRoots: f.kafkaCA.roots, exchange: f.exchange, starting: &ready.starting}, log)
	if err != nil {
		return err
	}
	if b == nil {
		log.Info("stopped before the broker answered")
		return nil
	}
	defer b.close()
	ready.broker.Store(b)

	opts = append(opts, outboxplugin.WithLogger(log), outboxplugin.WithObserver(obs))
	if listenCfg != nil {
		// Opened as gorm.io/driver/postgres opens the worker's pool (pgx's database/sql driver), whose
		// connections have the WaitForNotification the listener needs. Each worker's listener holds
		// one connection while it runs, and closes it rather than hand it back (it carries LISTEN
		// state) before it takes another; the self-test's NOTIFY goes through --db. So one
		// connection a worker is all the pool is ever asked for, and the bound keeps it so on a
		// server whose connections the pooler is there to spare. Closed once the workers have
		// stopped: the deferred calls run after runWorkers returns.
		listen := stdlib.OpenDB(*listenCfg)
		listen.SetMaxOpenConns(f.workers)
		defer listen.Close()
		opts = append(opts, outboxplugin.WithListenDB(listen))
	}
	workers := make([]*outboxplugin.Worker, f.workers)
	for i := range workers {
		if workers[i], err = outboxplugin.NewWorker(db, b.pub, opts...); err != nil {
			if errors.Is(err, outboxplugin.ErrInvalidOption) {
				return usageError{err}
			}
			return err
		}
	}
	ready.workers.Store(&workers)
	log.Info("relay started", f.startAttrs(scheme, kind, r.redact(dsn), r.redact(f.listenDB), r.redact(f.broker), a.table)...)
	return runWorkers(ctx, workers, httpErr, log)
}

// runWorkers runs the workers until ctx ends, or until one of them or the HTTP server fails, which
// stops the others; it returns once every worker has returned.
func runWorkers(ctx context.Context, workers []*outboxplugin.Worker, httpErr <-chan error, log *slog.Logger) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			if err := w.Run(ctx); err != nil {
				cancel(fmt.Errorf("worker %s: %w", w.Owner(), err))
			}
		})
	}
	go func() {
		select {
		case err := <-httpErr:
			if err != nil {
				cancel(err)
			}
		case <-ctx.Done():
		}
	}()
	<-ctx.Done()
	cause := context.Cause(ctx)
	if errors.Is(cause, context.Canceled) {
		log.Info("stopping: handing back the batches in flight")
	} else {
		log.Error("stopping the other workers", "error", cause)
	}
	wg.Wait()
	if !errors.Is(cause, context.Canceled) {
		return cause
	}
	log.Info("relay stopped")
	return nil
}

// connectDB opens the database and pings it until it answers, with a growing pause between tries;
// it returns nil and no error when ctx ends first. GORM's logging is off (its messages quote SQL and
// driver errors).
func connectDB(ctx context.Context, kind, driverDSN string, r relayRedactor, log *slog.Logger) (*gorm.DB, error) {
	if kind == kindMySQL {
		_ = mysql.SetLogger(mysqlLogger(r))
	}
	db, err := gorm.Open(dialector(kind, driverDSN), &gorm.Config{Logger: logger.Discard, DisableAutomaticPing: true})
	if err != nil {
		return nil, fmt.Errorf("open the %s database: %w", kind, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("open the %s database: %w", kind, err)
	}
	backoff := connectBackoffMin
	for try := 1; ; try++ {
		pctx, cancel := context.WithTimeout(ctx, connectPingTimeout)
		err := sqlDB.PingContext(pctx)
		cancel()
		if err == nil {
			if try > 1 {
				log.Info("connected to the database", "tries", try)
			}
			return db, nil
		}
		if ctx.Err() != nil {
			closeDB(db)
			return nil, nil
		}
		log.Warn("database not reachable, retrying", "database", kind, "try", try, "retry_in", backoff.String(), "error", err)
		select {
		case <-ctx.Done():
			closeDB(db)
			return nil, nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, connectBackoffMax)
	}
}

// mysqlLogger is the go-sql-driver logger of the relay: it logs some connection errors itself.
func mysqlLogger(w io.Writer) mysql.Logger { return log.New(w, "[mysql] ", log.LstdFlags) }
