package redisdedupe_test

import (
	"context"
	"fmt"
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
	sock := testenv.PrivateRedis(b)
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, PoolSize: 64, MaxRetries: -1})
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
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
	testenv.MeasureRedis(b, c, one)
}
