package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestMetricsHandler(t *testing.T) {
	m := newMetrics("rabbitmq")
	obs := m.consumerObserver()
	msg := consumer.Message{Source: consumer.Source{Broker: "rabbitmq"}}
	obs.Received(msg)
	obs.Delivered(msg)
	obs.Failed(msg, errors.New("x"))
	obs.Retried(msg, errors.New("x"), time.Second)
	obs.DeadLettered(msg, errors.New("x"))
	// Every attempt counts, failed or not; the session's return is not
	// another one.
	obs.ReconnectAttempt("rabbitmq", errors.New("refused"))
	obs.ReconnectAttempt("rabbitmq", nil)
	if obs.Reconnected != nil {
		obs.Reconnected("rabbitmq", errors.New("x"))
	}
	lobs := m.limiterObserver()
	lobs.PriorityWaited(limiter.PriorityHigh, 30*time.Millisecond)
	lobs.Took(2.5, 30, 5)
	lobs.StoreError(errors.New("x"))
	lobs.ModeChanged(limiter.ModeShared, limiter.ModeLocal, errors.New("x"))
	m.countWaiting(func() (n [limiter.NumPriorities]int) {
		n[limiter.PriorityLow] = 3
		return n
	})
	m.registerRetimed(func() int64 { return 4 })

	var notReady error = errors.New("consumer is not running")
	srv := httptest.NewServer(m.handler(func() error { return notReady }))
	defer srv.Close()

	code, body := get(t, srv.URL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`throttle_messages_received_total{broker="rabbitmq"} 1`,
		`throttle_messages_delivered_total{broker="rabbitmq"} 1`,
		`throttle_messages_retried_total{broker="rabbitmq"} 1`,
		`throttle_messages_dead_lettered_total{broker="rabbitmq"} 1`,
		`throttle_messages_failed_total{broker="rabbitmq"} 1`,
		`throttle_reconnects_total{broker="rabbitmq"} 2`,
		`throttle_limiter_wait_seconds_bucket{priority="high",le="0.05"} 1`,
		`throttle_limiter_wait_seconds_count{priority="high"} 1`,
		`throttle_limiter_wait_seconds_count{priority="low"} 0`,
		`throttle_limiter_waiting{priority="high"} 0`,
		`throttle_limiter_waiting{priority="normal"} 0`,
		`throttle_limiter_waiting{priority="low"} 3`,
		`throttle_limiter_retimed_total 4`,
		`throttle_bucket_tokens 2.5`,
		`throttle_bucket_effective_rate 30`,
		`throttle_redis_errors_total 1`,
		`throttle_limiter_mode{mode="local"} 1`,
		`throttle_limiter_mode{mode="shared"} 0`,
		`throttle_build_info{commit=`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	if code, _ := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if code, _ := get(t, srv.URL+"/livez"); code != http.StatusOK {
		t.Errorf("/livez: %d", code)
	}
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "consumer is not running") {
		t.Errorf("/readyz while not ready: %d %q", code, body)
	}
	notReady = nil
	if code, _ := get(t, srv.URL+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz when ready: %d", code)
	}
}

func TestWaitLimiter(t *testing.T) {
	// Two tokens, refilled at one per 100 s: the second wait, for two,
	// cannot be granted within the timeout. The first, for one, is
	// granted at once, or, when its answer came back later than the
	// Bucket's timer slack (a loaded machine), asks again and gets the
	// second token (see Stats.Retimed); with a burst of one it waited a
	// token's refill, 100 s, then. The timeout leaves it room on a loaded machine too.
	b, err := limiter.NewLocal(0.01, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	m := newMetrics("")
	w, err := consumerLimiter(consumer.LimitOptions{WaitTimeout: 500 * time.Millisecond}, b, m)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := w.Wait(ctx, 1); err != nil {
		t.Fatalf("first wait: %v", err)
	}
	err = w.Wait(ctx, 2)
	if !errors.Is(err, consumer.ErrWaitTimeout) {
		t.Fatalf("second wait: %v, want consumer.ErrWaitTimeout", err)
	}
	if consumer.IsPermanent(err) {
		t.Errorf("a max_wait timeout must be retryable, got a permanent error")
	}
	if n := m.waitingN.Load(); n != 0 {
		t.Errorf("%d waiting after the waits returned", n)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := w.Wait(cctx, 2); !errors.Is(err, context.Canceled) {
		t.Errorf("wait with a cancelled context: %v, want context.Canceled", err)
	}
	// Only the granted wait counts its tokens.
	if got := testutil.ToFloat64(m.tokensTaken); got != 1 || m.averageCost() != 1 {
		t.Errorf("tokens taken %v, average cost %v; want 1 and 1", got, m.averageCost())
	}
}

func TestTokensTakenAndAverageCost(t *testing.T) {
	b, err := limiter.NewLocal(1000, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	m := newMetrics("")
	if m.averageCost() != 1 {
		t.Errorf("average cost before any message = %v, want 1", m.averageCost())
	}
	w, err := consumerLimiter(consumer.LimitOptions{}, b, m)
	if err != nil {
		t.Fatal(err)
	}
	for _, cost := range []int{3, 1, 2} { // a 3-part SMS, then 1 and 2 parts
		if err := w.Wait(context.Background(), cost); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(m.tokensTaken); got != 6 || m.averageCost() != 2 {
		t.Errorf("throttle_limiter_tokens_total %v, average cost %v; want 6 and 2", got, m.averageCost())
	}
}

func TestMonitorPrintsProgress(t *testing.T) {
	b, err := limiter.NewLocal(30, 5)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	m := newMetrics("")
	m.deliveredN.Store(7)
	var out testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		monitor(ctx, b, fixedBacklog{Ready: 1000, SetAside: 200}, m, &out, 10*time.Millisecond)
	}()
	deadline := time.After(5 * time.Second)
	for !strings.Contains(out.String(), "\n") {
		select {
		case <-deadline:
			t.Fatal("no progress line within 5 s")
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	<-done
	line, _, _ := strings.Cut(out.String(), "\n")
	for _, want := range []string{"msg/s (limit 30/s, shared)", "delivered 7", "waiting 0", "backlog 1200 (200 set aside, ~40s at the limit)"} {
		if !strings.Contains(line, want) {
			t.Errorf("progress line %q lacks %q", line, want)
		}
	}
	if m.effectiveRate() != 30 {
		t.Errorf("the monitor did not refresh the rate gauge: %v", m.effectiveRate())
	}
	// The backlog counts the messages set aside, and reports them apart.
	if got := testutil.ToFloat64(m.backlog.WithLabelValues("")); got != 1200 {
		t.Errorf("throttle_source_backlog = %v, want 1200", got)
	}
	if got := testutil.ToFloat64(m.backlogSetAside.WithLabelValues("")); got != 200 {
		t.Errorf("throttle_source_backlog_set_aside = %v, want 200", got)
	}
}

// fixedBacklog is a backlogger with a fixed answer; a negative Ready fails.
type fixedBacklog consumer.Backlog

func (f fixedBacklog) BacklogParts(context.Context) (consumer.Backlog, error) {
	if f.Ready < 0 {
		return consumer.Backlog{}, errors.New("broker unreachable")
	}
	return consumer.Backlog(f), nil
}

func TestBacklogSeriesGoesAwayWhileUnknown(t *testing.T) {
	m := newMetrics("rabbitmq")
	m.setBacklog(consumer.Backlog{Ready: 42, SetAside: 7})
	for _, g := range []*prometheus.GaugeVec{m.backlog, m.backlogSetAside} {
		if n := testutil.CollectAndCount(g); n != 1 {
			t.Fatalf("%d backlog series after a read, want 1", n)
		}
	}
	m.backlogUnknown()
	for _, g := range []*prometheus.GaugeVec{m.backlog, m.backlogSetAside} {
		if n := testutil.CollectAndCount(g); n != 0 {
			t.Fatalf("%d backlog series after a failed read, want 0", n)
		}
	}
}

func TestProgressLineBacklog(t *testing.T) {
	for _, tt := range []struct {
		backlog *consumer.Backlog // nil: unknown
		limit   float64
		avgCost float64
		want    string
	}{
		{nil, 50, 1, "waiting 3"},
		{&consumer.Backlog{}, 50, 1, "waiting 3 | backlog 0"},
		{&consumer.Backlog{Ready: 9000}, 50, 1, "waiting 3 | backlog 9000 (~3m0s at the limit)"},
		{&consumer.Backlog{Ready: 9000}, 50, 2.5, "waiting 3 | backlog 9000 (~7m30s at the limit)"}, // messages of 2.5 tokens on average
		{&consumer.Backlog{Ready: 10}, 0, 1, "waiting 3 | backlog 10"},                              // paused: no estimate
		// The messages set aside count in the backlog and its time to drain.
		{&consumer.Backlog{Ready: 6000, SetAside: 3000}, 50, 1, "waiting 3 | backlog 9000 (3000 set aside, ~3m0s at the limit)"},
		{&consumer.Backlog{SetAside: 10}, 0, 1, "waiting 3 | backlog 10 (10 set aside)"},
	} {
		line := progressLine(49.9, tt.limit, limiter.ModeShared, 100, 3, tt.backlog, tt.avgCost)
		if !strings.HasSuffix(line, tt.want) {
			t.Errorf("backlog %+v at %v/s: %q, want it to end with %q", tt.backlog, tt.limit, line, tt.want)
		}
	}
}

func TestProgressOnlyOnTerminal(t *testing.T) {
	on := true
	tests := []struct {
		rio  replicaIO
		want bool
	}{
		{replicaIO{stderr: &bytes.Buffer{}}, false},
		{replicaIO{stderr: &bytes.Buffer{}, progress: &on}, true},
	}
	for _, tt := range tests {
		if got := showProgress(tt.rio); got != tt.want {
			t.Errorf("showProgress(%T, %v) = %v, want %v", tt.rio.stderr, tt.rio.progress, got, tt.want)
		}
	}
}

func TestHealthcheck(t *testing.T) {
	m := newMetrics("")
	var notReady error = errors.New("consumer is not running")
	srv := httptest.NewServer(m.handler(func() error { return notReady }))
	defer srv.Close()
	tests := []struct {
		args []string
		want int
		out  string
	}{
		{[]string{"healthcheck", "--url", srv.URL + "/healthz"}, ExitOK, "ok"},
		{[]string{"healthcheck", "--url", srv.URL + "/readyz"}, ExitFailure, "503 Service Unavailable: not ready: consumer is not running"},
		{[]string{"healthcheck", "--url", "http://127.0.0.1:1/healthz", "--timeout", "1s"}, ExitFailure, "no answer"},
		{[]string{"healthcheck", "--url", "http://u:hunter2@127.0.0.1:1/healthz"}, ExitFailure, strings.TrimSuffix(config.RedactURL("http://u:hunter2@127.0.0.1:1/"), "127.0.0.1:1/")},
		{[]string{"healthcheck", "--timeout", "0s"}, ExitUsage, "--timeout must be > 0"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCLI(t, tt.args...)
		if code != tt.want || !strings.Contains(stdout+stderr, tt.out) {
			t.Errorf("%q: exit code %d, output %q; want %d and %q", tt.args, code, stdout+stderr, tt.want, tt.out)
		}
		if strings.Contains(stdout+stderr, "hunter2") {
			t.Errorf("%q: output leaks a password: %q", tt.args, stdout+stderr)
		}
	}
}

func TestTimedSends(t *testing.T) {
	m := newMetrics("")
	release := make(chan struct{})
	entered := make(chan struct{})
	fail := errors.New("provider said no")
	h := m.timedSends(func(_ context.Context, msg consumer.Message) error {
		entered <- struct{}{}
		<-release
		if string(msg.Body) == "bad" {
			return fail
		}
		return nil
	})
	done := make(chan error, 2)
	for _, v := range []string{"good", "bad"} {
		go func() { done <- h(context.Background(), consumer.Message{Body: []byte(v)}) }()
	}
	<-entered
	<-entered
	inFlight := func() float64 {
		mfs, err := m.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "throttle_sink_in_flight" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("throttle_sink_in_flight not served")
		return 0
	}
	if got := inFlight(); got != 2 {
		t.Errorf("in flight %v while two sends are in progress, want 2", got)
	}
	close(release)
	var errs []error
	for range 2 {
		errs = append(errs, <-done)
	}
	if !errors.Is(errors.Join(errs...), fail) {
		t.Errorf("the handler's error did not come through: %v", errs)
	}
	if got := inFlight(); got != 0 {
		t.Errorf("in flight %v after the sends returned, want 0", got)
	}
	timed := map[string]uint64{}
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "throttle_sink_send_seconds" {
			for _, s := range mf.GetMetric() {
				timed[s.GetLabel()[0].GetValue()] = s.GetHistogram().GetSampleCount()
			}
		}
	}
	if timed["delivered"] != 1 || timed["failed"] != 1 {
		t.Errorf("sends timed by outcome %v, want one delivered and one failed", timed)
	}
}

// BenchmarkTimedSends is what timing a send adds to each message: the
// wrapped handler against the bare one.
func BenchmarkTimedSends(b *testing.B) {
	h := func(context.Context, consumer.Message) error { return nil }
	msg := consumer.Message{Body: []byte("x")}
	ctx := context.Background()
	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			_ = h(ctx, msg)
		}
	})
	b.Run("timed", func(b *testing.B) {
		t := newMetrics("").timedSends(h)
		for b.Loop() {
			_ = t(ctx, msg)
		}
	})
}
