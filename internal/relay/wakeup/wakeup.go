// Package wakeup wakes a relay when events are committed, on PostgreSQL: it LISTENs on the outbox
// table's channel, on a connection of its own, and calls a function at every notification. The
// capture sends them (pg_notify, in or after the committing transaction); the worker's loop waits on
// what the function signals, and polls all the same.
package wakeup

import (
	"context"
	"database/sql"
	"database/sql/driver"
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

// Listener LISTENs on a table's channel and calls Wake at each notification.
type Listener struct {
	// DB is the pool it takes its connection from; Table the outbox table (unquoted), whose name is
	// the channel.
	DB    *sql.DB
	Table string
	// Wake is called once LISTEN has taken effect (for the events committed before it), and at every
	// notification. It must not block.
	Wake func()
	// Logger takes what it says of lost connections, with Attrs (the worker's id, say).
	Logger *slog.Logger
	Attrs  []slog.Attr
}

// Run listens until ctx ends, reconnecting with growing pauses after errors (from a second to 30 s).
// With a driver that cannot wait for notifications it says so at INFO and returns at once.
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
	if _, err := conn.ExecContext(ctx, "LISTEN "+sqlname.PGIdent(l.Table)); err != nil {
		return false, err
	}
	// Events committed before LISTEN took effect would otherwise wait for a poll.
	l.Wake()
	for {
		err := conn.Raw(func(dc any) error { return waitForNotification(ctx, dc) })
		if err != nil {
			return true, err
		}
		l.Wake()
	}
}

var (
	contextType = reflect.TypeFor[context.Context]()
	errorType   = reflect.TypeFor[error]()
)

// waitForNotification calls (*stdlib.Conn).Conn().WaitForNotification(ctx) on a pgx connection.
func waitForNotification(ctx context.Context, driverConn any) error {
	connMethod := reflect.ValueOf(driverConn).MethodByName("Conn")
	if !connMethod.IsValid() || connMethod.Type().NumIn() != 0 || connMethod.Type().NumOut() != 1 {
		return fmt.Errorf("%w (%T)", ErrUnsupported, driverConn)
	}
	pgxConn := connMethod.Call(nil)[0]
	wait := pgxConn.MethodByName("WaitForNotification")
	if !wait.IsValid() {
		return fmt.Errorf("%w (%s)", ErrUnsupported, pgxConn.Type())
	}
	t := wait.Type()
	if t.NumIn() != 1 || t.In(0) != contextType || t.NumOut() != 2 || t.Out(1) != errorType {
		return fmt.Errorf("%w (signature %s)", ErrUnsupported, t)
	}
	out := wait.Call([]reflect.Value{reflect.ValueOf(ctx)})
	if errV := out[1]; !errV.IsNil() {
		return errV.Interface().(error)
	}
	return nil
}
