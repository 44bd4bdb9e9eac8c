package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// checkBucket reads the bucket once at start-up: it returns an error when
// Redis refuses this replica (a wrong password or user, missing
// permissions, a wrong db, scripts disabled), which waiting will not cure.
// Otherwise it fills the gauges, warns early about an unreachable Redis,
// and warns when the live replicas are configured with other limits than
// this one and no override settles it: the bucket would follow whichever
// replica asked last.
func checkBucket(ctx context.Context, rc config.Redis, b *limiter.Bucket, store *redislimiter.Store, m *metrics, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := b.Check(ctx)
	if errors.Is(err, limiter.ErrMisconfigured) {
		return refusedError(rc, err)
	}
	if err != nil {
		log.Warn("cannot reach the bucket in redis yet; until it can, the limiter follows limit.on_store_error and limit.fallback_rate (see docs/operations.md, Failure modes)", "error", err)
		return nil
	}
	st, err := b.State(ctx)
	if err != nil {
		return nil
	}
	m.setBucket(st.Tokens, st.Rate)
	if st.Override != nil {
		log.Info("a runtime override wins over the configured rate", "override_rate", st.Override.Rate,
			"override_burst", st.Override.Burst, "expires_in", st.Override.ExpiresIn)
		return nil
	}
	reps, err := store.Admin().Replicas(ctx)
	if err != nil {
		return nil
	}
	rate, burst := store.Limits()
	own := &bucketStatus{Configured: &limitsJSON{Rate: rate, Burst: burst}}
	for _, r := range reps {
		if r.ID != b.ReplicaID() && r.Burst > 0 {
			own.Replicas = append(own.Replicas, replicaJSON{ID: r.ID, Configured: &limitsJSON{Rate: r.Rate, Burst: r.Burst}})
		}
	}
	for _, w := range configWarnings(own, "this replica's config") {
		log.Warn(w)
	}
	return nil
}

// refusedError says in one sentence that Redis refused this replica, what
// it answered, and which setting to look at. err matches
// limiter.ErrMisconfigured; Redis's answers carry no secrets.
func refusedError(rc config.Redis, err error) error {
	cause := err
	var se *backend.StoreError
	if errors.As(err, &se) {
		cause = se.Err // without the bucket and operation: the sentence names them
	}
	msg, _, _ := strings.Cut(cause.Error(), ", with args beginning with") // Redis echoes keys and script hashes
	upper := strings.ToUpper(msg)
	hint := "check the redis section"
	switch {
	case strings.Contains(upper, "WRONGPASS") || strings.Contains(upper, "NOAUTH") || strings.Contains(upper, "AUTH") || strings.Contains(upper, "PASSWORD"):
		hint = "check redis.username and redis.password"
	case strings.Contains(upper, "NOPERM"):
		hint = "the Redis user needs EVAL, EVALSHA, SCRIPT and PUBLISH/SUBSCRIBE on the bucket's keys and channel"
	case strings.Contains(upper, "DB INDEX") || strings.Contains(upper, "INVALID DB"):
		hint = "check redis.db: the server has fewer databases"
	case strings.Contains(upper, "UNKNOWN COMMAND") || strings.Contains(upper, "DISABLED") || strings.Contains(upper, "NOSCRIPT"):
		hint = "the bucket needs Lua scripts (EVAL, EVALSHA), which this Redis does not allow"
	}
	return &redisRefusedError{
		msg: fmt.Sprintf("redis at %s refused this replica: %s; %s", describeRedis(rc), sentence(msg), hint),
		err: err,
	}
}

// redisRefusedError is the sentence of refusedError; it unwraps to the
// store's error, so it still matches limiter.ErrMisconfigured.
type redisRefusedError struct {
	msg string
	err error
}

func (e *redisRefusedError) Error() string { return e.msg }
func (e *redisRefusedError) Unwrap() error { return e.err }

// describeRedis names the Redis a replica uses, without secrets.
func describeRedis(rc config.Redis) string {
	switch {
	case rc.MasterName != "":
		return fmt.Sprintf("master %s of the sentinels %s", rc.MasterName, strings.Join(rc.Addrs, ", "))
	case len(rc.Addrs) > 0:
		return strings.Join(rc.Addrs, ", ")
	}
	return rc.Addr
}
