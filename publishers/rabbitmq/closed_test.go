package outboxrabbitmq

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/gorm-outbox/outboxplugin"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestClosedError checks how a closed channel fails the messages it did not confirm: as not
// delivered when the connection went, as ErrChannelClosed (a refusal of some message) when the broker
// closed the channel with a channel error.
func TestClosedError(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reason  *amqp.Error
		want    error
		refusal bool
	}{
		{"closed by the client", nil, ErrConnectionLost, false},
		{"network error", &amqp.Error{Code: amqp.FrameError, Reason: "EOF"}, ErrConnectionLost, false},
		{"missed heartbeats", &amqp.Error{Code: amqp.FrameError, Reason: "read tcp: i/o timeout"}, ErrConnectionLost, false},
		{"broker shutting down", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", Server: true}, ErrConnectionLost, false},
		{"exchange not found", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x' in vhost '/'", Server: true, Recover: true}, ErrChannelClosed, true},
		{"message too large", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 200000000 is larger than configured max size 134217728", Server: true, Recover: true}, ErrChannelClosed, true},
		{"access refused", &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - write access to exchange 'x' refused", Server: true, Recover: true}, ErrChannelClosed, true},
	} {
		err := closedError(tc.reason)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v does not wrap %v", tc.name, err, tc.want)
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
