package outboxui

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// ErrInvalidOption is returned (wrapped) by New for an option it cannot use.
var ErrInvalidOption = errors.New("outboxui: invalid option")

// Option configures the console.
type Option func(*config) error

type config struct {
	basePath     string
	writeAuth    Authenticator
	readAuth     Authenticator
	hidePayloads bool
	logger       *slog.Logger
	refresh      int // seconds; 0: no automatic refresh
	csrfKey      []byte
	title        string
}

// WithWrites enables the console's mutations (requeue and discard of failed events, deliver-now of
// scheduled events), for the users auth accepts. Without it the console is read-only: its forms are
// not shown and every POST is refused with 403. auth must not be nil: a mutation always has a user, whom the log names.
func WithWrites(auth Authenticator) Option {
	return func(c *config) error {
		if auth == nil {
			return fmt.Errorf("%w: WithWrites needs an Authenticator (BasicAuth, BearerToken or the application's own)", ErrInvalidOption)
		}
		c.writeAuth = auth
		return nil
	}
}

// WithReadAuth makes every page need a user auth accepts, not only the mutations. Without it the
// pages are readable by whoever reaches the handler: mount it behind the application's own
// authentication, or serve it on loopback (the outbox command's default).
func WithReadAuth(auth Authenticator) Option {
	return func(c *config) error {
		if auth == nil {
			return fmt.Errorf("%w: WithReadAuth needs an Authenticator", ErrInvalidOption)
		}
		c.readAuth = auth
		return nil
	}
}

// WithHidePayloads hides the events' payloads (for outboxes that carry personal data): the event page
// shows their size instead. Headers, keys and errors are still shown.
func WithHidePayloads() Option {
	return func(c *config) error { c.hidePayloads = true; return nil }
}

// WithBasePath sets the path the console is mounted at ("/outbox/"). By default it is taken from the
// ServeMux pattern that routed the request (mux.Handle("/outbox/", h)), or "/" when there is none;
// set it when a router other than net/http's ServeMux mounts the handler under a prefix.
func WithBasePath(path string) Option {
	return func(c *config) error {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "?#\"'<> ") {
			return fmt.Errorf("%w: base path %q: want an absolute path such as /outbox/", ErrInvalidOption, path)
		}
		if !strings.HasSuffix(path, "/") {
			path += "/"
		}
		c.basePath = path
		return nil
	}
}

// WithLogger sets the logger of the mutations (who requeued or discarded what) and of the errors
// the database returned (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// WithRefresh sets how often the overview reloads itself, in seconds (default 10; 0: never).
func WithRefresh(seconds int) Option {
	return func(c *config) error {
		if seconds < 0 || seconds > 3600 {
			return fmt.Errorf("%w: refresh %d s: want 0..3600", ErrInvalidOption, seconds)
		}
		c.refresh = seconds
		return nil
	}
}

// WithCSRFKey sets the key the CSRF tokens are signed with (at least 32 bytes). By default each
// handler draws a random one, so a form loaded from one replica cannot be posted to another behind
// a load balancer without sticky sessions: give every replica the same key.
func WithCSRFKey(key []byte) Option {
	return func(c *config) error {
		if len(key) < 32 {
			return fmt.Errorf("%w: CSRF key of %d bytes: want at least 32", ErrInvalidOption, len(key))
		}
		c.csrfKey = append([]byte(nil), key...)
		return nil
	}
}

// WithTitle sets the name the pages show (default "outbox").
func WithTitle(title string) Option {
	return func(c *config) error {
		if strings.TrimSpace(title) == "" {
			return fmt.Errorf("%w: empty title", ErrInvalidOption)
		}
		c.title = title
		return nil
	}
}
