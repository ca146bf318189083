package outboxredis

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// unavailable reports whether err, the error of one XADD of a pipeline, says Redis did not get the
// command, or did not take it for a reason of its own state, rather than refused it: Publish then
// wraps it with outboxplugin.ErrBrokerUnavailable, and the worker retries the message without
// spending an attempt.
//
// An error that is not a reply of Redis (redis.Error) is one of the connection or the client: a lost,
// reset or refused connection, a read or write timeout, a pool timeout, a closed client, the end of
// ctx. Among the replies, those go-redis itself retries — LOADING (a dataset being loaded), READONLY
// (a replica, during a failover), MASTERDOWN, CLUSTERDOWN, TRYAGAIN, NOREPLICAS, max clients
// reached — and OOM (used memory over maxmemory, which fails every write until memory is freed)
// describe the server, not the command: counting them as refusals would kill events for a server
// that is full or failing over. WRONGTYPE, NOAUTH, WRONGPASS and NOPERM are configuration errors
// (misconfigured). Every other reply — a syntax error, ... — is a refusal of that message.
func unavailable(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsClusterDownError(err) || redis.IsTryAgainError(err) || redis.IsNoReplicasError(err) ||
		redis.IsMaxClientsError(err) || redis.IsOOMError(err)
}

// misconfigured reports whether err, the error of one XADD, says Redis or the publisher is configured
// wrong: the stream's key holds another type (WRONGTYPE), the login is missing or refused (NOAUTH,
// WRONGPASS), or the user may not run the command or touch the key (NOPERM).
func misconfigured(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	for _, prefix := range []string{"WRONGTYPE", "NOAUTH", "WRONGPASS", "NOPERM"} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
}
