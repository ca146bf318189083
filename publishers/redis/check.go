package outboxredis

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/gorm-outbox/outboxplugin"
)

var _ outboxplugin.CheckingPublisher = (*Publisher)(nil)

// WithCheckStreams sets the stream keys Check looks at: each must be a stream, or not exist yet
// (unless WithNoMkStream, which needs it to exist). There are none by default (the stream of
// DefaultStream and of WithStream depends on the message); give the key here when it is fixed.
func WithCheckStreams(keys ...string) Option {
	return func(c *config) error {
		for _, k := range keys {
			if k == "" {
				return fmt.Errorf("%w: empty check stream", outboxplugin.ErrInvalidOption)
			}
		}
		c.checkStreams = append([]string{}, keys...)
		return nil
	}
}

// Check tells whether Redis takes the publisher's entries before it is given any
// (outboxplugin.CheckingPublisher: the worker calls it when Run starts): PING answers — NOAUTH or
// WRONGPASS is a configuration error, a network error the server unavailable — and each key of
// WithCheckStreams is a stream (or, without WithNoMkStream, does not exist yet). Errors name the key
// and the server, and wrap outboxplugin.ErrMisconfigured or outboxplugin.ErrBrokerUnavailable.
func (p *Publisher) Check(ctx context.Context) error {
	if err := p.client.Ping(ctx).Err(); err != nil {
		if misconfigured(err) {
			return fmt.Errorf("outboxredis: check: %w: the server refused the login (server %s): %w", outboxplugin.ErrMisconfigured, p.addr(), err)
		}
		return fmt.Errorf("outboxredis: check: %w (server %s): %w", outboxplugin.ErrBrokerUnavailable, p.addr(), err)
	}
	for _, key := range p.cfg.checkStreams {
		kind, err := p.client.Type(ctx, key).Result()
		switch {
		case err != nil && misconfigured(err):
			return fmt.Errorf("outboxredis: check: TYPE %s: %w (server %s): %w", key, outboxplugin.ErrMisconfigured, p.addr(), err)
		case err != nil:
			return fmt.Errorf("outboxredis: check: TYPE %s: %w (server %s): %w", key, outboxplugin.ErrBrokerUnavailable, p.addr(), err)
		case kind == "stream", kind == "none" && !p.cfg.noMkStream:
		case kind == "none":
			return fmt.Errorf("outboxredis: check: %w: %w: %s (server %s)", ErrNoStream, outboxplugin.ErrMisconfigured, key, p.addr())
		default:
			return fmt.Errorf("outboxredis: check: %w: key %s holds a %s, not a stream (server %s)", outboxplugin.ErrMisconfigured, key, kind, p.addr())
		}
	}
	return nil
}

// addr names the server(s) of the client, without credentials.
func (p *Publisher) addr() string {
	switch c := p.client.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	case *redis.Ring:
		var addrs []string
		for _, a := range c.Options().Addrs {
			addrs = append(addrs, a)
		}
		return strings.Join(addrs, ",")
	}
	return "unknown"
}
