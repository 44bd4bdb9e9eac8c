package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestFaultPushBackIsLogged makes the sink answer 429 with Retry-After: 2
// to every request for 6 s while two replicas deliver to it. A
// push-back pause once produced no log line at info level. Every
// replica must log, at info, that the bucket is paused, for how long and
// by which replica's push-back, no more often than the bound the binary
// documents (one line per 5 s, so at most 3 during the 6 s here).
func TestFaultPushBackIsLogged(t *testing.T) {
	t.Parallel()
	const (
		storm    = 6 * time.Second
		maxLines = 3
	)
	var refusing atomic.Bool
	var refused, accepted atomic.Int64
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if refusing.Load() {
			refused.Add(1)
			w.Header().Set("Retry-After", "2")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		accepted.Add(1)
	}))
	t.Cleanup(sink.Close)
	srv := faultStartRedis(t)
	f := faultNewFleet(t)
	spec := faultFleetSpec{Redis: "  addr: " + srv.Addr() + "\n", Burst: 5, SinkURL: sink.URL}
	for range 2 {
		f.Start(spec, 20)
	}
	f.WaitConsumers(2)
	f.Publish(0, 400)
	testenv.Eventually(t, 20*time.Second, "deliveries before the storm", func() bool { return accepted.Load() >= 10 })
	refusing.Store(true)
	stormAt := time.Now()
	faultSleepUntil(context.Background(), stormAt.Add(storm))
	refusing.Store(false)
	testenv.Eventually(t, 20*time.Second, "deliveries after the storm", func() bool { return accepted.Load() >= 40 })
	f.Stop()

	ids := map[string]bool{}
	for _, p := range f.Procs {
		for _, rec := range faultLogRecords(p.out.String()) {
			if rec["msg"] == "starting" {
				ids[fmt.Sprint(rec["replica"])] = true
			}
		}
	}
	line := regexp.MustCompile(`^bucket paused [0-9.]+m?s by push-back from replica (\S+)$`)
	for _, p := range f.Procs {
		var lines []string
		for _, rec := range faultLogRecords(p.out.String()) {
			msg := fmt.Sprint(rec["msg"])
			m := line.FindStringSubmatch(msg)
			if m == nil {
				continue
			}
			b, _ := json.Marshal(rec)
			lines = append(lines, string(b))
			if rec["level"] != "INFO" {
				t.Errorf("%s logged the pause at %v, want INFO: %s", p.name, rec["level"], b)
			}
			if !ids[m[1]] {
				t.Errorf("%s: the pause names replica %q, not one of %v: %s", p.name, m[1], ids, b)
			}
		}
		t.Logf("%s: %d pause lines during %v of 429s (%d refused requests in all):\n  %v", p.name, len(lines), storm, refused.Load(), lines)
		if len(lines) == 0 {
			t.Errorf("%s logged no line about the push-back pause", p.name)
		}
		if len(lines) > maxLines {
			t.Errorf("%s logged %d pause lines during %v, want at most %d", p.name, len(lines), storm, maxLines)
		}
	}
}
