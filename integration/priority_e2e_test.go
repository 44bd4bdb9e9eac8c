package integration

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// prioOTPBase is the first id of the OTP messages; the marketing messages
// are numbered from 0.
const prioOTPBase = 1_000_000

// prioScenario is the OTP-versus-marketing scenario: two
// deployments of the binary, each consuming its own RabbitMQ queue, share
// one bucket in the shared Redis and deliver to one recording sink.
type prioScenario struct {
	t       *testing.T
	bin     string
	amqpURL string
	bucket  string
	otpQ    string
	mktQ    string
	conn    *amqp.Connection
	otpCh   *amqp.Channel
	mktCh   *amqp.Channel
	sink    *cliSink
	procs   []*faultFleetProc

	mu        sync.Mutex
	published map[int]time.Time // OTP id → when it was published
}

// prioStart starts the OTP deployment (1 replica, limit.priority high,
// or normal without classes) and the marketing deployment (2 replicas,
// low, or normal), every replica at rate and burst with limit.min_share
// {low: minShareLow}, and waits until each consumes its queue.
func prioStart(t *testing.T, classes bool, rate float64, burst int, minShareLow float64) *prioScenario {
	t.Helper()
	s := &prioScenario{
		t:         t,
		bin:       cliBuild(t),
		amqpURL:   testenv.AMQPURL(t),
		bucket:    testenv.Name(t, "prio"),
		sink:      cliNewSink(t),
		published: map[int]time.Time{},
	}
	redisAddr := testenv.RedisAddr(t)
	s.otpQ, s.mktQ = s.bucket+"-otp", s.bucket+"-mkt"
	s.conn, s.otpCh = cliQueue(t, s.amqpURL, s.otpQ)
	_, s.mktCh = cliQueue(t, s.amqpURL, s.mktQ)
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range s.procs {
				t.Logf("%s output:\n%s", p.name, faultTail(p.out.String(), 40))
			}
		}
	})
	config := func(class, queue string, prefetch int) string {
		yaml := fmt.Sprintf(`redis:
  addr: %s
limit:
  bucket: %s
  rate: %v
  burst: %d
  priority: %s
  priority_header: x-priority
  min_share: {low: %v}
source:
  rabbitmq:
    url: ${PRIO_AMQP_URL}
    queue: %s
    prefetch: %d
    declare: true
sink:
  http:
    url: %s/send
    timeout: 5s
delivery:
  drain_timeout: 10s
metrics:
  listen: "127.0.0.1:0"
log:
  level: info
  format: json
`, redisAddr, s.bucket, rate, burst, class, minShareLow, queue, prefetch, s.sink.srv.URL)
		path := filepath.Join(t.TempDir(), queue+".yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	start := func(name, path string) {
		cmd := exec.Command(s.bin, "run", "--config", path)
		cmd.Env = append(os.Environ(), "PRIO_AMQP_URL="+s.amqpURL)
		s.procs = append(s.procs, &faultFleetProc{faultProc: faultStartCmd(t, name, cmd), Config: path})
	}
	// OTP's replica holds up to 100 messages, enough for a surge at
	// 60/s; each marketing replica holds 50, which without classes are
	// all reserved ahead of every OTP message.
	otpClass, mktClass := "high", "low"
	if !classes {
		otpClass, mktClass = "normal", "normal"
	}
	otp, mkt := config(otpClass, s.otpQ, 100), config(mktClass, s.mktQ, 50)
	start("otp", otp)
	start("marketing 1", mkt)
	start("marketing 2", mkt)
	testenv.Eventually(t, 30*time.Second, "every replica consuming", func() bool {
		for _, p := range s.procs {
			if p.Exited() {
				t.Fatalf("%s exited early:\n%s", p.name, faultTail(p.out.String(), 40))
			}
		}
		return cliQueueState(s.conn, s.otpQ).Consumers == 1 && cliQueueState(s.conn, s.mktQ).Consumers == 2
	})
	return s
}

// publish publishes {"id": id} to queue on ch, with headers.
func (s *prioScenario) publish(ch *amqp.Channel, queue string, id int, headers amqp.Table) {
	s.t.Helper()
	ctx := testenv.Context(s.t, 10*time.Second)
	err := ch.PublishWithContext(ctx, "", queue, true, false, amqp.Publishing{
		ContentType: "application/json",
		MessageId:   strconv.Itoa(id),
		Headers:     headers,
		Body:        []byte(fmt.Sprintf(`{"id":%d}`, id)),
	})
	if err != nil {
		s.t.Fatalf("publishing: %v", err)
	}
}

// backlog publishes n marketing messages, ids 0 to n-1.
func (s *prioScenario) backlog(n int) {
	for id := range n {
		s.publish(s.mktCh, s.mktQ, id, nil)
	}
}

// otp publishes OTP messages at rate per second, from id next on, until
// until, recording when each was published, and returns the next id.
func (s *prioScenario) otp(rate float64, next int, until time.Time) int {
	every := time.Duration(float64(time.Second) / rate)
	at := time.Now()
	for at.Before(until) {
		faultSleepUntil(s.t.Context(), at)
		now := time.Now()
		s.mu.Lock()
		s.published[next] = now
		s.mu.Unlock()
		s.publish(s.otpCh, s.otpQ, next, nil)
		next++
		at = at.Add(every)
	}
	return next
}

// arrivals returns the first arrival of each message at the sink, OTP's
// and marketing's apart.
func (s *prioScenario) arrivals() (otp map[int]time.Time, mkt []time.Time) {
	s.sink.mu.Lock()
	defer s.sink.mu.Unlock()
	otp = map[int]time.Time{}
	seen := map[int]bool{}
	for _, a := range s.sink.arrivals {
		if seen[a.id] {
			continue
		}
		seen[a.id] = true
		if a.id >= prioOTPBase {
			otp[a.id] = a.at
		} else {
			mkt = append(mkt, a.at)
		}
	}
	slices.SortFunc(mkt, func(a, b time.Time) int { return a.Compare(b) })
	return otp, mkt
}

// latencies returns, sorted, the time from publish to the sink of the OTP
// messages published in [from, to), and how many of them never arrived.
func (s *prioScenario) latencies(otp map[int]time.Time, from, to time.Time) (lat []time.Duration, missing int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, pub := range s.published {
		if pub.Before(from) || !pub.Before(to) {
			continue
		}
		at, ok := otp[id]
		if !ok {
			missing++
			continue
		}
		lat = append(lat, at.Sub(pub))
	}
	slices.Sort(lat)
	return lat, missing
}

// quantile returns the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// otpTimes returns the arrival times of otp, sorted.
func otpTimes(otp map[int]time.Time) []time.Time {
	ts := make([]time.Time, 0, len(otp))
	for _, at := range otp {
		ts = append(ts, at)
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts
}

// TestPriorityOTPMarketingE2E is the priority scenario through the
// binary, with the shared Redis and RabbitMQ: an OTP deployment (1
// replica, limit.priority high) and a marketing deployment (2 replicas,
// low, a backlog) share a bucket at 40/s, every replica with min_share
// {low: 0.1}.
//
//   - While OTP publishes 10/s, an OTP message's time from publish to the
//     sink stays short (issue target: p99 <= 300 ms; without classes it
//     waited behind every marketing reservation) and marketing keeps what
//     OTP leaves (target: >= 27/s).
//   - When OTP surges to 60/s, above the bucket, OTP gets the bucket but
//     marketing's floor (target: OTP >= 90% of 36/s, marketing >= 4/s).
//
// A marketing message whose x-priority header names no class is
// dead-lettered with the reason. The CI run measures 8 s per phase;
// THROTTLE_SIM=1 measures 30 s per phase, first with every replica in
// the normal class (no classes: measured, not checked), and logs the
// figures of docs/benchmarks/priority.md:
//
//	THROTTLE_SIM=1 go test -count=1 -run TestPriorityOTPMarketingE2E -v ./integration/
func TestPriorityOTPMarketingE2E(t *testing.T) {
	phase := 8 * time.Second
	if os.Getenv("THROTTLE_SIM") != "" {
		phase = 30 * time.Second
		t.Run("classes=off", func(t *testing.T) { e2ePriority(t, false, phase) })
	}
	t.Run("classes=on", func(t *testing.T) { e2ePriority(t, true, phase) })
}

// e2ePriority runs the scenario, with or without classes, measuring
// each phase for phase.
func e2ePriority(t *testing.T, classes bool, phase time.Duration) {
	const (
		rate    = 40.0
		burst   = 10
		floor   = 0.1
		otpRate = 10.0
		surge   = 60.0
		settle  = 2 * time.Second // excluded at the start of phase 1
		// excluded at the start of the surge: the shares settle within
		// about 3 s (measured in 8 s runs: marketing 2, 9, 0, 3 in its
		// first seconds, then 4 each)
		surgeSettle = 3 * time.Second
		shareMin    = 0.9
	)
	s := prioStart(t, classes, rate, burst, floor)
	// First a marketing message whose header names no class, then
	// marketing's backlog, which outlasts both phases at the full rate.
	s.publish(s.mktCh, s.mktQ, prioOTPBase-1, amqp.Table{"x-priority": "urgent"})
	s.backlog(int(rate * (2*phase + settle + surgeSettle + 10*time.Second).Seconds()))
	testenv.Eventually(t, 20*time.Second, "marketing delivering", func() bool {
		_, mkt := s.arrivals()
		return len(mkt) > burst
	})

	// Phase 1: OTP at 10/s beside marketing's backlog.
	p1 := time.Now()
	next := s.otp(otpRate, prioOTPBase, p1.Add(settle+phase))
	// Phase 2: the surge.
	p2 := time.Now()
	s.otp(surge, next, p2.Add(surgeSettle+phase))
	// The OTP messages of phase 1 have all arrived long before: the surge
	// took seconds.
	otp, mkt := s.arrivals()

	metrics := map[string]string{}
	for _, p := range s.procs[:2] {
		_, body := cliGet("http://" + p.MetricsAddr(t) + "/metrics")
		metrics[p.name] = body
	}
	code, status, stderr := faultExec(t, []string{"PRIO_AMQP_URL=" + s.amqpURL}, s.bin, "bucket", "status", s.bucket, "--config", s.procs[0].Config)
	for _, p := range s.procs {
		if c := p.Stop(syscall.SIGTERM, 20*time.Second); c != 0 {
			t.Errorf("%s exited with %d after SIGTERM, want 0", p.name, c)
		}
	}

	lat, missing := s.latencies(otp, p1.Add(settle), p1.Add(settle+phase))
	mkt1 := float64(faultCount(mkt, p1.Add(settle), p1.Add(settle+phase))) / phase.Seconds()
	p50, p99, worst := quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 1)
	t.Logf("classes=%v: OTP at %v/s beside the marketing backlog, %v: OTP latency p50 %v, p99 %v, max %v (%d messages, %d not delivered); marketing %.1f/s",
		classes, otpRate, phase, p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond), len(lat), missing, mkt1)
	from, to := p2.Add(surgeSettle), p2.Add(surgeSettle+phase)
	otp2 := float64(faultCount(otpTimes(otp), from, to)) / phase.Seconds()
	mkt2 := float64(faultCount(mkt, from, to)) / phase.Seconds()
	above := rate * (1 - floor)
	t.Logf("classes=%v: OTP surge at %v/s, %v: OTP %.1f/s (%.0f%% of the %.0f/s above marketing's floor), marketing %.1f/s (floor %.0f/s); per second OTP %v, marketing %v",
		classes, surge, phase, otp2, 100*otp2/above, above, mkt2, rate*floor,
		faultPerSecond(otpTimes(otp), from, to), faultPerSecond(mkt, from, to))
	t.Logf("bucket status during the surge:\n%s", status)
	if !classes {
		return // measured, not checked
	}

	// Phase 1.
	if missing > 0 || len(lat) < int(otpRate*phase.Seconds())-1 {
		t.Errorf("phase 1: %d OTP messages measured, %d not delivered; want all %v", len(lat), missing, otpRate*phase.Seconds())
	}
	if p99 > 300*time.Millisecond {
		t.Errorf("OTP p99 latency %v, want <= 300ms", p99)
	}
	if mkt1 < 27 {
		t.Errorf("marketing delivered %.1f/s while OTP flowed, want >= 27/s", mkt1)
	}

	// Phase 2.
	if otp2 < shareMin*above {
		t.Errorf("OTP got %.1f/s during the surge, want >= %.1f/s (%.0f%% of the bucket above marketing's floor)", otp2, shareMin*above, 100*shareMin)
	}
	// The floor, within 20% for the edges of the window and a loaded
	// machine (measured in 8 s: 3.6/s to 4.2/s; in 30 s: 4.0/s).
	if mkt2 < 0.8*rate*floor {
		t.Errorf("marketing got %.1f/s during the surge, want its floor, %.1f/s", mkt2, rate*floor)
	}

	// The metrics by class, and bucket status.
	for name, class := range map[string]string{"otp": "high", "marketing 1": "low"} {
		if n := cliMetric(metrics[name], `throttle_limiter_wait_seconds_count{priority="`+class+`"}`); n == 0 {
			t.Errorf("%s: no throttle_limiter_wait_seconds_count{priority=%q}", name, class)
		}
	}
	if n := cliMetric(metrics["marketing 1"], `throttle_limiter_waiting{priority="low"}`); n == 0 {
		t.Errorf("marketing 1: throttle_limiter_waiting{priority=\"low\"} is 0 with a backlog")
	}
	if code != 0 || !strings.Contains(status, "\n  classes     high ") {
		t.Errorf("bucket status: exit %d, no classes line\n%s%s", code, status, stderr)
	}

	// The message whose header named no class was dead-lettered with the
	// reason.
	msg, ok, err := s.mktCh.Get(s.mktQ+".dlq", true)
	if err != nil || !ok {
		t.Fatalf("no dead letter for the message with x-priority: urgent (%v)", err)
	}
	if reason := fmt.Sprint(msg.Headers["x-throttle-error"]); !strings.Contains(reason, `priority header "x-priority"`) || !strings.Contains(reason, "urgent") {
		t.Errorf("dead letter's x-throttle-error = %q, want the header and its value", reason)
	}
}
