package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outboxplugin"
	outboxkafka "github.com/gorm-outbox/outboxplugin/publishers/kafka"
	outboxnats "github.com/gorm-outbox/outboxplugin/publishers/nats"
	outboxrabbitmq "github.com/gorm-outbox/outboxplugin/publishers/rabbitmq"
	outboxredis "github.com/gorm-outbox/outboxplugin/publishers/redis"
)

// The broker URL schemes the relay takes.
const (
	schemeNATS  = "nats"
	schemeKafka = "kafka"
	schemeAMQP  = "amqp"
	schemeAMQPS = "amqps"
	schemeRedis = "redis"
)

// schemesHelp lists the schemes in usage errors.
const schemesHelp = "nats://host:4222, kafka://host:9092[,host:9092], amqp://user:pass@host:5672/vhost or redis://host:6379/0"

// brokerConfig is what the relay's flags say about the broker.
type brokerConfig struct {
	url           string
	subjectPrefix string // NATS
	stream        string // NATS: the expected stream; Redis: the stream key
	topic         string // Kafka
	exchange      string // RabbitMQ
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
// (it may hold a password).
func brokerScheme(raw string) (string, error) {
	if raw == "" {
		return "", usagef("no broker: give --broker or --broker-file (or OUTBOX_BROKER, OUTBOX_BROKER_FILE): " + schemesHelp)
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	scheme = strings.ToLower(scheme)
	switch {
	case !ok || rest == "":
		return "", usagef("--broker: not a URL: want " + schemesHelp)
	case scheme == schemeKafka:
		_, err := kafkaSeeds(raw)
		return scheme, err
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
// forms they may be printed in.
func brokerPasswords(raw string) []string {
	var pws []string
	for _, u := range strings.Split(raw, ",") {
		pws = append(pws, passwordsOf(strings.TrimSpace(u))...)
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

// kafkaSeeds returns the host:port of each broker of kafka://host:port,host:port (each may repeat
// the scheme), or a usage error that does not quote raw.
func kafkaSeeds(raw string) ([]string, error) {
	var seeds []string
	for _, s := range strings.Split(raw, ",") {
		s = strings.TrimSpace(s)
		if len(s) >= len("kafka://") && strings.EqualFold(s[:len("kafka://")], "kafka://") {
			s = s[len("kafka://"):]
		}
		s = strings.TrimSuffix(s, "/")
		if strings.Contains(s, "@") {
			return nil, usagef("--broker: credentials in a kafka:// URL are not supported (no SASL yet)")
		}
		if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
			return nil, usagef("--broker: want kafka://host:port[,host:port...]")
		}
		seeds = append(seeds, s)
	}
	return seeds, nil
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
		return openRedis(cfg)
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
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("NATS", "error", err) }),
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
	})}
	if cfg.stream != "" {
		opts = append(opts, outboxnats.WithExpectedStream(cfg.stream))
	}
	pub, err := outboxnats.New(js, opts...)
	if err != nil {
		nc.Close()
		return nil, usageError{err}
	}
	return &broker{
		system: "nats",
		pub:    pub,
		connected: func(context.Context) error {
			if !nc.IsConnected() {
				return errors.New("broker not connected")
			}
			return nil
		},
		// The workers have stopped: nothing is in flight.
		close: nc.Close,
	}, nil
}

func openRedis(cfg brokerConfig) (*broker, error) {
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
		opts = append(opts, outboxredis.WithStream(func(outboxplugin.Message) string { return stream }))
	}
	pub, err := outboxredis.New(client, opts...)
	if err != nil {
		_ = client.Close()
		return nil, usageError{err}
	}
	return &broker{
		system: "redis",
		pub:    pub,
		connected: func(ctx context.Context) error {
			if client.Ping(ctx).Err() != nil {
				return errors.New("broker not connected")
			}
			return nil
		},
		close: func() { _ = pub.Close(); _ = client.Close() },
	}, nil
}

func openKafka(cfg brokerConfig, log *slog.Logger) (*broker, error) {
	seeds, err := kafkaSeeds(cfg.url)
	if err != nil {
		return nil, err
	}
	// The configuration outboxkafka.New asks for: acks by all in-sync replicas and the idempotent
	// producer (kgo's defaults), and a timed-out publish that stops being retried by the client.
	client, err := kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.AllowIdempotentProduceCancellation(),
		kgo.WithLogger(kgo.BasicLogger(slogWriter{log}, kgo.LogLevelWarn, nil)),
	)
	if err != nil {
		return nil, usagef("--broker: %v", err)
	}
	var opts []outboxkafka.Option
	if cfg.topic != "" {
		topic := cfg.topic
		opts = append(opts, outboxkafka.WithTopic(func(outboxplugin.Message) string { return topic }))
	}
	pub, err := outboxkafka.New(client, opts...)
	if err != nil {
		client.Close()
		return nil, usageError{err}
	}
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
		log.Warn("RabbitMQ not reachable, retrying", "try", try, "retry_in", backoff.String(), "error", err)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, connectBackoffMax)
	}
	log.Info("connected to RabbitMQ")
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
