package limiter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// TestFairBucketShares: on an in-process store at 200/s, 20 callers of
// tenant a and 20 of tenant b (weight 3) that never stop share the rate
// about 1:3, where without fair shares they would share it by callers.
func TestFairBucketShares(t *testing.T) {
	s, err := limiter.NewLocalFairStore(200, 1, limiter.Fair{Weights: map[string]float64{"b": 3}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.New(s, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for _, tenant := range []string{"a", "b"} {
		for range 100 {
			wg.Go(func() {
				for ctx.Err() == nil {
					if b.WaitN(ctx, limiter.Request{Cost: 1, Tenant: tenant}) == nil {
						mu.Lock()
						got[tenant]++
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	share := float64(got["b"]) / float64(got["a"]+got["b"])
	t.Logf("a %d, b %d: b's share %.3f", got["a"], got["b"], share)
	if share < 0.68 || share > 0.82 {
		t.Errorf("b's share = %.3f, want 0.75 ± 0.07", share)
	}
}
