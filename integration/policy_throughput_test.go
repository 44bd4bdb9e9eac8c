package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestWindowThroughput measures `throttle run` (RabbitMQ → HTTP) with the
// shared bucket alone and with a send window by number (timezone: e164,
// open all day, so that every message passes it) over as many distinct
// recipients as messages, in alternation, and logs messages/s and their
// ratio. It is a measurement, not a check: it runs only with
// THROTTLE_POLICY_BENCH=1.
//
//	THROTTLE_POLICY_BENCH=1 go test ./integration/ -run TestWindowThroughput -v
func TestWindowThroughput(t *testing.T) {
	if os.Getenv("THROTTLE_POLICY_BENCH") != "1" {
		t.Skip("a measurement: set THROTTLE_POLICY_BENCH=1")
	}
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	n := 20000
	if s := os.Getenv("THROTTLE_POLICY_BENCH_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	rounds := 5
	if s := os.Getenv("THROTTLE_POLICY_BENCH_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	run := func(window bool) float64 {
		name := cliName(t) + strconv.FormatBool(window)
		sink := cliNewSink(t)
		_, ch := cliQueue(t, amqpURL, name)
		extra := ""
		if window {
			extra = "  extra:\n    - {name: quiet-hours, key: '{{e164 .JSON.to}}', window: {from: \"00:00\", to: \"24:00\"}, timezone: e164}\n"
		}
		cfgPath := filepath.Join(t.TempDir(), "throttle.yaml")
		cfg := fmt.Sprintf(`
redis: {addr: %q, timeout: 2s}
limit:
  bucket: %s
  rate: 1000000
%ssource:
  rabbitmq: {url: %q, queue: %s, prefetch: 100, concurrency: 100, declare: true}
sink:
  http: {url: %q, timeout: 5s}
metrics: {listen: %q}
`, redisAddr, name, extra, amqpURL, name, sink.srv.URL+"/send", cliMetricsListen)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{
			"x-dead-letter-exchange": name + ".dlx",
		}); err != nil {
			t.Fatal(err)
		}
		ctx := testenv.Context(t, 120*time.Second)
		for i := range n {
			err := ch.PublishWithContext(ctx, "", name, false, false, amqp.Publishing{
				ContentType: "application/json",
				Body:        []byte(fmt.Sprintf(`{"id":%d,"to":"+1 (212) 5%02d-%04d"}`, i, i/10000, i%10000)),
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		p := cliStart(t, bin, "run", "--config", cfgPath)
		cliWait(t, 120*time.Second, "every message delivered", func() bool { _, u := sink.counts(); return u == n })
		p.stop(t, 15*time.Second)
		ts := sink.times()
		from := ts[n/10] // the first 10% warm the replica up
		return float64(n-n/10) / ts[n-1].Sub(from).Seconds()
	}
	var plain, windowed, ratios []float64
	for range rounds {
		a, z := run(false), run(true)
		plain, windowed, ratios = append(plain, a), append(windowed, z), append(ratios, z/a)
		t.Logf("shared %.0f msgs/s, shared + window by number %.0f msgs/s (%.2f×)", a, z, z/a)
	}
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	t.Logf("medians over %d alternations of %d messages: shared %.0f msgs/s, with the window %.0f msgs/s, ratio %.2f×", rounds, n, median(plain), median(windowed), median(ratios))
}
