package testenv

import (
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// CallCounter is a go-redis hook that counts a client's round trips: each
// command sent alone, and each pipeline. Add it with Client.AddHook; read
// N. It is safe for concurrent use.
type CallCounter struct{ N atomic.Int64 }

// DialHook implements redis.Hook.
func (h *CallCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *CallCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.N.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h *CallCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.N.Add(1)
		return next(ctx, cmds)
	}
}

// RedisCPU returns the CPU the server behind c used so far, in seconds
// (user and system), and the commands it ran (INFO commandstats, those
// scripts ran included). Each call runs one INFO itself.
func RedisCPU(tb testing.TB, c redis.UniversalClient) (float64, int64) {
	tb.Helper()
	info, err := c.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var cpu float64
	var cmds int64
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_cpu_user:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		} else if v, ok := strings.CutPrefix(line, "used_cpu_sys:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			cpu += f
		} else if strings.HasPrefix(line, "cmdstat_") {
			_, rest, _ := strings.Cut(line, "calls=")
			v, _, _ := strings.Cut(rest, ",")
			k, _ := strconv.ParseInt(v, 10, 64)
			cmds += k
		}
	}
	return cpu, cmds
}

// PrivateRedis starts a redis-server of tb's own, listening only on a unix
// socket (no port to pick), keeping nothing on disk, with extra config
// lines (such as "--requirepass", "pw"), and returns the socket's path
// once the server answers. The server is killed when tb ends. Without a
// redis-server on the PATH it calls Missing.
func PrivateRedis(tb testing.TB, conf ...string) string {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Missing(tb, "redis-server", "install redis", err)
	}
	dir := tb.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	args := append([]string{"--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", "--dir", dir}, conf...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, Password: passwordOf(conf), MaxRetries: -1})
	defer c.Close()
	Eventually(tb, 10*time.Second, "the private redis-server answering", func() bool { return c.Ping(context.Background()).Err() == nil })
	return sock
}

// passwordOf returns the --requirepass of conf, or "".
func passwordOf(conf []string) string {
	for i, c := range conf {
		if c == "--requirepass" && i+1 < len(conf) {
			return conf[i+1]
		}
	}
	return ""
}

// RunParallel runs one b.N times from 64 goroutines in all (whatever
// GOMAXPROCS), timing only that, and fails b on the first error.
func RunParallel(b *testing.B, one func() error) {
	b.ReportAllocs()
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := one(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
}

// MeasureRedis is RunParallel that also reports, per operation, what the
// server behind c (a private one: it counts every client's work) spent:
// redis-µs/msg (CPU, RedisCPU), redis-cmds/msg (commands, scripts' own
// included), and calls/msg (this client's round trips, CallCounter).
func MeasureRedis(b *testing.B, c *redis.Client, one func() error) {
	h := &CallCounter{}
	c.AddHook(h)
	cpu0, cmds0 := RedisCPU(b, c)
	RunParallel(b, one)
	cpu1, cmds1 := RedisCPU(b, c)
	b.ReportMetric((cpu1-cpu0)*1e6/float64(b.N), "redis-µs/msg")
	b.ReportMetric(float64(cmds1-cmds0-2)/float64(b.N), "redis-cmds/msg") // less this pair of INFO
	b.ReportMetric(float64(h.N.Load())/float64(b.N), "calls/msg")
}

// MeasureRedisStalls measures, until t ends, the longest a PING to the
// Redis at addr took, one every 20 ms on a connection of its own: a
// server held up that long (by a long script of another client, or by
// the machine under it) held every replica's calls up as long. Timing
// bounds of a test on a shared Redis may be widened by it, and only by
// what it measured. A PING that fails counts for as long as it took.
func MeasureRedisStalls(t testing.TB, addr string) *Stalls {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MaxRetries: -1, ReadTimeout: 10 * time.Second})
	return measure(t, func(done <-chan struct{}) (time.Duration, bool) {
		select {
		case <-done:
			return 0, false
		case <-time.After(20 * time.Millisecond):
		}
		start := time.Now()
		_ = c.Ping(context.Background()).Err()
		return time.Since(start), true
	}, func() { _ = c.Close() })
}
