package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestAdaptivePushBackThroughTheBinary: with limit.adaptive, a 429 from
// the provider lowers the shared bucket's rate, which 'bucket status'
// shows, and the replica exports as throttle_bucket_adaptive_rate. (The
// long measurement is TestAdaptiveHiddenLimitE2E.)
func TestAdaptivePushBackThroughTheBinary(t *testing.T) {
	t.Parallel()
	var refuse atomic.Int64
	refuse.Store(3) // the first three requests get a 429 without Retry-After
	var accepted atomic.Int64
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if refuse.Add(-1) >= 0 {
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		accepted.Add(1)
	}))
	t.Cleanup(provider.Close)
	srv := faultStartRedis(t)
	f := faultNewFleet(t)
	spec := faultFleetSpec{Redis: "  addr: " + srv.Addr() + "\n", Burst: 5, SinkURL: provider.URL,
		LimitExtra: "  adaptive: {min_rate: 2}\n", Metrics: true}
	p := f.Start(spec, 50)
	f.WaitConsumers(1)
	f.Publish(0, 40)
	testenv.Eventually(t, 30*time.Second, "deliveries after the push-back", func() bool { return accepted.Load() >= 20 })

	code, stdout, stderr := f.Admin("status", "--json")
	if code != 0 {
		t.Fatalf("bucket status: exit %d: %s", code, stderr)
	}
	var st struct {
		Adaptive *struct {
			Rate    float64 `json:"rate"`
			Ceiling float64 `json:"ceiling"`
		} `json:"adaptive"`
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatal(err)
	}
	// One push-back event (the 429s come within the 500 ms merge window
	// or during the pause): 50 · 0.7 = 35, then climbing by 0.5/s.
	if st.Adaptive == nil || st.Adaptive.Ceiling != 50 || st.Adaptive.Rate < 17 || st.Adaptive.Rate > 49 {
		t.Fatalf("bucket status adaptive = %+v, want a rate lowered from the ceiling 50:\n%s", st.Adaptive, stdout)
	}
	addr := p.MetricsAddr(t)
	var gauge float64
	testenv.Eventually(t, 10*time.Second, "throttle_bucket_adaptive_rate below the ceiling", func() bool {
		_, body := cliGet("http://" + addr + "/metrics")
		gauge = cliMetric(body, "throttle_bucket_adaptive_rate")
		return gauge > 0 && gauge < 50
	})
	if gauge < 17 {
		t.Errorf("throttle_bucket_adaptive_rate = %v, want the lowered rate", gauge)
	}
	f.Stop()
}
