package redislimiter

import (
	"context"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// TestTakeFastPathSameAsFull runs the take script, whose fast path
// (takeFastLua) decides the plain takes, and the full take alone on the
// same random states and requests, at the same instants, and checks that
// they answer and store the same: the fast path must be the full take's
// arithmetic, not a second behaviour.
func TestTakeFastPathSameAsFull(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	// The full take alone: the script without its fast path, the instant
	// from ARGV[6] as the fast path would pass it, and neither the state
	// it read (load() reads it) nor its check of the override.
	full := redis.NewScript("local TAKE_NOW, TAKE_REAL, TAKE_ST, TAKE_NOOV = tonumber(ARGV[6]), nil, nil, false\n" + strings.TrimPrefix(takeSrc, takeFastLua))
	if full.Hash() == takeScript.Hash() {
		t.Fatal("takeSrc does not start with takeFastLua")
	}
	rng := rand.New(rand.NewPCG(16, 2))
	pick := func(xs ...float64) float64 { return xs[rng.IntN(len(xs))] }
	now := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC).UnixMicro()
	fast, slow := 0, 0
	for i := range 600 {
		rate := pick(0.5, 1, 3, 10, 1000, 1e6, 1e9)
		burst := int(pick(1, 2, 5, 100, 1e6, 1e9))
		cfg := Config{Rate: rate, Burst: burst}
		if rng.IntN(8) == 0 {
			cfg.Warmup = time.Duration(pick(1, 30)) * time.Second
		}
		var stores [2]*Store
		for k := range stores {
			cfg.Bucket = uniqueBucket(t, c)
			s, err := New(c, cfg)
			if err != nil {
				t.Fatal(err)
			}
			stores[k] = s
		}
		// The state: missing, or tokens (whole or not, reserved ahead or
		// not) refilled from a past ts, or paused until a future one;
		// sometimes a pause's "by", a class field or an override.
		state := map[string]any{}
		if rng.IntN(5) > 0 {
			tokens := float64(rng.IntN(2*burst+1) - burst)
			if rng.IntN(2) == 0 {
				tokens += rng.Float64()
			}
			ts := now - rng.Int64N(3_000_000)
			if rng.IntN(6) == 0 {
				ts = now + rng.Int64N(3_000_000)
			}
			state["tokens"], state["ts"] = strconv.FormatFloat(tokens, 'g', 17, 64), strconv.FormatInt(ts, 10)
			if rng.IntN(6) == 0 {
				state["by"] = "r1"
			}
			if rng.IntN(8) == 0 {
				state["p1"] = "2000"
			}
			if rng.IntN(4) == 0 {
				state["q2"] = strconv.Itoa(rng.IntN(burst + 1))
			}
			// The recorded expiry (ms on Redis's clock): long past, or
			// far ahead (then PEXPIRE is skipped).
			switch rng.IntN(4) {
			case 0:
				state["x"] = "1000"
			case 1:
				state["x"] = strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
			}
		}
		override := map[string]any{}
		if rng.IntN(8) == 0 {
			override["rate"] = strconv.FormatFloat(pick(2, 50, 1e6), 'g', -1, 64)
		}
		req := backend.TakeRequest{
			Cost:     1 + rng.IntN(min(burst, 5)),
			Priority: backend.PriorityOfRank(rng.IntN(3)),
			MaxWait:  time.Duration(pick(0, 1, 10)) * time.Second,
		}
		if rng.IntN(3) == 0 {
			req.Extra = rng.IntN(10)
		}
		if rng.IntN(12) == 0 {
			req.Cost = burst + 1
		}
		var res [2]backend.TakeResult
		var errs [2]error
		var after [2]map[string]string
		var ttl, took [2]time.Duration
		var xs [2]string
		first := time.Now() // the expiries below are recorded within time.Since(first)
		for k, s := range stores {
			start := time.Now() // the TTL read below is at most took after it was set
			if len(state) > 0 {
				c.HSet(ctx, s.stateKeys[0], state)
				c.PExpire(ctx, s.stateKeys[0], time.Minute)
			}
			if len(override) > 0 {
				c.HSet(ctx, s.stateKeys[1], override)
			}
			script := takeScript
			if k == 1 {
				script = full
			}
			cmd := script.Run(ctx, c, s.stateKeys, s.takeArgs(req, now)...)
			if str, _ := cmd.Val().(string); strings.Count(str, " ") == 5 {
				if k == 1 {
					t.Fatalf("case %d: the full take replied in the fast path's form %q", i, str)
				}
				fast++
			} else if k == 0 {
				slow++
			}
			res[k], errs[k] = s.takeResult(req, cmd)
			after[k] = c.HGetAll(ctx, s.stateKeys[0]).Val()
			// The recorded expiry follows Redis's clock, a few ms apart
			// between the two calls: compare it within their span, below.
			xs[k] = after[k]["x"]
			delete(after[k], "x")
			ttl[k] = c.PTTL(ctx, s.stateKeys[0]).Val()
			took[k] = time.Since(start)
		}
		// Each TTL was read some time after it was set: at most took.
		slack := took[0] + took[1] + 2*time.Millisecond
		x0, _ := strconv.ParseInt(xs[0], 10, 64)
		x1, _ := strconv.ParseInt(xs[1], 10, 64)
		// Both expiries were recorded on Redis's clock between first and
		// now, so they differ by at most that (and 1 ms of rounding).
		xslack := time.Since(first) + time.Millisecond
		if dx := time.Duration(x0-x1) * time.Millisecond; (xs[0] == "") != (xs[1] == "") || dx < -xslack || dx > xslack {
			t.Fatalf("case %d: recorded expiry %q with the fast path, %q with the full take alone", i, xs[0], xs[1])
		}
		if d := ttl[0] - ttl[1]; !reflect.DeepEqual(res[0], res[1]) || (errs[0] == nil) != (errs[1] == nil) || !reflect.DeepEqual(after[0], after[1]) || d < -slack || d > slack {
			t.Fatalf("case %d: rate %v burst %d warm-up %v, state %v, override %v, %+v:\nwith the fast path %+v, %v, stored %v, TTL %v\nfull take alone    %+v, %v, stored %v, TTL %v",
				i, rate, burst, cfg.Warmup, state, override, req, res[0], errs[0], after[0], ttl[0], res[1], errs[1], after[1], ttl[1])
		}
	}
	if fast < 100 || slow < 100 {
		t.Errorf("the fast path decided %d cases and the full take %d: want at least 100 of each", fast, slow)
	}
	t.Logf("fast path: %d cases, full take: %d", fast, slow)
}

// TestTakeWithoutDefaultArgsAnnouncesPushes: a normal take sends no
// channel (appendTakeArgs leaves the default arguments out), and still
// announces that it pushed a low reservation back, on the bucket's
// channel named after its state key.
func TestTakeWithoutDefaultArgsAnnouncesPushes(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t, 10*time.Second)
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 1, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.takeArgs(backend.TakeRequest{Cost: 1}, 0)); n != 5 {
		t.Fatalf("a normal take sends %d arguments, want 5", n)
	}
	sub := c.Subscribe(ctx, s.channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	low := backend.TakeRequest{Cost: 1, Priority: limiter.PriorityLow, MaxWait: 10 * time.Second}
	for range 2 { // the token, then a reservation
		if res, err := s.Take(ctx, low); err != nil || !res.Granted {
			t.Fatalf("low take = %+v, %v", res, err)
		}
	}
	if res, err := s.Take(ctx, backend.TakeRequest{Cost: 1, MaxWait: 10 * time.Second}); err != nil || !res.Granted {
		t.Fatalf("normal take = %+v, %v", res, err)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil || !strings.HasPrefix(msg.Payload, "push ") {
		t.Fatalf("announcement = %v, %v; want a push", msg, err)
	}
}

// TestTakeFullAgainAtOnceWritesNothing: on Redis's clock, a take after
// which the bucket is full again within a microsecond writes no state (a
// missing key is a full bucket), and the bucket still counts: a take of
// more than a microsecond's refill writes it.
func TestTakeFullAgainAtOnceWritesNothing(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t, 10*time.Second)
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 1e9, Burst: 10_000, NoBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if res, err := s.Take(ctx, backend.TakeRequest{Cost: 1}); err != nil || !res.Granted || res.Remaining != 9999 {
			t.Fatalf("take = %+v, %v; want granted, 9999 left", res, err)
		}
	}
	if n := c.Exists(ctx, s.stateKeys[0]).Val(); n != 0 {
		t.Fatalf("state key exists after takes of 1 at 1e9/s")
	}
	// 1001 tokens take longer than a microsecond to refill at 1e9/s.
	if res, err := s.Take(ctx, backend.TakeRequest{Cost: 1001}); err != nil || !res.Granted || res.Remaining != 8999 {
		t.Fatalf("take = %+v, %v; want granted, 8999 left", res, err)
	}
	if got := c.HGet(ctx, s.stateKeys[0], "tokens").Val(); got != "8999" {
		t.Fatalf("stored tokens = %q, want 8999", got)
	}
}

// TestTakeFullAgainReply runs the take script, which answers the commonest
// take of a bucket far above its demand with the bare instant
// (takeFullAgainLua, fullAgainResult), and the same script without that
// reply, on Redis's clock, for random limits and requests on a missing
// state: both must answer the same and store nothing, and the short reply
// must be given exactly when the bucket is full again within a
// microsecond and nothing else is set (an override, a state, a class, a
// warm-up).
func TestTakeFullAgainReply(t *testing.T) {
	c := newClient(t)
	ctx := testenv.Context(t, 30*time.Second)
	long := redis.NewScript(strings.Replace(takeSrc, takeFullAgainLua, "", 1))
	if long.Hash() == takeScript.Hash() {
		t.Fatal("takeSrc does not hold takeFullAgainLua")
	}
	rng := rand.New(rand.NewPCG(16, 3))
	pick := func(xs ...float64) float64 { return xs[rng.IntN(len(xs))] }
	short := 0
	for i := range 400 {
		cfg := Config{Bucket: uniqueBucket(t, c), Rate: pick(1, 1000, 999_999, 1e6, 3e6, 1e9), Burst: int(pick(1, 2, 5, 100, 1e6, 1e9))}
		if rng.IntN(10) == 0 {
			cfg.Warmup = time.Second
		}
		s, err := New(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		req := backend.TakeRequest{Cost: 1 + rng.IntN(min(cfg.Burst, 5)), MaxWait: time.Duration(pick(0, 1)) * time.Second}
		if rng.IntN(3) == 0 {
			req.Extra = rng.IntN(10)
		}
		if rng.IntN(10) == 0 {
			req.Cost = cfg.Burst + 1
		}
		if rng.IntN(10) == 0 {
			req.Priority = backend.PriorityOfRank(rng.IntN(3))
		}
		set := rng.IntN(10)
		got := req.Cost
		if req.Extra > 0 && cfg.Burst-req.Cost >= 1 {
			got += min(req.Extra, cfg.Burst-req.Cost)
		}
		want := set > 1 && s.shortTake(req) && req.Cost <= cfg.Burst && float64(got)*1e6 <= cfg.Rate
		var res [2]backend.TakeResult
		var errs [2]error
		for k, script := range []*redis.Script{takeScript, long} {
			c.Del(ctx, s.stateKeys...)
			switch set {
			case 0:
				c.HSet(ctx, s.stateKeys[1], "rate", "1e9")
			case 1:
				c.HSet(ctx, s.stateKeys[0], "p1", "0")
			}
			before := time.Now()
			cmd := script.Run(ctx, c, s.stateKeys, s.takeArgs(req, 0)...)
			_, isShort := cmd.Val().(int64)
			if k == 0 && isShort != want {
				t.Fatalf("case %d: %+v, %+v, set %d: short reply %v, want %v (%v)", i, cfg, req, set, isShort, want, cmd.Val())
			}
			if k == 1 && isShort {
				t.Fatalf("case %d: the script without takeFullAgainLua replied %v", i, cmd.Val())
			}
			res[k], errs[k] = s.takeResult(req, cmd)
			if at := res[k].At; errs[k] == nil && (at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second))) {
				t.Fatalf("case %d: At %v, not Redis's clock at the call (%v)", i, at, before)
			}
			res[k].At = time.Time{}
		}
		if short += btoi(want); !reflect.DeepEqual(res[0], res[1]) || (errs[0] == nil) != (errs[1] == nil) {
			t.Fatalf("case %d: %+v, %+v: short reply %+v, %v; string %+v, %v", i, cfg, req, res[0], errs[0], res[1], errs[1])
		}
		if want {
			if n := c.Exists(ctx, s.stateKeys...).Val(); n != 0 {
				t.Fatalf("case %d: %d keys written", i, n)
			}
		}
		c.Del(ctx, s.stateKeys...)
	}
	if short < 80 {
		t.Errorf("the short reply answered %d cases: want at least 80", short)
	}
	t.Logf("short reply: %d of 400", short)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
