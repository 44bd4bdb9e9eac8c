package redislimiter

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
)

// storeError wraps err as a *backend.StoreError, marked Misconfigured when
// Redis refused this client in a way that waiting will not cure.
func storeError(op, bucket string, err error) error {
	return &backend.StoreError{Op: op, Bucket: bucket, Err: err, Misconfigured: misconfigured(err)}
}

// misconfigured reports whether err is Redis refusing this client's
// credentials (WRONGPASS, NOAUTH, an AUTH without a password set, a long
// command sent unauthenticated),
// permissions (NOPERM), database (a db index out of range) or scripts
// (EVAL or EVALSHA unknown or disabled, or NOSCRIPT even after go-redis
// fell back to EVAL). Connection failures, timeouts, READONLY replicas,
// LOADING and other transient states are outages, not this.
func misconfigured(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	// MISCONF (a master that cannot persist refuses writes, "... are
	// disabled") and READONLY clear by themselves: outages.
	if strings.HasPrefix(msg, "MISCONF") || strings.HasPrefix(msg, "READONLY") {
		return false
	}
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "NOSCRIPT"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	lower := strings.ToLower(msg)
	for _, s := range []string{
		"db index is out of range", "invalid db index",
		"unknown command", "disabled",
		"auth <password> called without", "client sent auth, but no password is set",
		"invalid password", "invalid username-password",
		"unauthenticated", // a long command before AUTH: "Protocol error: unauthenticated multibulk length"
	} {
		if strings.Contains(lower, s) {
			return true
		}
	}
	return false
}
