package outboxkafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestUnavailable checks which failures of a record count as Kafka not getting it (no attempt
// spent) and which as a refusal.
func TestUnavailable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &net.AddrError{Err: "connection refused", Addr: "127.0.0.1:9092"}}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"deadline", fmt.Errorf("topic %q: %w", "t", context.DeadlineExceeded), true},
		{"cancelled", context.Canceled, true},
		{"record timeout", kgo.ErrRecordTimeout, true},
		{"record retries", kgo.ErrRecordRetries, true},
		{"client closed", kgo.ErrClientClosed, true},
		{"aborting", kgo.ErrAborting, true},
		{"buffer full", kgo.ErrMaxBuffered, true},
		{"not leader", kerr.NotLeaderForPartition, true},
		{"not enough replicas", kerr.NotEnoughReplicas, true},
		{"request timed out", kerr.RequestTimedOut, true},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"EOF", io.EOF, true},
		{"dial refused", refused, true},

		{"unknown topic", kerr.UnknownTopicOrPartition, false},
		{"unknown topic, retries used up", fmt.Errorf("no partitions available after attempting to refresh metadata 5 times, last err: %w", kerr.UnknownTopicOrPartition), false},
		{"unknown topic id", kerr.UnknownTopicID, false},
		{"corrupt message", kerr.CorruptMessage, false},
		{"too large", kerr.MessageTooLarge, false},
		{"not authorized", kerr.TopicAuthorizationFailed, false},
		{"invalid record", kerr.InvalidRecord, false},
		{"other", errors.New("cannot produce record with no topic and no default topic"), false},
	} {
		if got := unavailable(tc.err); got != tc.want {
			t.Errorf("%s: unavailable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestMisconfigured checks which failures of a record are configuration errors.
func TestMisconfigured(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{kerr.UnknownTopicOrPartition, true},
		{fmt.Errorf("no partitions available after attempting to refresh metadata 5 times, last err: %w", kerr.UnknownTopicOrPartition), true},
		{kerr.UnknownTopicID, true},
		{kerr.TopicAuthorizationFailed, true},
		{kerr.ClusterAuthorizationFailed, true},
		{kerr.SaslAuthenticationFailed, true},
		{kerr.MessageTooLarge, false},
		{kerr.CorruptMessage, false},
		{kerr.NotLeaderForPartition, false},
		{kgo.ErrRecordTimeout, false},
	} {
		if got := misconfigured(tc.err); got != tc.want {
			t.Errorf("misconfigured(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
