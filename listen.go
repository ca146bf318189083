package outboxplugin

import (
	"context"
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

var errListenUnsupported = errors.New("the database driver does not expose pgx's WaitForNotification")

// listen runs until ctx ends, reconnecting with growing pauses after errors.
func (w *Worker) listen(ctx context.Context) {
	const firstPause = time.Second
	pause := firstPause
	for {
		listened, err := w.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if listened {
			pause = firstPause // the connection worked: a new loss starts the pauses over
		}
		if errors.Is(err, errListenUnsupported) {
			w.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "outboxplugin: no LISTEN wake-up, polling only",
				slog.String("worker", w.owner), slog.Any("reason", err))
			return
		}
		w.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "outboxplugin: LISTEN connection lost, polling meanwhile",
			slog.String("worker", w.owner), slog.Any("error", err), slog.Duration("retry_in", pause))
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
func (w *Worker) listenOnce(ctx context.Context) (listened bool, err error) {
	sqlDB, err := w.db.DB()
	if err != nil {
		return false, fmt.Errorf("%w: %w", errListenUnsupported, err)
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return false, err
	}
	// The connection carries LISTEN state (and may have been interrupted mid-read): never hand it
	// back to the pool, close it.
	defer func() {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
	}()
	if _, err := conn.ExecContext(ctx, "LISTEN "+sqlname.PGIdent(w.cfg.table)); err != nil {
		return false, err
	}
	// Events committed before LISTEN took effect would otherwise wait for a poll.
	w.Wake()
	for {
		err := conn.Raw(func(dc any) error { return waitForNotification(ctx, dc) })
		if err != nil {
			return true, err
		}
		w.Wake()
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
		return fmt.Errorf("%w (%T)", errListenUnsupported, driverConn)
	}
	pgxConn := connMethod.Call(nil)[0]
	wait := pgxConn.MethodByName("WaitForNotification")
	if !wait.IsValid() {
		return fmt.Errorf("%w (%s)", errListenUnsupported, pgxConn.Type())
	}
	t := wait.Type()
	if t.NumIn() != 1 || t.In(0) != contextType || t.NumOut() != 2 || t.Out(1) != errorType {
		return fmt.Errorf("%w (signature %s)", errListenUnsupported, t)
	}
	out := wait.Call([]reflect.Value{reflect.ValueOf(ctx)})
	if errV := out[1]; !errV.IsNil() {
		return errV.Interface().(error)
	}
	return nil
}
