package outboxnats

import (
	"context"
	"errors"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// unavailable reports whether err, the failure of one message, says the broker did not get the
// message rather than refused it: Publish then wraps it with outboxplugin.ErrBrokerUnavailable, and
// the worker retries the message without spending an attempt.
//
// The broker did not get it when the connection was down, lost or closed (a connection that gave up
// reconnecting, or was closed or drained by its owner, is no refusal either: nothing was sent), when
// no acknowledgement came in time (ctx, or jetstream.WithPublishAsyncTimeout), and when JetStream
// answered 503: temporarily unavailable (no stream leader yet), out of resources, not enabled.
//
// A subject no stream captures (jetstream.ErrNoStreamResponse: the client has already retried
// no-responders twice, 250 ms apart, which covers a stream leader being elected), a message the
// stream named by WithExpectedStream does not capture, and credentials or permissions the server
// refuses are configuration errors (misconfigured): Publish wraps them with
// outboxplugin.ErrMisconfigured, which spends no attempt either, but is reported apart.
//
// Everything else is a refusal, a stream that refuses the message by its limits (DiscardNew) among
// them: the retry spends an attempt.
func unavailable(err error) bool {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return true
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining),
		errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrNoServers),
		errors.Is(err, nats.ErrStaleConnection), errors.Is(err, nats.ErrTimeout):
		return true
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, jetstream.ErrTooManyStalledMsgs),
		errors.Is(err, jetstream.ErrJetStreamPublisherClosed):
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == http.StatusServiceUnavailable
}

// JetStream error codes of configuration errors.
const (
	errCodeStreamNotMatch jetstream.ErrorCode = 10060 // the expected stream is not the subject's
)

// misconfigured reports whether err, the failure of one message, says the relay or the server is
// configured wrong (see unavailable): no stream captures the subject, the expected stream does not,
// the server refused the credentials or the permission to publish.
func misconfigured(err error) bool {
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrPermissionViolation):
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamNotMatch
}
