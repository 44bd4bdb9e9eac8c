package redisdedupe

import (
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestBatcherBothWays: concurrent claims, marks and releases get their
// own replies both as one script call (a single node) and as a pipeline of
// one call per operation (what a Cluster's batcher sends).
func TestBatcherBothWays(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	for _, cluster := range []bool{false, true} {
		t.Run(fmt.Sprint("cluster=", cluster), func(t *testing.T) {
			prefix := testenv.Name(t, "ddb") + ":"
			b := newBatcher(c, prefix+"ch")
			b.cluster = cluster
			const n = 150
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Go(func() {
					key := fmt.Sprintf("%s{k%d}", prefix, i)
					check := func(kind, token, ttl string, want any) {
						if v, err := b.do(kind, key, token, ttl); err != nil || v != want {
							errs <- fmt.Errorf("%s %s %s: %v %v, want %v", kind, key, token, v, err, want)
						}
					}
					check("c", "a", "60000", "c")
					check("r", "b", "", int64(0))
					if i%2 == 0 {
						check("r", "a", "", int64(1))
						check("c", "b", "60000", "c")
						return
					}
					check("m", "", "60000", int64(1))
					check("c", "b", "60000", "s")
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}
