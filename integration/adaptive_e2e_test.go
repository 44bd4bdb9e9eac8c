package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// TestAdaptiveHiddenLimitE2E is the adaptive rate's unknown-limit scenario through
// the binary: 3 replicas, each configured at 100/s, consume one RabbitMQ
// backlog and deliver to a mock provider whose hidden limit is 37/s (a
// token bucket, burst 5) and which answers 429 without Retry-After above
// it. It runs the fleet with push-back only, then with limit.adaptive, and
// logs for each the delivered rate and the share of 429s from 45 s to
// 75 s, the per-second deliveries, and whether every message was either
// delivered or is still in the queue. Each run takes 80 s, so it runs only
// with THROTTLE_SIM=1:
//
//	THROTTLE_SIM=1 go test -count=1 -run TestAdaptiveHiddenLimitE2E -v ./integration/
func TestAdaptiveHiddenLimitE2E(t *testing.T) {
	simOnly(t, "a 160 s measurement")
	for _, adaptive := range []bool{false, true} {
		t.Run(fmt.Sprintf("adaptive=%v", adaptive), func(t *testing.T) {
			e2eHiddenLimit(t, adaptive)
		})
	}
}

func e2eHiddenLimit(t *testing.T, adaptive bool) {
	const published = 4000
	hidden, err := backend.NewMemory(37, 5)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var okAt []time.Time
	var refusedAt []time.Time
	seen := map[int]bool{}
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			ID int `json:"id"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		mu.Lock()
		defer mu.Unlock()
		res, _ := hidden.Take(r.Context(), backend.TakeRequest{Cost: 1})
		if !res.Granted {
			refusedAt = append(refusedAt, time.Now())
			http.Error(w, "rate limited", http.StatusTooManyRequests)
			return
		}
		okAt = append(okAt, time.Now())
		seen[body.ID] = true
	}))
	t.Cleanup(provider.Close)
	srv := faultStartRedis(t)
	f := faultNewFleet(t)
	spec := faultFleetSpec{Redis: "  addr: " + srv.Addr() + "\n", Burst: 100, SinkURL: provider.URL}
	if adaptive {
		spec.LimitExtra = "  adaptive: {min_rate: 5}\n"
	}
	for range 3 {
		f.Start(spec, 100)
	}
	f.WaitConsumers(3) // the replicas declare the queue
	start := time.Now()
	f.Publish(0, published)
	faultSleepUntil(t.Context(), start.Add(80*time.Second))
	f.Stop()

	mu.Lock()
	defer mu.Unlock()
	from, to := start.Add(45*time.Second), start.Add(75*time.Second)
	ok, no := faultCount(okAt, from, to), faultCount(refusedAt, from, to)
	per := faultPerSecond(okAt, start, start.Add(80*time.Second))
	left := cliQueueState(f.conn, f.name).Messages
	t.Logf("adaptive=%v per second delivered: %s", adaptive, strings.Trim(fmt.Sprint(per), "[]"))
	t.Logf("adaptive=%v 45-75s: %.1f/s delivered, %d of %d requests answered 429 (%.1f%%); %d distinct delivered + %d in the queue of %d published",
		adaptive, float64(ok)/30, no, ok+no, 100*float64(no)/float64(max(ok+no, 1)), len(seen), left, published)
	if lost := published - len(seen) - left; lost > 0 {
		if adaptive {
			t.Errorf("lost %d messages", lost)
		} else { // measured: push-back alone dead-letters a few after 5 refusals
			t.Logf("adaptive=false: %d messages neither delivered nor in the queue (dead-lettered)", lost)
		}
	}
}

// simOnly skips a long measurement (what says which) unless THROTTLE_SIM
// is set.
func simOnly(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("THROTTLE_SIM") == "" {
		t.Skip(what + "; set THROTTLE_SIM=1")
	}
}
