package redislimiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// clocked drives the real scripts at explicit instants. Production code
// always passes 0, which makes the scripts read Redis TIME.
type clocked struct{ s *Store }

func (c clocked) TakeAt(now time.Time, req backend.TakeRequest) (backend.TakeResult, error) {
	return c.s.take(context.Background(), now.UnixMicro(), req)
}

func (c clocked) RefundAt(now time.Time, n int) error {
	return c.s.refund(context.Background(), now.UnixMicro(), n, limiter.PriorityHigh, false)
}

func (c clocked) RefundPastAt(now time.Time, n int) error {
	return c.s.refund(context.Background(), now.UnixMicro(), n, limiter.PriorityHigh, true)
}

func (c clocked) PauseAt(now time.Time, d time.Duration) error {
	return c.s.pause(context.Background(), now.UnixMicro(), d, "")
}

func (c clocked) DrainAt(now time.Time, debt int) error {
	return c.s.drain(context.Background(), now.UnixMicro(), debt)
}

func (c clocked) StatusAt(now time.Time) (limiter.State, error) {
	return c.s.status(context.Background(), now.UnixMicro())
}

func newClient(t testing.TB) redis.UniversalClient {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	return c
}

// uniqueBucket returns a bucket name no other test uses, and deletes its
// keys when the test ends.
func uniqueBucket(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	name := fmt.Sprintf("test-%d-%x", time.Now().UnixNano(), rand.Uint64())
	t.Cleanup(func() {
		base := DefaultPrefix + "{" + name + "}:"
		c.Del(context.Background(), base+"state", base+"override", base+"replicas", base+"configs", base+"paid-secret")
	})
	return name
}

func TestRedisSteps(t *testing.T) {
	c := newClient(t)
	storetest.Run(t, func(t *testing.T, rate float64, burst int) storetest.ClockedStore {
		s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: rate, Burst: burst})
		if err != nil {
			t.Fatal(err)
		}
		return clocked{s}
	})
}
