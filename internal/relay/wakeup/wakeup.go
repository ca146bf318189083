// Package wakeup wakes a relay when events are committed, on PostgreSQL: it LISTENs on the outbox
// table's channel, on a connection of its own, and calls a function at every notification. The
// capture sends them (pg_notify, in or after the committing transaction); the worker's loop waits on
// what the function signals, and polls all the same.
package wakeup

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/gorm-outbox/outboxplugin/internal/sqlname"
)

// Wake-up on PostgreSQL. The capture side calls pg_notify(<table>, '') inside the statement that
// inserts events (PostgreSQL delivers one notification per channel and payload per transaction, at
// commit); the worker LISTENs on a connection of its own from the pool and wakes Run at once.
// Polling stays the fallback: a lost notification (a dropped connection, PgBouncer in transaction
// mode) only delays events until the next poll.
//
// Waiting for a notification needs the driver's own API: database/sql has none. gorm.io/driver/postgres
// uses pgx, whose connections have WaitForNotification. The core module depends on gorm.io/gorm only,
// so it reaches that method through reflection rather than importing pgx; with another driver, or a
// pgx whose API changed, the worker logs once and polls.

// ErrUnsupported is the error of a driver without pgx's WaitForNotification: the relay polls.
var ErrUnsupported = errors.New("the database driver does not expose pgx's WaitForNotification")

// ErrNotDelivered is the error of a connection that LISTENs and is not sent the notifications of
// other sessions: a transaction pooler (PgBouncer in transaction or statement mode) hands the server
// connection that ran LISTEN to other clients, and the notifications go to them or nowhere. The relay
// polls.
var ErrNotDelivered = errors.New("a notification sent from another connection did not reach the LISTEN connection")

// DefaultProbe bounds the self-test's wait for its notification. A notification between two sessions
// of one server takes milliseconds; the bound is long so that a loaded machine does not turn the
// wake-up off, and costs only wake-ups in the meantime (the relay polls all the same).
const DefaultProbe = 10 * time.Second

// Listener LISTENs on a table's channel and calls Wake at each notification.
type Listener struct {
	// DB is the pool it takes its connection from; Table the outbox table (unquoted), whose name is
	// the channel. Sender is the pool the self-test's notification is sent from (nil: DB): the
	// worker's own, whose server the capture's notifications reach, when DB is another.
	DB     *sql.DB
	Sender *sql.DB
	Table  string
	// Wake is called once LISTEN has taken effect (for the events committed before it), and at every
	// notification. It must not block.
	Wake func()
	// Logger takes what it says of lost connections, with Attrs (the worker's id, say).
	Logger *slog.Logger
	Attrs  []slog.Attr
	// Probe bounds the self-test's wait (0: DefaultProbe); Advice ends what the listener logs when
	// the self-test fails: what to do about it.
	Probe  time.Duration
	Advice string
}

// Run listens until ctx ends, reconnecting with growing pauses after errors (from a second to 30 s).
// With a driver that cannot wait for notifications it says so at INFO and returns at once. Each
// connection tests itself once LISTEN has taken effect: it LISTENs on a channel of its own too, sends
// a notification there from another connection (of Sender, or DB), and waits for it (Probe). When it
// does not come, Run says so once at WARN, with Advice, and returns: the relay polls.
func (l Listener) Run(ctx context.Context) {
	const firstPause = time.Second
	pause := firstPause
	for {
		listened, err := l.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if listened {
			pause = firstPause // the connection worked: a new loss starts the pauses over
		}
		if errors.Is(err, ErrNotDelivered) {
			l.Logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: notifications do not reach the LISTEN connection (a transaction pooler, such as PgBouncer in transaction mode, between it and the server?): no LISTEN wake-up, polling only; "+l.Advice,
				append(l.Attrs[:len(l.Attrs):len(l.Attrs)], slog.Any("reason", err))...)
			return
		}
		if errors.Is(err, ErrUnsupported) {
			l.Logger.LogAttrs(ctx, slog.LevelInfo, "outboxplugin: no LISTEN wake-up, polling only",
				append(l.Attrs[:len(l.Attrs):len(l.Attrs)], slog.Any("reason", err))...)
			return
		}
		l.Logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: LISTEN connection lost, polling meanwhile",
			append(l.Attrs[:len(l.Attrs):len(l.Attrs)], slog.Any("error", err), slog.Duration("retry_in", pause))...)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(pause*2, 30*time.Second)
	}
}

// listenOnce LISTENs on a connection of its own until an error; listened reports whether LISTEN
// took effect.
func (l Listener) listenOnce(ctx context.Context) (listened bool, err error) {
	if l.DB == nil {
		return false, fmt.Errorf("%w: no *sql.DB", ErrUnsupported)
	}
	conn, err := l.DB.Conn(ctx)
	if err != nil {
		return false, err
	}
	// The connection carries LISTEN state (and may have been interrupted mid-read): never hand it
	// back to the pool, close it.
	defer func() {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
	}()
	probe := "outboxplugin_probe_" + randomHex()
	if _, err := conn.ExecContext(ctx, "LISTEN "+sqlname.PGIdent(l.Table)+"; LISTEN "+probe); err != nil {
		return false, err
	}
	// Events committed before LISTEN took effect would otherwise wait for a poll.
	l.Wake()
	if err := l.selfTest(ctx, conn, probe); err != nil {
		return true, err
	}
	for {
		if _, err := l.wait(ctx, conn); err != nil {
			return true, err
		}
		l.Wake()
	}
}

// selfTest sends a notification on the channel probe, which conn LISTENs on, from another connection
// of the pool (as a committing transaction's comes), and waits for it on conn for l.Probe; the
// table's notifications that come meanwhile wake the relay as usual. It returns ErrNotDelivered when
// the notification does not come.
func (l Listener) selfTest(ctx context.Context, conn *sql.Conn, probe string) error {
	sender := l.Sender
	if sender == nil {
		sender = l.DB
	}
	if _, err := sender.ExecContext(ctx, "SELECT pg_notify($1, '')", probe); err != nil {
		return fmt.Errorf("self-test: send a notification: %w", err)
	}
	bound := l.Probe
	if bound <= 0 {
		bound = DefaultProbe
	}
	pctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for {
		channel, err := l.wait(pctx, conn)
		switch {
		case err != nil && ctx.Err() == nil && pctx.Err() != nil:
			return fmt.Errorf("%w (waited %v)", ErrNotDelivered, bound)
		case err != nil:
			return err
		case channel == probe:
			if _, err := conn.ExecContext(ctx, "UNLISTEN "+probe); err != nil {
				return err
			}
			l.Logger.LogAttrs(ctx, slog.LevelDebug, "outboxplugin: LISTEN self-test passed: notifications arrive", l.Attrs...)
			return nil
		}
		l.Wake()
	}
}

// wait waits on conn for a notification and returns its channel.
func (l Listener) wait(ctx context.Context, conn *sql.Conn) (channel string, err error) {
	err = conn.Raw(func(dc any) error {
		channel, err = waitForNotification(ctx, dc)
		return err
	})
	return channel, err
}

// randomHex is 16 random hex digits: a probe channel no other connection listens on.
func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

var (
	contextType = reflect.TypeFor[context.Context]()
	errorType   = reflect.TypeFor[error]()
)

// waitForNotification calls (*stdlib.Conn).Conn().WaitForNotification(ctx) on a pgx connection and
// returns the notification's Channel.
func waitForNotification(ctx context.Context, driverConn any) (channel string, err error) {
	connMethod := reflect.ValueOf(driverConn).MethodByName("Conn")
	if !connMethod.IsValid() || connMethod.Type().NumIn() != 0 || connMethod.Type().NumOut() != 1 {
		return "", fmt.Errorf("%w (%T)", ErrUnsupported, driverConn)
	}
	pgxConn := connMethod.Call(nil)[0]
	wait := pgxConn.MethodByName("WaitForNotification")
	if !wait.IsValid() {
		return "", fmt.Errorf("%w (%s)", ErrUnsupported, pgxConn.Type())
	}
	t := wait.Type()
	if t.NumIn() != 1 || t.In(0) != contextType || t.NumOut() != 2 || t.Out(1) != errorType {
		return "", fmt.Errorf("%w (signature %s)", ErrUnsupported, t)
	}
	if n := t.Out(0); n.Kind() != reflect.Pointer || n.Elem().Kind() != reflect.Struct {
		return "", fmt.Errorf("%w (signature %s)", ErrUnsupported, t)
	} else if f, ok := n.Elem().FieldByName("Channel"); !ok || f.Type.Kind() != reflect.String {
		return "", fmt.Errorf("%w (signature %s)", ErrUnsupported, t)
	}
	out := wait.Call([]reflect.Value{reflect.ValueOf(ctx)})
	if errV := out[1]; !errV.IsNil() {
		return "", errV.Interface().(error)
	}
	if out[0].IsNil() {
		return "", nil
	}
	return out[0].Elem().FieldByName("Channel").String(), nil
}
