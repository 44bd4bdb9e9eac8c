package integration

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestUsefulReplicasEndToEnd runs two replicas of the binary on a bucket of
// 100/s whose sink takes 40 ms a message, one at a time per replica: no
// call waits for the bucket, each replica delivers its own throughput
// (at most 25/s), and the throttle_useful_replicas each exports is
// ceil(100 / that throughput) as the test measures it from the replicas'
// throttle_limiter_tokens_total over the windows the replicas measure.
func TestUsefulReplicasEndToEnd(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	const (
		rate = 100.0
		n    = 1000
	)
	name := cliName(t)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(40 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(slow.Close)
	conn, ch := cliQueue(t, amqpURL, name)
	_, addrs := cliRabbitFleet(t, bin, conn, name, 2, fmt.Sprintf("  rate: %v", rate), "    prefetch: 5\n    concurrency: 1", slow.URL+"/send")
	ctx := testenv.Context(t, 60*time.Second)
	for id := range n {
		err := ch.PublishWithContext(ctx, "", name, true, false, amqp.Publishing{
			ContentType: "application/json", MessageId: strconv.Itoa(id), Body: fmt.Appendf(nil, `{"id":%d}`, id),
		})
		if err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}

	// Each replica's granted tokens, sampled every 500 ms. A replica
	// measures its throughput between its heartbeats (3 s apart) and sets
	// the gauge every 5 s: the value read stems from a window of about
	// 3 s within the last 8 s. Its expected range is ceil(rate / the
	// per-replica throughput) over the fastest and the slowest such
	// window the test measured, 10% either side.
	type sample struct {
		at     time.Time
		tokens [2]float64
		useful [2]float64
	}
	read := func() sample {
		s := sample{at: time.Now()}
		for i, a := range addrs {
			_, body := cliGet("http://" + a + "/metrics")
			s.tokens[i] = cliMetric(body, "throttle_limiter_tokens_total")
			s.useful[i] = cliMetric(body, "throttle_useful_replicas")
		}
		return s
	}
	per := func(a, b sample) float64 {
		return ((b.tokens[0] - a.tokens[0]) + (b.tokens[1] - a.tokens[1])) / 2 / b.at.Sub(a.at).Seconds()
	}
	var samples []sample
	var flowing time.Time // when both replicas had delivered
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		s := read()
		samples = append(samples, s)
		if flowing.IsZero() && s.tokens[0] > 0 && s.tokens[1] > 0 {
			flowing = s.at
		}
		if flowing.IsZero() || s.at.Sub(flowing) < 8*time.Second || s.useful[0] == 0 || s.useful[1] == 0 {
			continue
		}
		lo, hi := math.Inf(1), 0.0
		for i, a := range samples {
			if s.at.Sub(a.at) > 8*time.Second || a.at.Before(flowing) {
				continue
			}
			for _, b := range samples[i+1:] {
				if d := b.at.Sub(a.at); d >= 2500*time.Millisecond && d <= 3500*time.Millisecond {
					lo, hi = min(lo, per(a, b)), max(hi, per(a, b))
				}
			}
		}
		if !(lo > 0) || hi >= rate/2 {
			t.Fatalf("measured %.1f to %.1f/s per replica: want a sink-bound throughput well below the bucket's share of %v/s", lo, hi, rate/2)
		}
		least, most := math.Ceil(rate/(hi*1.1)), math.Ceil(rate/(lo*0.9))
		load, _ := os.ReadFile("/proc/loadavg")
		t.Logf("per replica %.1f to %.1f/s over 3 s windows of the last 8 s: ceil(%v / that) = %v to %v; the replicas export %v and %v (loadavg %s)",
			lo, hi, rate, math.Ceil(rate/hi), math.Ceil(rate/lo), s.useful[0], s.useful[1], bytes.TrimSpace(load))
		for i, u := range s.useful {
			if u < least || u > most {
				t.Errorf("replica %d: throttle_useful_replicas = %v, want ceil(%v / the measured %.1f to %.1f/s) = %v to %v (10%% either side)", i, u, rate, lo, hi, least, most)
			}
		}
		return
	}
	t.Fatalf("throttle_useful_replicas not set on both replicas 8 s after they delivered: last %v", samples[len(samples)-1].useful)
}
