package integration

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestWarmupRampE2E is the warm-up through the binary: 3 replicas
// share a new bucket at 60/s, burst 10, limit.warmup 20s, with a backlog
// ready, and the recording sink counts the deliveries in each second from
// the first. It logs them beside Guava's curve, ∫ 60/√(9 − 8t/20s) dt over
// each second (see docs/adaptive.md, Warm-up), and the worst deviation over seconds
// 2 to 20. It takes about 40 s, so it runs only with THROTTLE_SIM=1:
//
//	THROTTLE_SIM=1 go test -count=1 -run TestWarmupRampE2E -v ./integration/
func TestWarmupRampE2E(t *testing.T) {
	simOnly(t, "a 40 s measurement")
	const rate, warm = 60.0, 20 * time.Second
	srv := faultStartRedis(t)
	f := faultNewFleet(t)
	spec := faultFleetSpec{Redis: "  addr: " + srv.Addr() + "\n", Burst: 10, LimitExtra: "  warmup: 20s\n"}
	for range 3 {
		f.Start(spec, rate)
	}
	f.WaitConsumers(3)
	f.Publish(0, 1500)
	testenv.Eventually(t, 20*time.Second, "a first delivery", func() bool { return len(f.Sink.times()) > 0 })
	first := f.Sink.times()[0]
	faultSleepUntil(t.Context(), first.Add(warm+3*time.Second))
	f.Stop()
	per := faultPerSecond(f.Sink.times(), first, first.Add(warm+3*time.Second))
	cum := func(u float64) float64 {
		w := warm.Seconds()
		if u >= w {
			return rate*w/2 + rate*(u-w)
		}
		return rate * w / 4 * (3 - math.Sqrt(9-8*u/w))
	}
	var want []string
	worst, worstAt := 0.0, 0
	for s := range per {
		w := cum(float64(s+1)) - cum(float64(s))
		want = append(want, fmt.Sprintf("%.1f", w))
		if s >= 1 && s < int(warm/time.Second) {
			if d := math.Abs(float64(per[s])-w) / w; d > worst {
				worst, worstAt = d, s+1
			}
		}
	}
	t.Logf("delivered per second: %s", strings.Trim(fmt.Sprint(per), "[]"))
	t.Logf("Guava curve:          %s", strings.Join(want, " "))
	t.Logf("worst deviation, seconds 2-20: %.1f%% (second %d); the first second also holds the cold third of the burst", 100*worst, worstAt)
	if worst > 0.10 {
		t.Errorf("a second of the ramp is %.1f%% off the curve, want within 10%%", 100*worst)
	}
}
