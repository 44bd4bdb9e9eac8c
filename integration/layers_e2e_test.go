package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestLayersDeadLetterEndToEnd runs two replicas of the binary on one
// RabbitMQ queue with a per-recipient limit (burst 3, 1/h, on_exceed
// dead_letter): each recipient gets exactly 3 messages across both
// replicas, the rest are dead-lettered with x-throttle-limit naming the
// layer, and a message without a recipient is dead-lettered with the
// reason.
func TestLayersDeadLetterEndToEnd(t *testing.T) {
	t.Parallel()
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	const (
		recipients = 10
		perRecip   = 5
		allowed    = 3
		replicas   = 2
	)
	name := cliName(t)
	sink := cliNewSink(t)
	conn, ch := cliQueue(t, amqpURL, name)
	cfgPath, metricsAddrs := cliRabbitFleet(t, bin, conn, name, replicas, fmt.Sprintf(`  rate: 200
  extra:
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 1/h
      burst: %d
      on_exceed: dead_letter`, allowed), "    prefetch: 20", sink.srv.URL+"/send")

	ctx := testenv.Context(t, 60*time.Second)
	publish := func(id int, body string) {
		err := ch.PublishWithContext(ctx, "", name, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent,
			MessageId: strconv.Itoa(id), Body: []byte(body),
		})
		if err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	// The recipient of message id is id % recipients; a unique name per
	// test run keeps the keys of earlier runs out.
	to := func(id int) string { return fmt.Sprintf("%s-r%d", name, id%recipients) }
	for id := range recipients * perRecip {
		publish(id, fmt.Sprintf(`{"id":%d,"to":%q}`, id, to(id)))
	}
	publish(10000, `{"id":10000}`)

	wantDead := recipients*(perRecip-allowed) + 1
	cliWait(t, 30*time.Second, "every message delivered or dead-lettered", func() bool {
		_, unique := sink.counts()
		return unique == recipients*allowed && cliQueueState(conn, name+".dlq").Messages == wantDead
	})
	checkPerRecipient(t, sink, recipients, allowed, to)
	// The dead letters name the limit, or the failed key.
	limited, keyless := 0, 0
	for range wantDead {
		d, ok, err := ch.Get(name+".dlq", true)
		if err != nil || !ok {
			t.Fatalf("reading the dead letters: %v %v", ok, err)
		}
		switch {
		case d.Headers["x-throttle-limit"] == "per-recipient":
			limited++
			if r, _ := d.Headers["x-throttle-limit-reason"].(string); !strings.Contains(r, "exceeded") {
				t.Errorf("x-throttle-limit-reason = %q", r)
			}
		case strings.Contains(fmt.Sprint(d.Headers), "per-recipient") && strings.Contains(fmt.Sprint(d.Headers), "limit.extra[0].key"):
			keyless++
		default:
			t.Errorf("dead letter %s: headers %v", d.Body, d.Headers)
		}
	}
	if limited != wantDead-1 || keyless != 1 {
		t.Errorf("dead letters: %d limited, %d without a key; want %d and 1", limited, keyless, wantDead-1)
	}
	// The refusals are counted by layer and action, never by key.
	var refused float64
	for _, addr := range metricsAddrs {
		_, body := cliGet("http://" + addr + "/metrics")
		refused += cliMetric(body, `throttle_limit_exceeded_total{action="dead_letter",layer="per-recipient",shadow="false"}`)
		if strings.Contains(body, name+"-r") {
			t.Errorf("a metric of %s names a key", addr)
		}
	}
	if int(refused) != wantDead-1 {
		t.Errorf("throttle_limit_exceeded_total{per-recipient,dead_letter} over the replicas = %v, want %d", refused, wantDead-1)
	}

	// The operator's view: the layer list with its keys in use, one key,
	// and a reset of that key.
	out := cliRun(t, bin, "bucket", "status", "--config", cfgPath)
	if !strings.Contains(out, "per-recipient") || !strings.Contains(out, fmt.Sprintf("%d keys in use", recipients)) {
		t.Errorf("bucket status --config: want the layer with %d keys in use, got\n%s", recipients, out)
	}
	// Spent, and refilling at 1/h: it shows 0.001 from 1.8 s after the
	// last take, which a loaded machine can reach; 0.010 is 36 s.
	out = cliRun(t, bin, "bucket", "status", "--config", cfgPath, "--layer", "per-recipient", "--key", to(0))
	tokens := 3.0
	if m := regexp.MustCompile(`tokens:  (-?\d+\.\d+) of 3`).FindStringSubmatch(out); m != nil {
		tokens, _ = strconv.ParseFloat(m[1], 64)
	}
	if tokens > 0.010 {
		t.Errorf("bucket status --layer --key: want at most 0.010 of 3 tokens (spent, refilling at 1/h), got\n%s", out)
	}
	out = cliRun(t, bin, "bucket", "reset", "--config", cfgPath, "--layer", "per-recipient", "--key", to(0))
	if !strings.Contains(out, "its bucket is full") {
		t.Errorf("bucket reset --layer --key: %s", out)
	}
	out = cliRun(t, bin, "bucket", "status", "--config", cfgPath, "--layer", "per-recipient", "--key", to(0), "--json")
	if !strings.Contains(out, `"full": true`) {
		t.Errorf("bucket status --layer --key --json after the reset: want full, got\n%s", out)
	}
}

// TestLayersBadConfigExits2 runs the binary on configurations with a bad
// limit.extra: each exits 2 with the YAML key at fault.
func TestLayersBadConfigExits2(t *testing.T) {
	t.Parallel()
	bin := cliBuild(t)
	base := `
redis: {addr: "127.0.0.1:6379"}
limit:
  bucket: b
  rate: 10
  extra:
    - name: l
%s
source:
  rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: q}
sink:
  stdout: {}
`
	cases := []struct{ name, layer, key string }{
		{"bad rate", "      rate: 5/fortnight", "limit.extra[0].rate"},
		{"unknown on_exceed", "      rate: 1\n      on_exceed: drop", "limit.extra[0].on_exceed"},
		{"template that does not parse", "      rate: 1\n      key: '{{.JSON.to'", "limit.extra[0].key"},
		{"quota with rate", "      rate: 1\n      quota: 5\n      per: day", "limit.extra[0].quota"},
		{"unknown time zone", "      quota: 5\n      per: day\n      timezone: Europe/Atlantis", "limit.extra[0].timezone"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "throttle.yaml")
			if err := os.WriteFile(path, []byte(fmt.Sprintf(base, tc.layer)), 0o600); err != nil {
				t.Fatal(err)
			}
			code, _, stderr := faultExec(t, nil, bin, "run", "--config", path)
			if code != 2 || !strings.Contains(stderr, tc.key) {
				t.Errorf("exit %d, stderr %q; want exit 2 naming %s", code, stderr, tc.key)
			}
		})
	}
}

// checkPerRecipient fails t unless the sink received exactly allowed
// distinct messages for each of the recipients, to(id) naming the
// recipient of message id.
func checkPerRecipient(t *testing.T, sink *cliSink, recipients, allowed int, to func(int) string) {
	t.Helper()
	sink.mu.Lock()
	perTo := map[string]int{}
	for id := range sink.seen {
		perTo[to(id)]++
	}
	sink.mu.Unlock()
	for r := range recipients {
		if n := perTo[to(r)]; n != allowed {
			t.Errorf("recipient %s got %d messages, want exactly %d", to(r), n, allowed)
		}
	}
}
