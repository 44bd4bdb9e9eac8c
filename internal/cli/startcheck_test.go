package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// redisReply is an error reply from Redis, as go-redis returns it.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

var _ redis.Error = redisReply("")

// TestRefusedError checks the one sentence a replica exits with when Redis
// refuses it at start: where Redis is, what it answered (without the keys
// and hashes it echoes), and which setting to look at.
func TestRefusedError(t *testing.T) {
	single := config.Redis{Addr: "10.0.0.5:6379", Password: "hunter2"}
	sentinel := config.Redis{MasterName: "mymaster", Addrs: []string{"s1:26379", "s2:26379"}, Password: "hunter2"}
	for _, tc := range []struct {
		rc    config.Redis
		reply string
		want  string
	}{
		{single, "WRONGPASS invalid username-password pair or user is disabled.",
			"redis at 10.0.0.5:6379 refused this replica: WRONGPASS invalid username-password pair or user is disabled; check redis.username and redis.password"},
		{sentinel, "NOAUTH Authentication required.",
			"redis at master mymaster of the sentinels s1:26379, s2:26379 refused this replica: NOAUTH Authentication required; check redis.username and redis.password"},
		{single, "NOPERM this user has no permissions to run the 'evalsha' command",
			"NOPERM this user has no permissions to run the 'evalsha' command; the Redis user needs EVAL, EVALSHA, SCRIPT"},
		{single, "ERR DB index is out of range", "ERR DB index is out of range; check redis.db"},
		{single, "ERR unknown command 'evalsha', with args beginning with: 'abc' '3' 'throttle:{x}:state'",
			"ERR unknown command 'evalsha'; the bucket needs Lua scripts"},
	} {
		err := refusedError(tc.rc, &backend.StoreError{Op: "status", Bucket: "x", Err: redisReply(tc.reply), Misconfigured: true})
		if got := err.Error(); !strings.Contains(got, tc.want) || strings.Contains(got, "hunter2") || strings.Contains(got, "throttle:{x}") {
			t.Errorf("refusedError(%q) = %q, want it to contain %q, and neither the password nor the echoed keys", tc.reply, got, tc.want)
		}
		if !errors.Is(err, limiter.ErrMisconfigured) {
			t.Errorf("refusedError(%q) does not match limiter.ErrMisconfigured", tc.reply)
		}
	}
}
