package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gorm-outbox/outboxplugin"
	"github.com/nats-io/nats.go/jetstream"
)

var _ outboxplugin.CheckingPublisher = (*Publisher)(nil)

// WithCheckSubjects sets the subjects Check looks up streams for: each, wildcards allowed, must be
// captured, at least in part, by a JetStream stream. The default is "outbox.>" with DefaultSubject and
// none with WithSubject (whose subjects the publisher cannot know in advance): give the subjects, or
// a wildcard over them, here.
func WithCheckSubjects(subjects ...string) Option {
	return func(p *Publisher) error {
		for _, s := range subjects {
			if s == "" || strings.ContainsAny(s, " \t\r\n") {
				return fmt.Errorf("%w: check subject %q", outboxplugin.ErrInvalidOption, s)
			}
		}
		p.checkSubjects = append([]string{}, subjects...)
		return nil
	}
}

// Check tells whether the server takes the publisher's messages before it is given any
// (outboxplugin.CheckingPublisher: the worker calls it when Run starts): it returns nil when the
// connection is up, the stream of WithExpectedStream exists, and a stream captures each subject of
// WithCheckSubjects. A failure names what is missing and the server, and wraps
// outboxplugin.ErrMisconfigured when it is the configuration's (credentials refused, no stream),
// outboxplugin.ErrBrokerUnavailable when the server does not answer. A stream that captures part of a
// wildcard subject passes: subjects it leaves out fail at publish, with ErrMisconfigured too.
func (p *Publisher) Check(ctx context.Context) error {
	nc := p.js.Conn()
	if err := connected(nc); err != nil {
		if refused := nc.LastError(); misconfigured(refused) {
			return fmt.Errorf("outboxnats: check: %w: the server refused the credentials (server %s): %w", outboxplugin.ErrMisconfigured, serverOf(nc), refused)
		}
		return fmt.Errorf("outboxnats: check: %w: server %s: %w", outboxplugin.ErrBrokerUnavailable, serverOf(nc), err)
	}
	if p.expectedStream != "" {
		if _, err := p.js.Stream(ctx, p.expectedStream); err != nil {
			return p.checkError(fmt.Sprintf("stream %q", p.expectedStream), err)
		}
	}
	for _, subject := range p.checkSubjects {
		if _, err := p.js.StreamNameBySubject(ctx, subject); err != nil {
			return p.checkError(fmt.Sprintf("a stream capturing subject %q", subject), err)
		}
	}
	return nil
}

// checkError is Check's error for a lookup of what that failed with err.
func (p *Publisher) checkError(what string, err error) error {
	server := serverOf(p.js.Conn())
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("outboxnats: check: %w: no %s (server %s)", outboxplugin.ErrMisconfigured, strings.TrimPrefix(what, "a "), server)
	case misconfigured(err):
		return fmt.Errorf("outboxnats: check: %w: look up %s (server %s): %w", outboxplugin.ErrMisconfigured, what, server, err)
	}
	return fmt.Errorf("outboxnats: check: %w: look up %s (server %s): %w", outboxplugin.ErrBrokerUnavailable, what, server, err)
}
