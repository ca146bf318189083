package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/gorm-outbox/outboxplugin"
	outboxkafka "github.com/gorm-outbox/outboxplugin/publishers/kafka"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
)

// The broker URL schemes the relay takes.
const (
	schemeNATS     = "nats"
	schemeKafka    = "kafka"
	schemeKafkaTLS = "kafkas"
	schemeAMQP     = "amqp"
	schemeAMQPS    = "amqps"
	schemeRedis    = "redis"
)

// schemesHelp lists the schemes in usage errors.
const schemesHelp = "nats://host:4222, kafka://host:9092[,host:9092] (kafkas:// over TLS), " +
	"amqp://user:pass@host:5672/vhost or redis://host:6379/0"

// brokerConfig is what the relay's flags say about the broker.
type brokerConfig struct {
	url           string
	subjectPrefix string         // NATS
	stream        string         // NATS: the expected stream; Redis: the stream key
	topic         string         // Kafka
	kafkaRoots    *x509.CertPool // Kafka over TLS: the roots of --kafka-ca-file, nil for the system's
	exchange      string         // RabbitMQ
	// starting is set, while the first connection is retried, to why it fails when the broker says
	// (a refused login): /readyz tells it.
	starting *atomic.Pointer[string]
}

// startCheckTimeout bounds the connection check of each broker at start-up.
const startCheckTimeout = 5 * time.Second

// logStartCheck logs what a broker's client says at start-up: nothing when it answers; an error when
// it refuses the configuration (credentials, a destination), a warning when it does not answer (its
// client keeps connecting in the background).
func logStartCheck(log *slog.Logger, system, addr string, err error) {
	switch {
	case err == nil:
		log.Info("connected to "+system, "address", addr)
	case errors.Is(err, outboxplugin.ErrMisconfigured):
		log.Error(system+" refused the relay's configuration (credentials or destination); the relay runs, not ready, until it is fixed",
			"address", addr, "error", err)
	default:
		log.Warn(system+" not reachable at start-up; connecting in the background", "address", addr, "error", err)
	}
}

// broker is the connection to the broker and the publisher over it.
type broker struct {
	system string // the messaging.system attribute of the metrics
	pub    outboxplugin.Publisher
	// connected returns nil when the broker answers, or a short reason without credentials.
	connected func(ctx context.Context) error
	close     func()
}

// brokerScheme returns the scheme of the broker URL raw, or a usage error that does not quote raw
// (it may hold a password). kafkas:// is returned as kafka: the broker, and the messaging system of
// the metrics, is the same; parseKafkaURL reads the TLS of the connection.
func brokerScheme(raw string) (string, error) {
	if raw == "" {
		return "", usagef("no broker: give --broker or --broker-file (or OUTBOX_BROKER, OUTBOX_BROKER_FILE): " + schemesHelp)
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	scheme = strings.ToLower(scheme)
	switch {
	case !ok || rest == "":
		return "", usagef("--broker: not a URL: want " + schemesHelp)
	case scheme == schemeKafka || scheme == schemeKafkaTLS:
		_, err := parseKafkaURL(raw)
		return schemeKafka, err
	case scheme != schemeNATS && scheme != schemeRedis && scheme != schemeAMQP && scheme != schemeAMQPS:
		return "", usagef("--broker: unknown scheme %q: want %s", scheme, schemesHelp)
	}
	for _, u := range strings.Split(raw, ",") {
		if _, err := url.Parse(strings.TrimSpace(u)); err != nil {
			return "", usagef("--broker: not a valid %s:// URL", scheme) // url's error quotes the URL
		}
	}
	return scheme, nil
}

// brokerPasswords returns the passwords of the broker URL (one or several, comma-separated) in the
// forms they may be printed in. A URL after the first may leave out the scheme
// (kafka://h1:9092,user:pass@h2:9092): it is read with the first one's. The URL is also read whole,
// for a password with a comma in it, which the split cuts.
func brokerPasswords(raw string) []string {
	pws := passwordsOf(strings.TrimSpace(raw))
	scheme, _, _ := strings.Cut(strings.TrimSpace(raw), "://")
	for _, u := range strings.Split(raw, ",") {
		u = strings.TrimSpace(u)
		if !strings.Contains(u, "://") {
			u = scheme + "://" + u
		}
		pws = append(pws, passwordsOf(u)...)
	}
	return pws
}

// validateSubjectPrefix refuses a NATS subject prefix the server would refuse every message of.
func validateSubjectPrefix(p string) error {
	if p == "" || strings.ContainsAny(p, " \t\r\n*>") || strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") ||
		strings.Contains(p, "..") {
		return usagef("--subject-prefix %q: want dot-separated tokens without wildcards or spaces", p)
	}
	return nil
}

// The SASL mechanisms of a Kafka URL's ?sasl=.
const (
	saslPlain       = "plain"
	saslSCRAMSHA256 = "scram-sha-256"
	saslSCRAMSHA512 = "scram-sha-512"
)

// kafkaURL is what a kafka:// or kafkas:// broker URL says.
type kafkaURL struct {
	seeds []string // host:port of each seed broker
	tls   bool     // kafkas://

	// mechanism is "" without credentials, else one of the saslPlain, saslSCRAMSHA256 and
	// saslSCRAMSHA512 constants.
	mechanism  string
	user, pass string // URL-decoded
}

// parseKafkaURL reads kafka[s]://[user:pass@]host:port[,[kafka[s]://][user:pass@]host:port...][?sasl=...],
// or returns a usage error that does not quote raw.
//
// The credentials are those of the first seed; a later seed may repeat them, not differ from them
// nor bring them alone. The user and the password are URL-decoded, so a comma, @, :, / or ? in
// them is written URL-encoded (%2C, %40, ...). ?sasl=plain|scram-sha-256|scram-sha-512 (on any
// seed, conventionally the last) picks the mechanism; credentials without it use SCRAM-SHA-512,
// which never sends the password. PLAIN, which does, is used only when asked for. kafkas:// on one
// seed and kafka:// on another is refused: TLS is the client's, for all brokers or none.
func parseKafkaURL(raw string) (kafkaURL, error) {
	// Not user:pass@, which the redaction of the error would take for credentials.
	const want = "want kafka[s]://[credentials@]host:port[,host:port...][?sasl=plain|scram-sha-256|scram-sha-512]"
	var k kafkaURL
	var scheme string
	for i, s := range strings.Split(raw, ",") {
		s = strings.TrimSpace(s)
		seedScheme, rest, ok := strings.Cut(s, "://")
		if !ok && i > 0 {
			seedScheme, rest = scheme, s
		}
		seedScheme = strings.ToLower(seedScheme)
		switch {
		case seedScheme != schemeKafka && seedScheme != schemeKafkaTLS:
			return kafkaURL{}, usagef("--broker: seed %d: %s", i+1, want)
		case i == 0:
			scheme = seedScheme
		case seedScheme != scheme:
			return kafkaURL{}, usagef("--broker: seed %d is %s:// after %s://: TLS is for all the brokers or none", i+1, seedScheme, scheme)
		}
		u, err := url.Parse(seedScheme + "://" + rest)
		if err != nil || u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
			// url's error quotes the URL.
			return kafkaURL{}, usagef("--broker: seed %d is not a valid URL (URL-encode , @ : / ? # %% in the user and password): %s", i+1, want)
		}
		if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
			return kafkaURL{}, usagef("--broker: seed %d has no host:port: %s", i+1, want)
		}
		k.seeds = append(k.seeds, u.Host)

		if u.User != nil {
			user := u.User.Username()
			pass, _ := u.User.Password()
			switch {
			case user == "" || pass == "":
				return kafkaURL{}, usagef("--broker: seed %d: Kafka credentials are user:password, neither empty", i+1)
			case i == 0:
				k.user, k.pass = user, pass
			case k.user == "":
				return kafkaURL{}, usagef("--broker: credentials on seed %d but not on the first: give them on the first seed", i+1)
			case user != k.user || pass != k.pass:
				return kafkaURL{}, usagef("--broker: seed %d has credentials other than the first's: the client has one login", i+1)
			}
		}

		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return kafkaURL{}, usagef("--broker: seed %d has an invalid query: %s", i+1, want)
		}
		for key, vs := range q {
			if key != "sasl" {
				return kafkaURL{}, usagef("--broker: seed %d has a query parameter other than sasl: %s", i+1, want)
			}
			for _, v := range vs {
				m := strings.ToLower(v)
				if m != saslPlain && m != saslSCRAMSHA256 && m != saslSCRAMSHA512 {
					return kafkaURL{}, usagef("--broker: seed %d: unknown SASL mechanism: want sasl=plain, scram-sha-256 or scram-sha-512", i+1)
				}
				if k.mechanism != "" && k.mechanism != m {
					return kafkaURL{}, usagef("--broker: two SASL mechanisms, %s and %s: give one", k.mechanism, m)
				}
				k.mechanism = m
			}
		}
	}
	switch {
	case k.mechanism != "" && k.user == "":
		return kafkaURL{}, usagef("--broker: sasl=%s without credentials: give them on the first seed", k.mechanism)
	case k.user != "" && k.mechanism == "":
		k.mechanism = saslSCRAMSHA512
	}
	k.tls = scheme == schemeKafkaTLS
	return k, nil
}

// saslMechanism returns the franz-go mechanism of k's credentials, or nil without credentials.
func (k kafkaURL) saslMechanism() sasl.Mechanism {
	switch k.mechanism {
	case saslPlain:
		return plain.Auth{User: k.user, Pass: k.pass}.AsMechanism()
	case saslSCRAMSHA256:
		return scram.Auth{User: k.user, Pass: k.pass}.AsSha256Mechanism()
	case saslSCRAMSHA512:
		return scram.Auth{User: k.user, Pass: k.pass}.AsSha512Mechanism()
	}
	return nil
}

// caFile is the value of --kafka-ca-file: a PEM file of certificates that the Kafka client trusts
// besides the system's roots. It is read as the flag is set, so that a missing or unreadable file is
// a usage error before the relay opens anything.
type caFile struct {
	path  string
	roots *x509.CertPool // the system's roots and the file's certificates; nil when unset
}

var _ pflag.Value = (*caFile)(nil)

func (c *caFile) String() string { return c.path }
func (c *caFile) Type() string   { return "path" }

func (c *caFile) Set(path string) error {
	pem, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	roots, err := x509.SystemCertPool()
	if err != nil { // no system roots (a scratch image): the file's alone
		roots = x509.NewCertPool()
	}
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s holds no PEM certificate", path)
	}
	c.path, c.roots = path, roots
	return nil
}

// openBroker connects to the broker of cfg and returns its publisher. A broker down at start-up does
// not fail it: NATS, Kafka and Redis clients connect in the background, and /readyz says so
// meanwhile; RabbitMQ's first connection is retried here, with backoff, until it succeeds or ctx
// ends (nil, nil then).
func openBroker(ctx context.Context, scheme string, cfg brokerConfig, log *slog.Logger) (*broker, error) {
	switch scheme {
	case schemeNATS:
		return openNATS(cfg, log)
	case schemeKafka:
		return openKafka(cfg, log)
	case schemeAMQP, schemeAMQPS:
		return openRabbitMQ(ctx, cfg, log)
	case schemeRedis:
		return openRedis(cfg, log)
	}
	return nil, usagef("--broker: unknown scheme %q", scheme)
}

func openNATS(cfg brokerConfig, log *slog.Logger) (*broker, error) {
	nc, err := nats.Connect(cfg.url,
		nats.Name("outbox relay"),
		nats.RetryOnFailedConnect(true), // NATS down at start-up: keep trying, in the background
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ConnectHandler(func(*nats.Conn) { log.Info("connected to NATS") }),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("reconnected to NATS") }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "error", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrPermissionViolation) {
				log.Error("NATS refused the credentials or a permission", "error", err)
				return
			}
			log.Warn("NATS", "error", err)
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("JetStream: %w", err)
	}
	prefix := cfg.subjectPrefix
	opts := []outboxnats.Option{outboxnats.WithSubject(func(m outboxplugin.Message) string {
		aggregate, event := outboxplugin.RouteTokens(m)
		return prefix + "." + aggregate + "." + event
	}), outboxnats.WithCheckSubjects(prefix + ".>")}
	if cfg.stream != "" {
		opts = append(opts, outboxnats.WithExpectedStream(cfg.stream))
	}
	pub, err := outboxnats.New(js, opts...)
	if err != nil {
		nc.Close()
		return nil, usageError{err}
	}
	if !nc.IsConnected() {
		// The first try failed (RetryOnFailedConnect): say so, and why when the server said.
		err := nc.LastError()
		if err == nil {
			err = nats.ErrNoServers
		}
		if errors.Is(err, nats.ErrAuthorization) {
			err = fmt.Errorf("%w: %w", outboxplugin.ErrMisconfigured, err)
		}
		logStartCheck(log, "NATS", natsServers(cfg.url), err)
	}
	return &broker{
		system: "nats",
		pub:    pub,
		connected: func(context.Context) error {
			if !nc.IsConnected() {
				if err := nc.LastError(); errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) {
					return errors.New("broker refused the credentials (authorization violation)")
				}
				return errors.New("broker not connected")
			}
			return nil
		},
		// The workers have stopped: nothing is in flight.
		close: nc.Close,
	}, nil
}

func openRedis(cfg brokerConfig, log *slog.Logger) (*broker, error) {
	ropts, err := redis.ParseURL(cfg.url)
	if err != nil {
		return nil, usagef("--broker: not a valid redis:// URL") // its error may quote the URL
	}
	// Deadlines cut a publish short on the socket (see outboxredis.New).
	ropts.ContextTimeoutEnabled = true
	client := redis.NewClient(ropts)
	var opts []outboxredis.Option
	if cfg.stream != "" {
		stream := cfg.stream
		opts = append(opts, outboxredis.WithStream(func(outboxplugin.Message) string { return stream }),
			outboxredis.WithCheckStreams(stream))
	}
	pub, err := outboxredis.New(client, opts...)
	if err != nil {
		_ = client.Close()
		return nil, usageError{err}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startCheckTimeout)
	logStartCheck(log, "Redis", ropts.Addr, pub.Check(ctx))
	cancel()
	return &broker{
		system: "redis",
		pub:    pub,
		connected: func(ctx context.Context) error {
			if err := client.Ping(ctx).Err(); err != nil {
				if msg := err.Error(); strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") {
					return errors.New("broker refused the credentials")
				}
				return errors.New("broker not connected")
			}
			return nil
		},
		close: func() { _ = pub.Close(); _ = client.Close() },
	}, nil
}

func openKafka(cfg brokerConfig, log *slog.Logger) (*broker, error) {
	k, err := parseKafkaURL(cfg.url)
	if err != nil {
		return nil, err
	}
	// The configuration outboxkafka.New asks for: acks by all in-sync replicas and the idempotent
	// producer (kgo's defaults), and a timed-out publish that stops being retried by the client.
	kopts := []kgo.Opt{
		kgo.SeedBrokers(k.seeds...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.AllowIdempotentProduceCancellation(),
		kgo.WithLogger(kgo.BasicLogger(slogWriter{log}, kgo.LogLevelWarn, nil)),
	}
	switch {
	case k.tls:
		// kgo sets each dial's ServerName to the broker's host; nil RootCAs are the system's roots.
		kopts = append(kopts, kgo.DialTLSConfig(&tls.Config{RootCAs: cfg.kafkaRoots}))
	case cfg.kafkaRoots != nil:
		return nil, usagef("--kafka-ca-file without TLS: the broker URL is kafka://, want kafkas://")
	}
	if m := k.saslMechanism(); m != nil {
		kopts = append(kopts, kgo.SASL(m))
		if k.mechanism == saslPlain && !k.tls {
			log.Warn("SASL PLAIN without TLS: the Kafka password crosses the network in clear; use kafkas:// or SCRAM")
		}
	}
	client, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, usagef("--broker: %v", err)
	}
	var opts []outboxkafka.Option
	if cfg.topic != "" {
		topic := cfg.topic
		opts = append(opts, outboxkafka.WithTopic(func(outboxplugin.Message) string { return topic }),
			outboxkafka.WithCheckTopics(topic))
	}
	pub, err := outboxkafka.New(client, opts...)
	if err != nil {
		client.Close()
		return nil, usageError{err}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startCheckTimeout)
	logStartCheck(log, "Kafka", strings.Join(k.seeds, ","), pub.Check(ctx))
	cancel()
	return &broker{
		system: "kafka",
		pub:    pub,
		connected: func(ctx context.Context) error {
			if client.Ping(ctx) != nil {
				return errors.New("broker not connected")
			}
			return nil
		},
		close: client.Close,
	}, nil
}

// slogWriter writes kgo's log lines as warnings of the relay's logger.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Warn("kafka", "message", strings.TrimSpace(string(p)))
	return len(p), nil
}

func openRabbitMQ(ctx context.Context, cfg brokerConfig, log *slog.Logger) (*broker, error) {
	uri, err := amqp.ParseURI(cfg.url)
	if err != nil {
		return nil, usagef("--broker: not a valid %s:// URL", strings.ToLower(strings.SplitN(cfg.url, ":", 2)[0]))
	}
	addr := net.JoinHostPort(uri.Host, fmt.Sprint(uri.Port))
	var opts []outboxrabbitmq.Option
	if cfg.exchange != "" {
		opts = append(opts, outboxrabbitmq.WithExchange(cfg.exchange))
	}
	var pub *outboxrabbitmq.Publisher
	backoff := connectBackoffMin
	for try := 1; ; try++ {
		if pub, err = outboxrabbitmq.Dial(cfg.url, opts...); err == nil {
			break
		}
		if errors.Is(err, outboxplugin.ErrInvalidOption) {
			return nil, usageError{err}
		}
		if errors.Is(err, outboxplugin.ErrMisconfigured) {
			// A refused login, vhost or exchange declaration: said as such, and retried — the
			// user or the permission may be created on the broker meanwhile.
			why := "broker refused the relay's configuration (credentials, vhost or exchange)"
			if errors.Is(err, amqp.ErrCredentials) {
				why = "broker refused the credentials"
			}
			if cfg.starting != nil {
				cfg.starting.Store(&why)
			}
			log.Error("RabbitMQ: "+why+"; retrying", "address", addr, "try", try, "retry_in", backoff.String(), "error", err)
		} else {
			log.Warn("RabbitMQ not reachable, retrying", "address", addr, "try", try, "retry_in", backoff.String(), "error", err)
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, connectBackoffMax)
	}
	log.Info("connected to RabbitMQ", "address", addr)
	tp := &trackedPublisher{Publisher: pub}
	return &broker{
		system: "rabbitmq",
		pub:    tp,
		// The publisher reconnects on the next Publish and does not say whether it is connected
		// meanwhile: the broker counts as connected when its last batch was delivered (or none failed
		// yet) and it accepts a TCP connection.
		connected: func(ctx context.Context) error {
			if tp.unavailable.Load() {
				return errors.New("broker not connected")
			}
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return errors.New("broker not reachable")
			}
			_ = conn.Close()
			return nil
		},
		close: func() { _ = pub.Close() },
	}, nil
}

// trackedPublisher remembers whether the last Publish failed for want of the broker.
type trackedPublisher struct {
	*outboxrabbitmq.Publisher
	unavailable atomic.Bool
}

func (p *trackedPublisher) Publish(ctx context.Context, msgs []outboxplugin.Message) error {
	err := p.Publisher.Publish(ctx, msgs)
	p.unavailable.Store(notDelivered(err))
	return err
}

// notDelivered reports whether err, a Publish error, says the broker did not get the batch or one of
// its messages.
func notDelivered(err error) bool {
	if errors.Is(err, outboxplugin.ErrBrokerUnavailable) {
		return true
	}
	var pe *outboxplugin.PublishError
	if errors.As(err, &pe) {
		for _, e := range pe.Failed {
			if errors.Is(e, outboxplugin.ErrBrokerUnavailable) {
				return true
			}
		}
	}
	return false
}

// natsServers names the servers of a NATS URL list without credentials.
func natsServers(raw string) string {
	var out []string
	for _, s := range strings.Split(raw, ",") {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil {
			out = append(out, u.Redacted())
		}
	}
	return strings.Join(out, ",")
}
