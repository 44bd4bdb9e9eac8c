package redislimiter

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// TestWarmupRampSimulation measures the warm-up ramp at the library level:
// 3 Buckets on their own Stores share one cold Redis bucket at 60/s, burst
// 10, warm-up 20s, saturated by 20 callers each. It logs the tokens granted
// in each second beside Guava's curve, ∫ 60/√(9 − 8t/20s) dt over that
// second, and the worst deviation over the ramp. It takes 25 s, so it runs
// only with THROTTLE_SIM=1:
//
//	THROTTLE_SIM=1 go test -run TestWarmupRampSimulation -v ./limiter/redislimiter/
func TestWarmupRampSimulation(t *testing.T) {
	simOnly(t, "a 25 s measurement")
	const rate, burst, warm = 60.0, 10, 20 * time.Second
	c := newClient(t)
	name := uniqueBucket(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), warm+5*time.Second)
	defer cancel()
	var granted atomic.Int64
	var wg sync.WaitGroup
	var first sync.Once
	var start time.Time
	for r := range 3 {
		b, err := limiter.New(newWarmStore(t, newClient(t), name, rate, burst, warm), limiter.Options{ReplicaID: fmt.Sprintf("w%d", r)})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b.Wait(ctx, 1) == nil {
					first.Do(func() { start = time.Now() })
					granted.Add(1)
				}
			}()
		}
	}
	time.Sleep(100 * time.Millisecond)
	for granted.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cum := func(u float64) float64 { // tokens of the ramp from its start to u seconds
		w := warm.Seconds()
		if u >= w {
			return rate*w/2 + rate*(u-w)
		}
		return rate * w / 4 * (3 - math.Sqrt(9-8*u/w))
	}
	var got, want []string
	worst := 0.0
	prev := granted.Load()
	t0 := start
	for s := 1; s <= int(warm/time.Second)+3; s++ {
		time.Sleep(time.Until(t0.Add(time.Duration(s) * time.Second)))
		n := granted.Load()
		g, w := float64(n-prev), cum(float64(s))-cum(float64(s-1))
		if s == 1 {
			g -= float64(burst) / 3 // the cold bucket's third of the burst
		}
		prev = n
		got, want = append(got, fmt.Sprint(g)), append(want, fmt.Sprintf("%.1f", w))
		if s <= int(warm/time.Second) {
			worst = math.Max(worst, math.Abs(g-w)/w)
		}
	}
	cancel()
	wg.Wait()
	t.Logf("granted per second: %s", strings.Join(got, " "))
	t.Logf("Guava curve:        %s", strings.Join(want, " "))
	t.Logf("worst deviation over the ramp: %.1f%%", 100*worst)
}
