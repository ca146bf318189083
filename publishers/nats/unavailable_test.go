package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestUnavailable checks which failures of a message count as the broker not getting it (no attempt
// spent) and which as a refusal.
func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"disconnected", nats.ErrDisconnected, true},
		{"disconnected, wrapped", fmt.Errorf("%w (connection RECONNECTING)", nats.ErrDisconnected), true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"connection closed", nats.ErrConnectionClosed, true},
		{"connection draining", nats.ErrConnectionDraining, true},
		{"reconnect buffer full", nats.ErrReconnectBufExceeded, true},
		{"no servers", nats.ErrNoServers, true},
		{"stale connection", nats.ErrStaleConnection, true},
		{"timeout", nats.ErrTimeout, true},
		{"ack timeout", jetstream.ErrAsyncPublishTimeout, true},
		{"window full", jetstream.ErrTooManyStalledMsgs, true},
		{"publisher closed", jetstream.ErrJetStreamPublisherClosed, true},
		{"deadline", fmt.Errorf("no acknowledgement: %w", context.DeadlineExceeded), true},
		{"cancelled", fmt.Errorf("not published: %w", context.Canceled), true},
		{"JetStream 503", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{"JetStream not enabled", jetstream.ErrJetStreamNotEnabled, true},

		{"no stream captures the subject", jetstream.ErrNoStreamResponse, false},
		{"too large", nats.ErrMaxPayload, false},
		{"bad subject", nats.ErrBadSubject, false},
		{"invalid subject", fmt.Errorf("%w: empty", ErrInvalidSubject), false},
		{"headers not supported", nats.ErrHeadersNotSupported, false},
		{"expected stream mismatch", &jetstream.APIError{Code: 400, ErrorCode: 10060, Description: "expected stream does not match"}, false},
		{"stream full, DiscardNew", &jetstream.APIError{Code: 400, ErrorCode: 10077, Description: "maximum messages exceeded"}, false},
		{"invalid ack", jetstream.ErrInvalidJSAck, false},
		{"other", errors.New("something else"), false},
	} {
		if got := unavailable(tc.err); got != tc.want {
			t.Errorf("%s: unavailable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestMisconfigured checks which failures of a message are configuration errors.
func TestMisconfigured(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"no stream captures the subject", jetstream.ErrNoStreamResponse, true},
		{"no stream captures the subject, wrapped", fmt.Errorf("x: %w", jetstream.ErrNoStreamResponse), true},
		{"stream not found", jetstream.ErrStreamNotFound, true},
		{"expected stream mismatch", &jetstream.APIError{Code: 400, ErrorCode: 10060, Description: "expected stream does not match"}, true},
		{"authorization violation", nats.ErrAuthorization, true},
		{"authentication expired", nats.ErrAuthExpired, true},
		{"permissions violation", fmt.Errorf("%w: publish to x", nats.ErrPermissionViolation), true},

		{"disconnected", nats.ErrDisconnected, false},
		{"ack timeout", jetstream.ErrAsyncPublishTimeout, false},
		{"stream full, DiscardNew", &jetstream.APIError{Code: 400, ErrorCode: 10077, Description: "maximum messages exceeded"}, false},
		{"too large", nats.ErrMaxPayload, false},
		{"other", errors.New("something else"), false},
	} {
		if got := misconfigured(tc.err); got != tc.want {
			t.Errorf("%s: misconfigured(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
