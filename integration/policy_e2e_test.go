package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestWindowEndToEnd runs the binary with a send window by number
// (timezone: e164) over recipients in two zones: New York, inside its
// window, and Los Angeles, whose window opens 10 s after the start (the
// window's boundaries are computed from now, in each zone's local time).
// The New York messages are delivered at once; the Los Angeles ones are
// set aside, none is delivered before its window opens, the first within
// 1 s after, and the rest at the bucket's rate, not as a spike.
func TestWindowEndToEnd(t *testing.T) {
	// Not parallel: it bounds arrival times to a second.
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	const (
		rate   = 10
		burst  = 2
		nyMsgs = 5
		laMsgs = 12
	)
	name := cliName(t)
	sink := cliNewSink(t)
	conn, ch := cliQueue(t, amqpURL, name)

	la, _ := time.LoadLocation("America/Los_Angeles")
	opens := time.Now().Add(10 * time.Second).Truncate(time.Second)
	// One calendar for both: from = Los Angeles's local time 10 s from now,
	// to = 4 hours later. New York's local time now, 3 hours ahead, is
	// inside; Los Angeles's is 10 s before from.
	clock := func(t time.Time) string { return t.In(la).Format("15:04:05") }
	from, to := clock(opens), clock(opens.Add(4*time.Hour))
	cfgPath := filepath.Join(t.TempDir(), "throttle.yaml")
	cfg := fmt.Sprintf(`
redis: {addr: %q, timeout: 2s}
limit:
  bucket: %s
  rate: %d
  burst: %d
  extra:
    - name: quiet-hours
      key: '{{e164 .JSON.to}}'
      window: {from: %q, to: %q}
      timezone: e164
source:
  rabbitmq: {url: %q, queue: %s, prefetch: 50, declare: true}
sink:
  http: {url: %q, timeout: 5s}
delivery: {drain_timeout: 5s}
metrics: {listen: %q}
`, redisAddr, name, rate, burst, from, to, amqpURL, name, sink.srv.URL+"/send", cliMetricsListen)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := cliStart(t, bin, "run", "--config", cfgPath)
	t.Cleanup(func() { p.stop(t, 15*time.Second) })
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })
	cliWait(t, 20*time.Second, "a consumer on the queue", func() bool { return cliQueueState(conn, name).Consumers == 1 })
	if time.Until(opens) < 3*time.Second {
		t.Fatalf("the replica took %v to start: too close to the window's opening to tell the two zones apart", 10*time.Second-time.Until(opens))
	}

	ctx := testenv.Context(t, 60*time.Second)
	publish := func(id int, to string) {
		err := ch.PublishWithContext(ctx, "", name, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent,
			MessageId: strconv.Itoa(id), Body: []byte(fmt.Sprintf(`{"id":%d,"to":%q}`, id, to)),
		})
		if err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	// Los Angeles first, so that New York's messages queue behind them.
	for i := range laMsgs {
		publish(1000+i, fmt.Sprintf("+1 (415) 555-%04d", i))
	}
	published := time.Now()
	for i := range nyMsgs {
		publish(i, fmt.Sprintf("1212555%04d", i))
	}
	cliWait(t, 40*time.Second, "every message delivered", func() bool {
		_, unique := sink.counts()
		return unique == nyMsgs+laMsgs
	})

	sink.mu.Lock()
	arrivals := append([]cliArrival(nil), sink.arrivals...)
	sink.mu.Unlock()
	var ny, laTimes []time.Time
	for _, a := range arrivals {
		if a.id >= 1000 {
			laTimes = append(laTimes, a.at)
		} else {
			ny = append(ny, a.at)
		}
	}
	// New York: at once, at the bucket's pace from the publish.
	nyLast := ny[len(ny)-1].Sub(published)
	t.Logf("New York: %d messages, the last %v after publishing (window open)", len(ny), nyLast.Round(time.Millisecond))
	if want := time.Duration(float64(nyMsgs-burst)/rate*float64(time.Second)) + time.Second; nyLast > want {
		t.Errorf("New York's last message %v after publishing, want at most %v: held up behind Los Angeles?", nyLast, want)
	}
	// Los Angeles: none before the window opens, the first within 1 s,
	// the rest at the rate.
	first, last := laTimes[0], laTimes[len(laTimes)-1]
	t.Logf("Los Angeles: %d messages, the first %v after the window opened, the last %v; %.1f msg/s after the burst",
		len(laTimes), first.Sub(opens).Round(time.Millisecond), last.Sub(opens).Round(time.Millisecond), cliRate(laTimes, burst))
	if first.Before(opens) {
		t.Errorf("a Los Angeles message arrived %v before its window opened", opens.Sub(first))
	}
	if first.After(opens.Add(time.Second)) {
		t.Errorf("the first Los Angeles message arrived %v after its window opened, want within 1s", first.Sub(opens))
	}
	if r := cliRate(laTimes, burst); r > rate*1.15 {
		t.Errorf("Los Angeles's backlog went out at %.1f msg/s, above the bucket's %d/s: a spike", r, rate)
	}
	if span, want := last.Sub(first), time.Duration(float64(laMsgs-burst-1)/rate*float64(time.Second)); span < want {
		t.Errorf("Los Angeles's %d messages took %v, want at least %v at %d/s", laMsgs, span, want, rate)
	}

	out := cliRun(t, bin, "bucket", "status", "--config", cfgPath, "--layer", "quiet-hours", "--key", "+14155550000")
	if !strings.Contains(out, "window:  open") {
		t.Errorf("bucket status --layer quiet-hours --key: want the window open, got\n%s", out)
	}
}

// TestBudgetFleetEndToEnd runs 3 replicas of the binary against a daily
// budget of 1.00 at 0.04 a segment (GB): exactly 25 segments are
// delivered, the rest held (on_exceed wait) and none lost; bucket status
// and the metrics say 1.00 spent, 0.00 left.
func TestBudgetFleetEndToEnd(t *testing.T) {
	t.Parallel()
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	const (
		replicas = 3
		msgs     = 40 // 2 segments each: 80 segments, 3.20 at 0.04
	)
	name := cliName(t)
	sink := cliNewSink(t)
	conn, ch := cliQueue(t, amqpURL, name)
	dir := t.TempDir()
	var (
		cfgPath string
		metrics []string
	)
	for i := range replicas {
		cfgPath = filepath.Join(dir, fmt.Sprintf("replica-%d.yaml", i+1))
		cfg := fmt.Sprintf(`
redis: {addr: %q, timeout: 2s}
limit:
  bucket: %s
  rate: 500
  cost_template: '{{.JSON.segments}}'
  prices: {currency: USD, default: 0.0079, per_segment: true, countries: {GB: 0.04}, recipient: '{{e164 .JSON.to}}'}
  extra:
    - name: daily-spend
      budget: 1.00
      per: day
      timezone: UTC
source:
  rabbitmq: {url: %q, queue: %s, prefetch: 20, declare: true}
sink:
  http: {url: %q, timeout: 5s}
delivery: {drain_timeout: 2s}
metrics: {listen: %q}
`, redisAddr, name, amqpURL, name, sink.srv.URL+"/send", cliMetricsListen)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		p := cliStart(t, bin, "run", "--config", cfgPath)
		t.Cleanup(func() { p.stop(t, 15*time.Second) })
		metrics = append(metrics, cliServingAddr(t, p))
	}
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", "--config", cfgPath) })
	cliWait(t, 20*time.Second, "three consumers on the queue", func() bool { return cliQueueState(conn, name).Consumers == replicas })

	ctx := testenv.Context(t, 60*time.Second)
	// Mostly 2 segments; one message of 1 segment makes 25 an odd total,
	// so that an off-by-one price would show.
	segments := func(id int) int {
		if id == 0 {
			return 1
		}
		return 2
	}
	for id := range msgs {
		err := ch.PublishWithContext(ctx, "", name, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent,
			MessageId: strconv.Itoa(id), Body: []byte(fmt.Sprintf(`{"id":%d,"to":"+44 20 7946 %04d","segments":%d}`, id, id, segments(id))),
		})
		if err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	countSegments := func() int {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		n := 0
		for id := range sink.seen {
			n += segments(id)
		}
		return n
	}
	cliWait(t, 30*time.Second, "25 segments delivered", func() bool { return countSegments() >= 25 })
	// Then they hold: the budget is spent for the day. Held messages wait
	// in the replicas (unacked), none is lost or dead-lettered.
	held := time.Now().Add(2 * time.Second)
	cliWait(t, 10*time.Second, "2 s of holding", func() bool { return time.Now().After(held) })
	if n := countSegments(); n != 25 {
		t.Fatalf("delivered %d segments against a budget of 1.00 at 0.04, want exactly 25", n)
	}
	if q := cliQueueState(conn, name+".dlq"); q.Messages != 0 {
		t.Errorf("%d messages dead-lettered, want none (on_exceed wait)", q.Messages)
	}
	out := cliRun(t, bin, "bucket", "status", "--config", cfgPath)
	if !strings.Contains(out, "spent 1.00 this day, 0.00 left") {
		t.Errorf("bucket status: want spent 1.00, 0.00 left, got\n%s", out)
	}
	cliWait(t, 15*time.Second, "throttle_budget_spent 1 on every replica", func() bool {
		for _, addr := range metrics {
			_, body := cliGet("http://" + addr + "/metrics")
			if cliMetric(body, `throttle_budget_spent{layer="daily-spend"}`) != 1 || cliMetric(body, `throttle_budget_limit{layer="daily-spend"}`) != 1 {
				return false
			}
		}
		return true
	})
}
