package redislimiter

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// TestAdaptiveHiddenLimitSimulation measures the adaptive rate's
// unknown-limit scenario at the library level (no binary, no broker): 3 replicas, each a
// Bucket on its own Store sharing one Redis bucket configured at 100/s,
// send to a mock provider whose hidden limit is 37/s (a token bucket, burst
// 5, answering 429 without Retry-After above it). Like the HTTP sink with
// push-back on, each 429 pauses the bucket for the default 1s and the
// message is tried again, so nothing is lost. It runs with and without
// Options.Adaptive and logs the per-second delivered rate and, over
// 45-75s, the rate and the share of 429s. It takes 150 s, so it runs only
// with THROTTLE_SIM=1:
//
//	THROTTLE_SIM=1 go test -run TestAdaptiveHiddenLimitSimulation -v ./limiter/redislimiter/
func TestAdaptiveHiddenLimitSimulation(t *testing.T) {
	simOnly(t, "a 150 s measurement")
	for _, adaptive := range []bool{false, true} {
		t.Run(fmt.Sprintf("adaptive=%v", adaptive), func(t *testing.T) {
			simulateHiddenLimit(t, adaptive, 75*time.Second)
		})
	}
}

// provider is a mock API with a hidden limit: a token bucket.
type provider struct {
	mu     sync.Mutex
	m      *backend.Memory
	ok, no atomic.Int64
}

func (p *provider) send() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	res, _ := p.m.Take(context.Background(), backend.TakeRequest{Cost: 1})
	if res.Granted {
		p.ok.Add(1)
	} else {
		p.no.Add(1)
	}
	return res.Granted
}

func simulateHiddenLimit(t *testing.T, adaptive bool, d time.Duration) {
	c := newClient(t)
	name := uniqueBucket(t, c)
	hidden, err := backend.NewMemory(37, 5)
	if err != nil {
		t.Fatal(err)
	}
	p := &provider{m: hidden}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for r := range 3 {
		opts := limiter.Options{ReplicaID: fmt.Sprintf("r%d", r)}
		if adaptive {
			opts.Adaptive = &limiter.Adaptive{MinRate: 5}
		}
		b := newBucket(t, name, 100, 0, opts)
		for range 20 { // a sink's concurrency
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if b.Wait(ctx, 1) != nil {
						return
					}
					time.Sleep(5 * time.Millisecond) // the provider's latency
					if !p.send() {
						_ = b.Pause(ctx, time.Second) // push-back: 429 without Retry-After
					}
				}
			}()
		}
	}
	start := time.Now()
	var per []string
	var okAt45, noAt45 int64
	for s := 1; s <= int(d/time.Second); s++ {
		time.Sleep(time.Until(start.Add(time.Duration(s) * time.Second)))
		per = append(per, fmt.Sprint(p.ok.Load()))
		if s == 45 {
			okAt45, noAt45 = p.ok.Load(), p.no.Load()
		}
	}
	cancel()
	wg.Wait()
	ok, no := p.ok.Load()-okAt45, p.no.Load()-noAt45
	rates := make([]string, len(per))
	prev := int64(0)
	for i, v := range per {
		var n int64
		fmt.Sscan(v, &n)
		rates[i] = fmt.Sprint(n - prev)
		prev = n
	}
	t.Logf("adaptive=%v per second delivered: %s", adaptive, strings.Join(rates, " "))
	t.Logf("adaptive=%v 45-75s: %.1f/s delivered, %d of %d requests answered 429 (%.1f%%)",
		adaptive, float64(ok)/30, no, ok+no, 100*float64(no)/float64(ok+no))
}

// simOnly skips a long measurement (what says which) unless THROTTLE_SIM
// is set.
func simOnly(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("THROTTLE_SIM") == "" {
		t.Skip(what + "; set THROTTLE_SIM=1")
	}
}
