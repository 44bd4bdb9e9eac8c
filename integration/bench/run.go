package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// replica is one simulated replica: its own client and its own limiter.
type replica struct {
	client *redis.Client
	calls  *callCounter
	w      waiter
}

// newReplicas builds n replicas of im on one bucket. Each client's pool is
// dialled up front with conns connections, so that connection handshakes
// do not count as the limiter's Redis calls.
func newReplicas(ctx context.Context, addr string, n, conns int, im impl, spec bucketSpec) ([]*replica, error) {
	return newReplicasWith(ctx, &redis.Options{Addr: addr, PoolSize: conns + 4}, n, conns, im, spec)
}

// newReplicasWith is newReplicas with each client built from a copy of
// opts.
func newReplicasWith(ctx context.Context, opts *redis.Options, n, conns int, im impl, spec bucketSpec) ([]*replica, error) {
	addr := opts.Addr
	reps := make([]*replica, 0, n)
	for range n {
		o := *opts
		c := redis.NewClient(&o)
		r := &replica{client: c, calls: &callCounter{}}
		reps = append(reps, r)
		if err := warm(ctx, c, conns); err != nil {
			closeReplicas(reps)
			return nil, fmt.Errorf("connecting to Redis at %s: %w", addr, err)
		}
		c.AddHook(r.calls)
		w, err := im.new(c, spec)
		if err != nil {
			closeReplicas(reps)
			return nil, fmt.Errorf("building %s: %w", im.name, err)
		}
		r.w = w
	}
	return reps, nil
}

// warm opens n connections in c's pool, each on its own sticky Conn held
// at once, and gives them back.
func warm(ctx context.Context, c *redis.Client, n int) error {
	conns := make([]*redis.Conn, n)
	defer func() {
		for _, cn := range conns {
			if cn != nil {
				cn.Close()
			}
		}
	}()
	for i := range conns {
		conns[i] = c.Conn()
		if err := conns[i].Ping(ctx).Err(); err != nil {
			return err
		}
	}
	return nil
}

// closeReplicas closes every limiter, then every client.
func closeReplicas(reps []*replica) {
	for _, r := range reps {
		if r.w != nil {
			r.w.Close()
		}
	}
	for _, r := range reps {
		r.client.Close()
	}
}

// callCounter is a go-redis hook that counts the commands a client sends;
// a pipeline counts as many commands as it holds, as INFO commandstats
// would count them.
type callCounter struct{ n atomic.Int64 }

func (h *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// load says how the callers of one phase behave.
type load struct {
	goroutines int           // callers per replica
	duration   time.Duration // how long they call Wait
	pace       time.Duration // pause after each grant; 0 for a tight loop
	timeEach   bool          // record the latency of each Wait
}

// tally is what the callers of one phase recorded.
type tally struct {
	perReplica []int64
	bins       []int64 // grants in each millisecond since the start
	latencies  []time.Duration
	calls      []point // client-counted Redis calls, sampled
}

func (t tally) granted() int64 {
	var n int64
	for _, v := range t.perReplica {
		n += v
	}
	return n
}

// caller is what one goroutine records, merged into a tally at the end so
// that the hot loop shares nothing.
type caller struct {
	replica int
	bins    []uint32
	lat     []time.Duration
	err     error
}

// drive runs l.goroutines callers on each replica, all released at once,
// for l.duration. A grant counts only if Wait returned before the end. If
// observe is not nil, it runs in its own goroutine from the release on,
// with the start time, and drive waits for it.
func drive(ctx context.Context, reps []*replica, l load, observe func(start time.Time)) (tally, error) {
	nbins := int(l.duration/time.Millisecond) + 1
	release := make(chan struct{})
	var (
		start  time.Time
		runCtx context.Context
		wg     sync.WaitGroup
	)
	var callers []*caller
	for i, r := range reps {
		for range l.goroutines {
			c := &caller{replica: i, bins: make([]uint32, nbins)}
			if l.timeEach {
				c.lat = make([]time.Duration, 0, 4096)
			}
			callers = append(callers, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-release
				c.loop(runCtx, r.w, start, l)
			}()
		}
	}
	start = time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(l.duration))
	defer cancel()
	close(release)
	if observe != nil {
		wg.Go(func() { observe(start) })
	}
	wg.Wait()

	t := tally{perReplica: make([]int64, len(reps)), bins: make([]int64, nbins)}
	var errs []error
	for _, c := range callers {
		for i, v := range c.bins {
			t.bins[i] += int64(v)
			t.perReplica[c.replica] += int64(v)
		}
		t.latencies = append(t.latencies, c.lat...)
		errs = append(errs, c.err)
	}
	return t, errors.Join(errs...)
}

func (c *caller) loop(ctx context.Context, w waiter, start time.Time, l load) {
	for {
		var t0 time.Time
		if l.timeEach {
			t0 = time.Now()
		}
		if err := w.Wait(ctx, 1); err != nil {
			if ctx.Err() == nil {
				c.err = err
			}
			return
		}
		since := time.Since(start)
		if since >= l.duration {
			return
		}
		c.bins[since/time.Millisecond]++
		if l.timeEach {
			c.lat = append(c.lat, time.Since(t0))
		}
		if l.pace > 0 {
			time.Sleep(l.pace) // unlike a timer, allocates nothing
		}
	}
}

// usage is a snapshot of the counters that a phase's cost is measured by.
type usage struct {
	redis       redisStats
	clientCalls int64
	cpu         time.Duration // user + system time of this process
	mallocs     uint64
}

func (u usage) sub(v usage) usage {
	return usage{
		redis:       redisStats{calls: u.redis.calls - v.redis.calls, cmds: u.redis.cmds - v.redis.cmds, scripts: u.redis.scripts - v.redis.scripts, cpu: u.redis.cpu - v.redis.cpu, scriptTime: u.redis.scriptTime - v.redis.scriptTime},
		clientCalls: u.clientCalls - v.clientCalls,
		cpu:         u.cpu - v.cpu,
		mallocs:     u.mallocs - v.mallocs,
	}
}

func snapshot(ctx context.Context, admin *redis.Client, reps []*replica) (usage, error) {
	rs, err := readRedisStats(ctx, admin)
	if err != nil {
		return usage{}, err
	}
	u := usage{redis: rs, cpu: processCPU()}
	for _, r := range reps {
		u.clientCalls += r.calls.n.Load()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u.mallocs = ms.Mallocs
	return u, nil
}

// processCPU returns the user and system time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scriptCommands are the commands that the compared scripts run inside
// Redis. INFO commandstats counts them too, but they are no round trips.
// TestScriptCommandsCoverTheScripts keeps the list in step with the
// limiter's scripts: a command they run that is missing here would be
// counted as a call from a client.
var scriptCommands = map[string]bool{
	"time": true, "hmget": true, "hset": true, "pexpire": true, "get": true, "set": true,
	"zadd": true, "zremrangebyscore": true, "zcard": true, "zcount": true, "pttl": true,
	"exists": true, "hgetall": true, "hget": true, "hexists": true, "hdel": true, "del": true,
	"publish": true, "zrangebyscore": true, "zrem": true, "zscore": true, "zrange": true, "hlen": true,
}

// redisStats are Redis's own counters, from INFO.
type redisStats struct {
	// calls are commands sent by clients: every command but INFO and
	// scriptCommands.
	calls int64
	// cmds are every command but INFO, including those run by scripts.
	cmds int64
	// scripts are the EVAL and EVALSHA commands.
	scripts int64
	// cpu is used_cpu_sys + used_cpu_user.
	cpu time.Duration
	// scriptTime is the time Redis spent running EVAL and EVALSHA, the
	// commands the scripts run included (commandstats usec): cpu less
	// scriptTime is the rest of Redis's work (the network, the event loop).
	scriptTime time.Duration
}

func readRedisStats(ctx context.Context, c *redis.Client) (redisStats, error) {
	txt, err := c.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return redisStats{}, fmt.Errorf("reading INFO commandstats: %w", err)
	}
	var s redisStats
	for line := range strings.SplitSeq(txt, "\n") {
		name, rest, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case strings.HasPrefix(name, "cmdstat_"):
			cmd := strings.TrimPrefix(name, "cmdstat_")
			if cmd == "info" {
				continue
			}
			calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			n, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				return redisStats{}, fmt.Errorf("parsing INFO line %q: %w", line, err)
			}
			s.cmds += n
			if cmd == "evalsha" || cmd == "eval" {
				s.scripts += n
				_, us, _ := strings.Cut(rest, "usec=")
				us, _, _ = strings.Cut(us, ",")
				v, err := strconv.ParseInt(us, 10, 64)
				if err != nil {
					return redisStats{}, fmt.Errorf("parsing INFO line %q: %w", line, err)
				}
				s.scriptTime += time.Duration(v) * time.Microsecond
			}
			if !scriptCommands[cmd] {
				s.calls += n
			}
		case name == "used_cpu_sys" || name == "used_cpu_user":
			f, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				return redisStats{}, fmt.Errorf("parsing INFO line %q: %w", line, err)
			}
			s.cpu += time.Duration(f * float64(time.Second))
		}
	}
	return s, nil
}
