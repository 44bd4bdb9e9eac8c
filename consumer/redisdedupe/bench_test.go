package redisdedupe_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/redisdedupe"
	"github.com/throttlehq/throttle/internal/testenv"
)

// BenchmarkStoreRedisCPU measures what dedupe costs a private redis-server
// (nothing else runs on it) per message, as a consumer uses it: a Claim
// before the send and a MarkSent after it, every message a key of its
// own, from 64 goroutines, so that concurrent operations share script
// calls. It reports the server's CPU (INFO cpu, user and system) and the
// commands it ran (INFO commandstats, those of the script included) per
// message, and the client's calls per message.
//
//	go test ./consumer/redisdedupe/ -run XXX -bench BenchmarkStoreRedisCPU -benchtime 100000x
func BenchmarkStoreRedisCPU(b *testing.B) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Missing(b, "redis-server", "install redis", err)
	}
	dir := b.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, PoolSize: 64, MaxRetries: -1})
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	testenv.Eventually(b, 10*time.Second, "the private redis-server answering", func() bool { return c.Ping(ctx).Err() == nil })
	s, err := redisdedupe.New(c, redisdedupe.Config{Namespace: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	var n atomic.Int64
	one := func() error {
		key := "+1555" + strconv.FormatInt(n.Add(1), 10)
		st, err := s.Claim(ctx, key, key, time.Minute)
		if err != nil || st != consumer.DedupeClaimed {
			return fmt.Errorf("claim %s: %v %v", key, st, err)
		}
		return s.MarkSent(ctx, key, key, time.Hour)
	}
	if err := one(); err != nil { // loads the script
		b.Fatal(err)
	}
	h := &testenv.CallCounter{}
	c.AddHook(h)
	cpu0, cmds0 := testenv.RedisCPU(b, c)
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := one(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	cpu1, cmds1 := testenv.RedisCPU(b, c)
	b.ReportMetric((cpu1-cpu0)*1e6/float64(b.N), "redis-µs/msg")
	b.ReportMetric(float64(cmds1-cmds0-2)/float64(b.N), "redis-cmds/msg") // less this pair of INFO
	b.ReportMetric(float64(h.N.Load())/float64(b.N), "calls/msg")
}
