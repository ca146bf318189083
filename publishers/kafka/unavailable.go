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
// Two errors Kafka calls retriable are refusals all the same: UNKNOWN_TOPIC_OR_PARTITION (and
// UNKNOWN_TOPIC_ID), which kgo gives up on after kgo.UnknownTopicRetries because the topic does not
// exist — a topic function or a cluster configured wrong, which waiting does not mend — and
// CORRUPT_MESSAGE, which kgo never retries and which Kafka also returns for a record its topic does
// not take (a null key on a compacted topic). Counting them as refusals lets such a message end dead
// instead of being retried for ever. Everything else (MESSAGE_TOO_LARGE, TOPIC_AUTHORIZATION_FAILED,
// INVALID_RECORD, a record without a topic, ...) is a refusal too.
func unavailable(err error) bool {
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID), errors.Is(err, kerr.CorruptMessage):
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
