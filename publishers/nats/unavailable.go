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
// Everything else is a refusal, among them two that look like an absent server but are not:
// jetstream.ErrNoStreamResponse, which is what a publish gets when no stream captures its subject
// (a subject or stream configured wrong, which retrying does not mend; the client has already
// retried no-responders twice, 250 ms apart, which covers a stream leader being elected), and
// a stream that refuses the message by its limits (DiscardNew) or by WithExpectedStream. Counting
// those as refusals lets such a message end dead, instead of being retried for ever and making the
// worker take the broker for down each time a batch holds nothing else.
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
