package outboxrabbitmq

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/gorm-outbox/outboxplugin"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestClosedError checks how a closed channel fails the messages it did not confirm: as not
// delivered when the connection went, as ErrChannelClosed (a refusal of some message) when the broker
// closed the channel with a channel error — and, for a missing exchange or a refused access, as a
// configuration error naming the broker.
func TestClosedError(t *testing.T) {
	p := &Publisher{addr: "127.0.0.1:5672/"}
	for _, tc := range []struct {
		name          string
		reason        *amqp.Error
		want          error
		refusal       bool
		misconfigured bool
	}{
		{"closed by the client", nil, ErrConnectionLost, false, false},
		{"network error", &amqp.Error{Code: amqp.FrameError, Reason: "EOF"}, ErrConnectionLost, false, false},
		{"missed heartbeats", &amqp.Error{Code: amqp.FrameError, Reason: "read tcp: i/o timeout"}, ErrConnectionLost, false, false},
		{"broker shutting down", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", Server: true}, ErrConnectionLost, false, false},
		{"exchange not found", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x' in vhost '/'", Server: true, Recover: true}, ErrChannelClosed, true, true},
		{"message too large", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 200000000 is larger than configured max size 134217728", Server: true, Recover: true}, ErrChannelClosed, true, false},
		{"access refused", &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - write access to exchange 'x' refused", Server: true, Recover: true}, ErrChannelClosed, true, true},
	} {
		err := p.closedError(tc.reason)
		if errors.Is(err, outboxplugin.ErrMisconfigured) != tc.misconfigured {
			t.Errorf("%s: %v: misconfigured %v, want %v", tc.name, err, !tc.misconfigured, tc.misconfigured)
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v does not wrap %v", tc.name, err, tc.want)
		}
		if tc.misconfigured && !strings.Contains(err.Error(), p.addr) {
			t.Errorf("%s: %v does not name the broker", tc.name, err)
		}
		if errors.Is(err, outboxplugin.ErrBrokerUnavailable) == tc.refusal {
			t.Errorf("%s: %v: refusal %v, want %v", tc.name, err, !tc.refusal, tc.refusal)
		}
		if tc.reason != nil && !errors.Is(err, tc.reason) {
			t.Errorf("%s: %v does not keep the reason", tc.name, err)
		}
	}
}

// TestIsNetworkError checks which errors of a publish are the connection's.
func TestIsNetworkError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, true},
		{os.ErrDeadlineExceeded, true},
		{net.ErrClosed, true},
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{amqp.ErrFieldType, false},
		{context.Canceled, false}, // Publish reports the end of ctx before it asks
		{errors.New("other"), false},
	} {
		if got := isNetworkError(tc.err); got != tc.want {
			t.Errorf("isNetworkError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
