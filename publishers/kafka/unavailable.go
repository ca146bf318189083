package outboxkafka

import (
	"errors"
	"net"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// unavailable reports whether err, the failure of one record, says Kafka did not get the record
// rather than refused it: Publish then wraps it with outboxplugin.ErrBrokerUnavailable, and the
// worker retries the message without spending an attempt.
//
// Kafka did not get it when no acknowledgement came in time (ctx, kgo.ErrRecordTimeout), when kgo
// gave up retrying it (kgo.ErrRecordRetries: only retriable errors are retried), on an error kgo or
// Kafka call retriable (a network error, a refused dial, NOT_LEADER_FOR_PARTITION,
// NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT, ...), and when the client was closed or is aborting its
// buffered records, or its buffer is full (kgo.ErrMaxBuffered, flushing by hand).
//
// Two errors Kafka calls retriable are not unavailability: UNKNOWN_TOPIC_OR_PARTITION (and
// UNKNOWN_TOPIC_ID), which kgo gives up on after kgo.UnknownTopicRetries because the topic does not
// exist — a topic function or a cluster configured wrong, which waiting does not mend: a
// configuration error (misconfigured) — and CORRUPT_MESSAGE, which kgo never retries and which Kafka
// also returns for a record its topic does not take (a null key on a compacted topic): a refusal, so
// that such a message ends dead instead of being retried for ever. Everything else
// (MESSAGE_TOO_LARGE, INVALID_RECORD, a record without a topic, ...) is a refusal too.
func unavailable(err error) bool {
	switch {
	case misconfigured(err), errors.Is(err, kerr.CorruptMessage):
		return false
	case isContextErr(err),
		errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, kgo.ErrClientClosed), errors.Is(err, kgo.ErrAborting), errors.Is(err, kgo.ErrMaxBuffered):
		return true
	case kerr.IsRetriable(err), kgo.IsRetryableBrokerErr(err):
		return true
	}
	// A dial error, connection refused among them: kgo leaves it out of IsRetryableBrokerErr only to
	// choose how it retries.
	var opErr *net.OpError
	return errors.As(err, &opErr)
}

// misconfigured reports whether err, the failure of one record, says the client or the cluster is
// configured wrong: the topic does not exist, or the credentials or the permissions are refused.
// Publish wraps it with outboxplugin.ErrMisconfigured: the worker spends no attempt on it, backs off,
// and reports it at error and in Worker.Health.
func misconfigured(err error) bool {
	for _, e := range []error{kerr.UnknownTopicOrPartition, kerr.UnknownTopicID, kerr.TopicAuthorizationFailed,
		kerr.ClusterAuthorizationFailed, kerr.SaslAuthenticationFailed, kerr.UnsupportedSaslMechanism, kerr.IllegalSaslState} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
