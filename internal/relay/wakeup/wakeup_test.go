package wakeup

import (
	"context"
	"errors"
	"testing"
)

// Fakes of the shapes waitForNotification reaches through reflection: pgx's stdlib connection, whose
// Conn() returns a *pgx.Conn with WaitForNotification(ctx) (*pgconn.Notification, error).

type notification struct{ Channel string }

type pgxConn struct {
	channel string
	err     error
}

func (c *pgxConn) WaitForNotification(context.Context) (*notification, error) {
	if c.err != nil {
		return nil, c.err
	}
	return &notification{Channel: c.channel}, nil
}

type noChannel struct{}

func (noChannel) WaitForNotification(context.Context) (*struct{ PID uint32 }, error) { return nil, nil }

type noChannelConn struct{}

func (noChannelConn) Conn() noChannel { return noChannel{} }

type stdlibConn struct{ conn *pgxConn }

func (c stdlibConn) Conn() *pgxConn { return c.conn }

type noConn struct{}

type connWithArgs struct{}

func (connWithArgs) Conn(int) *pgxConn { return nil }

type otherConn struct{}

func (otherConn) Conn() struct{} { return struct{}{} }

type badWait struct{}

func (badWait) WaitForNotification() error { return nil }

type badWaitConn struct{}

func (badWaitConn) Conn() badWait { return badWait{} }

// The driver's connection is used when it has pgx's shape, and any other shape is told apart from a
// failed wait: ErrUnsupported makes the relay poll for good, another error makes it listen again.
func TestWaitForNotification(t *testing.T) {
	lost := errors.New("connection lost")
	for _, c := range []struct {
		name        string
		conn        any
		unsupported bool
		want        error
	}{
		{"a notification", stdlibConn{&pgxConn{channel: "outbox_events"}}, false, nil},
		{"a failed wait", stdlibConn{&pgxConn{err: lost}}, false, lost},
		{"no Conn method", noConn{}, true, nil},
		{"Conn with arguments", connWithArgs{}, true, nil},
		{"no WaitForNotification", otherConn{}, true, nil},
		{"WaitForNotification of another signature", badWaitConn{}, true, nil},
		{"a notification without a channel", noChannelConn{}, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			channel, err := waitForNotification(context.Background(), c.conn)
			if got := errors.Is(err, ErrUnsupported); got != c.unsupported {
				t.Fatalf("error %v: unsupported %v, want %v", err, got, c.unsupported)
			}
			if !c.unsupported && !errors.Is(err, c.want) && err != c.want {
				t.Errorf("error %v, want %v", err, c.want)
			}
			if c.name == "a notification" && channel != "outbox_events" {
				t.Errorf("channel %q, want the notification's", channel)
			}
		})
	}
}
