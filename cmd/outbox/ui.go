package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	outboxui "github.com/gorm-outbox/outboxplugin/ui"
)

func init() { register(newUICmd) }

// consoleFlags configure the web console, for `outbox ui` and for `outbox relay --ui`; prefix is ""
// for the first and "ui-" for the second.
type consoleFlags struct {
	write        bool
	user         string
	passwordFile string
	hidePayloads bool
}

func (c *consoleFlags) register(fl *pflag.FlagSet, prefix string) {
	fl.BoolVar(&c.write, prefix+"write", false, "enable requeue and discard of failed events and deliver-now of scheduled ones (needs --"+prefix+"user and --"+prefix+"password-file)")
	fl.StringVar(&c.user, prefix+"user", "", "with --"+prefix+"password-file: the user every page (and every change) needs, by HTTP basic authentication")
	fl.StringVar(&c.passwordFile, prefix+"password-file", "", "a file holding the password of --"+prefix+"user (a mounted secret)")
	fl.BoolVar(&c.hidePayloads, prefix+"hide-payloads", false, "do not show the events' payloads (for outboxes that carry personal data)")
}

// options returns the console's options, or a usage error for flags that do not go together. With a
// user, every page needs it; writes need one.
func (c *consoleFlags) options(prefix string, log *slog.Logger) ([]outboxui.Option, error) {
	opts := []outboxui.Option{outboxui.WithLogger(log)}
	if (c.user == "") != (c.passwordFile == "") {
		return nil, usagef("--%suser and --%spassword-file go together", prefix, prefix)
	}
	if c.user != "" {
		b, err := os.ReadFile(c.passwordFile)
		if err != nil {
			return nil, usagef("--%spassword-file: %w", prefix, err)
		}
		pass := strings.TrimSpace(string(b))
		if pass == "" {
			return nil, usagef("--%spassword-file %s is empty", prefix, c.passwordFile)
		}
		auth := outboxui.BasicAuth(map[string]string{c.user: pass})
		opts = append(opts, outboxui.WithReadAuth(auth))
		if c.write {
			opts = append(opts, outboxui.WithWrites(auth))
		}
	} else if c.write {
		return nil, usagef("--%swrite needs --%suser and --%spassword-file: every change is made by a user, whom the log names", prefix, prefix, prefix)
	}
	if c.hidePayloads {
		opts = append(opts, outboxui.WithHidePayloads())
	}
	return opts, nil
}

const uiLong = `ui serves the web console of the outbox table on --http: counts per state, the oldest pending
event's age, the events published in the last minutes and their lag, the events with filters, one
event with its payload and last error, and the dead events grouped by type and error.

It is read-only unless --write is given. --write needs --user and --password-file: with them every
page asks for that user (HTTP basic authentication), and every requeue, discard or deliver-now is
confirmed on a page of its own and logged with the user. It listens on 127.0.0.1 unless --http names another
address; on any other address, give it a user, or put it behind a proxy that authenticates.`

func newUICmd(a *app) *cobra.Command {
	var (
		c                   consoleFlags
		addr                string
		logFormat, logLevel string
	)
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web console of the outbox table",
		Long:  uiLong,
		Example: `  outbox ui --db postgres://app@db.internal/shop
  outbox ui --db shop.db --http 127.0.0.1:8081 --hide-payloads
  outbox ui --db-file /run/secrets/dsn --http :8080 --write --user oncall --password-file /run/secrets/ui`,
		Args: noArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			log, err := (&relayFlags{logFormat: logFormat, logLevel: logLevel}).newLogger(redactingWriter{a})
			if err != nil {
				return err
			}
			opts, err := c.options("", log)
			if err != nil {
				return err
			}
			if _, err := a.readDSN(); err != nil {
				return err
			}
			return a.serveConsole(cmd.Context(), addr, opts, c, log)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&addr, "http", "127.0.0.1:8080", "address to serve the console on")
	c.register(fl, "")
	fl.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

// serveConsole serves the console of --table on addr until ctx ends (SIGTERM, SIGINT).
func (a *app) serveConsole(ctx context.Context, addr string, opts []outboxui.Option, c consoleFlags, log *slog.Logger) error {
	adm, closeDB, err := a.admin(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	// A console of a table that is not there answers every page with an error: say so now instead.
	if _, err := adm.CheckTable(ctx); err != nil && missingTable(err) {
		return err
	}
	console, err := outboxui.New(adm, opts...)
	if err != nil {
		return usageError{err}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--http %s: %w", addr, err)
	}
	if c.user == "" && !isLoopback(ln.Addr()) {
		log.Warn("the console is served beyond this host without a user: anyone who reaches it reads the outbox; give --user and --password-file", "addr", ln.Addr().String())
	}
	srv := &http.Server{Handler: console, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	log.Info("console listening", "url", "http://"+ln.Addr().String()+"/", "table", a.table, "writes", c.write, "hide_payloads", c.hidePayloads)
	select {
	case err := <-done:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), httpShutdownWait)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	log.Info("console stopped")
	return nil
}

func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
