package cli

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// TestUsefulReplicas: a bucket of 100/s and two replicas whose own
// throughput is 40/s each (they take a token every 25 ms and never wait on
// the bucket): throttle_useful_replicas reads 3, the smallest count that
// reaches 100/s at 40/s a replica, from their heartbeats as 'bucket
// status' reads them.
func TestUsefulReplicas(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "useful")
	path := bucketConfig(t, addr, name, 100, 100)
	t.Cleanup(func() { runCLI(t, "bucket", "reset", "--config", path) })
	_, store := redisStore(t, addr, name, 100, 100)
	admin := store.Admin()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range 2 {
		_, s := redisStore(t, addr, name, 100, 100)
		b, err := limiter.New(s, limiter.Options{HeartbeatInterval: 100 * time.Millisecond, ReplicaID: "useful-" + string(rune('a'+i))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		wg.Add(1)
		go func() { // 40/s: one token every 25 ms
			defer wg.Done()
			tk := time.NewTicker(25 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
					_ = b.Wait(ctx, 1)
				}
			}
		}()
	}
	var u usefulEstimator
	got := 0
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		st, err := admin.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		reps, err := admin.Replicas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = u.observe(st.At, st.Rate, reps)
		var per []float64
		for _, g := range u.grants {
			per = append(per, g.rate(st.At))
		}
		if got == 3 && len(per) == 2 && per[0] > 30 && per[1] > 30 {
			t.Logf("rate %v/s, replicas at %.1f/s: useful replicas %d", st.Rate, per, got)
			return
		}
	}
	t.Fatalf("throttle_useful_replicas = %d after 15 s, want 3", got)
}

// TestUsefulEstimatorBucketBound: when every replica that delivers waits
// on the bucket, the bucket is the limit: the count is those replicas.
func TestUsefulEstimatorBucketBound(t *testing.T) {
	var u usefulEstimator
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		at := t0.Add(time.Duration(i) * time.Second)
		reps := []redislimiter.Replica{
			{ID: "a", Reported: true, Granted: int64(50 * i), Waiting: 3, BeatAt: at},
			{ID: "b", Reported: true, Granted: int64(50 * i), Waiting: 2, BeatAt: at},
		}
		if got := u.observe(at, 100, reps); i == 2 && got != 2 {
			t.Errorf("useful = %d, want 2", got)
		}
	}
}
