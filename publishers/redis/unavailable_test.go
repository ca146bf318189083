package outboxredis

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// replyError is an error reply of Redis, as go-redis returns it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestUnavailable checks which failures of an XADD count as Redis not getting it (no attempt spent)
// and which as a refusal.
func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"EOF", io.EOF, true},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		{"i/o timeout", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, true},
		{"deadline", context.DeadlineExceeded, true},
		{"pool timeout", redis.ErrPoolTimeout, true},
		{"client closed", redis.ErrClosed, true},
		{"LOADING", replyError("LOADING Redis is loading the dataset in memory"), true},
		{"READONLY", replyError("READONLY You can't write against a read only replica."), true},
		{"MASTERDOWN", replyError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{"CLUSTERDOWN", replyError("CLUSTERDOWN The cluster is down"), true},
		{"TRYAGAIN", replyError("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{"OOM", replyError("OOM command not allowed when used memory > 'maxmemory'."), true},
		{"max clients", replyError("ERR max number of clients reached"), true},

		{"WRONGTYPE", replyError("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{"WRONGTYPE, wrapped", fmt.Errorf("XADD s: %w", replyError("WRONGTYPE Operation against a key holding the wrong kind of value")), false},
		{"NOPERM", replyError("NOPERM this user has no permissions to access one of the keys used as arguments"), false},
		{"syntax", replyError("ERR syntax error"), false},
	} {
		if got := unavailable(tc.err); got != tc.want {
			t.Errorf("%s: unavailable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	if unavailable(redis.Nil) {
		t.Error("redis.Nil, the reply of XADD NOMKSTREAM to a missing stream, is a reply: not unavailable")
	}
}

// TestMisconfigured checks which replies are configuration errors.
func TestMisconfigured(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{replyError("WRONGTYPE Operation against a key holding the wrong kind of value"), true},
		{fmt.Errorf("XADD s: %w", replyError("WRONGTYPE Operation against a key holding the wrong kind of value")), true},
		{replyError("NOAUTH Authentication required."), true},
		{replyError("WRONGPASS invalid username-password pair or user is disabled."), true},
		{replyError("NOPERM User u has no permissions to run the 'xadd' command"), true},
		{replyError("ERR syntax error"), false},
		{replyError("LOADING Redis is loading the dataset in memory"), false},
		{fmt.Errorf("dial tcp: connection refused"), false},
	} {
		if got := misconfigured(tc.err); got != tc.want {
			t.Errorf("misconfigured(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
