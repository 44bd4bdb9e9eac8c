package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// waiter is one replica's limiter, whichever implementation it is.
type waiter interface {
	// Wait blocks until cost tokens are granted or ctx ends.
	Wait(ctx context.Context, cost int) error
	// Close releases what the limiter holds.
	Close() error
	// keys are the Redis keys of the bucket, deleted after the run.
	keys() []string
}

// bucketSpec is the bucket that all the replicas of a run share.
type bucketSpec struct {
	name  string
	rate  float64
	burst int
	// opts are the options of implementations (c) and (d), which set
	// Lease.Disabled themselves.
	opts limiter.Options
}

// impl is one of the compared implementations.
type impl struct {
	key  string // a, b, c or d
	name string
	// new builds one replica's limiter on its own client.
	new func(c *redis.Client, s bucketSpec) (waiter, error)
}

// impls are the four implementations, in table order.
var impls = []impl{
	{"a", "(a) tutorial Lua, client clock, 10 ms poll", newTutorial},
	{"b", "(b) redis_rate v10, sleep RetryAfter", newRedisRate},
	{"c", "(c) throttle, no leasing", func(c *redis.Client, s bucketSpec) (waiter, error) {
		s.opts.Lease.Disabled = true
		return newThrottle(c, s)
	}},
	{"d", "(d) throttle, leasing", func(c *redis.Client, s bucketSpec) (waiter, error) {
		s.opts.Lease.Disabled = false
		return newThrottle(c, s)
	}},
}

// tutorialScript is the token bucket found in most tutorials: the caller
// passes its own clock (seconds, as a float), and the script refills, takes
// and saves the new timestamp, even when it is older than the stored one.
var tutorialScript = redis.NewScript(`
local key = KEYS[1]
local rate, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, requested = tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
if tokens >= requested then
  tokens = tokens - requested
  allowed = 1
end
redis.call('HSET', key, 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', key, math.ceil(capacity / rate * 1000) + 1000)
return allowed
`)

// tutorial is implementation (a): the tutorial script, polled every 10 ms
// while the bucket is empty.
type tutorial struct {
	c           *redis.Client
	key         []string
	rate, burst string
}

func newTutorial(c *redis.Client, s bucketSpec) (waiter, error) {
	return &tutorial{
		c:     c,
		key:   []string{"bench:tutorial:" + s.name},
		rate:  strconv.FormatFloat(s.rate, 'f', -1, 64),
		burst: strconv.Itoa(s.burst),
	}, nil
}

func (t *tutorial) Wait(ctx context.Context, cost int) error {
	for {
		now := strconv.FormatFloat(float64(time.Now().UnixMicro())/1e6, 'f', 6, 64)
		ok, err := tutorialScript.Run(ctx, t.c, t.key, t.rate, t.burst, now, cost).Int()
		if err != nil {
			return fmt.Errorf("tutorial bucket: %w", err)
		}
		if ok == 1 {
			return nil
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

func (t *tutorial) Close() error   { return nil }
func (t *tutorial) keys() []string { return t.key }

// redisRate is implementation (b): go-redis/redis_rate's GCRA script, with
// a loop that sleeps for the RetryAfter it returns.
type redisRate struct {
	l     *redis_rate.Limiter
	key   string
	limit redis_rate.Limit
}

func newRedisRate(c *redis.Client, s bucketSpec) (waiter, error) {
	if s.rate != float64(int(s.rate)) {
		return nil, fmt.Errorf("redis_rate needs a whole rate per second, got %v", s.rate)
	}
	return &redisRate{
		l:     redis_rate.NewLimiter(c),
		key:   "bench:" + s.name,
		limit: redis_rate.Limit{Rate: int(s.rate), Burst: s.burst, Period: time.Second},
	}, nil
}

func (r *redisRate) Wait(ctx context.Context, cost int) error {
	for {
		res, err := r.l.AllowN(ctx, r.key, r.limit, cost)
		if err != nil {
			return fmt.Errorf("redis_rate: %w", err)
		}
		if res.Allowed >= cost {
			return nil
		}
		if err := sleep(ctx, res.RetryAfter); err != nil {
			return err
		}
	}
}

func (r *redisRate) Close() error { return nil }

// keys names the key redis_rate uses: its fixed "rate:" prefix and ours.
func (r *redisRate) keys() []string { return []string{"rate:" + r.key} }

// throttle is implementations (c) and (d): this repository's limiter on
// the Redis store.
type throttle struct {
	*limiter.Bucket
	store *redislimiter.Store
}

func newThrottle(c *redis.Client, s bucketSpec) (waiter, error) {
	store, err := redislimiter.New(c, redislimiter.Config{Bucket: s.name, Rate: s.rate, Burst: s.burst})
	if err != nil {
		return nil, err
	}
	b, err := limiter.New(store, s.opts)
	if err != nil {
		return nil, err
	}
	return &throttle{Bucket: b, store: store}, nil
}

func (t *throttle) keys() []string { return t.store.Keys() }

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
