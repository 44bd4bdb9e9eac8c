package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestLayersKafkaEndToEnd runs the binary on a Kafka topic (kfake) with a
// per-recipient limit (burst 2, 1/h, on_exceed dead_letter) and a daily
// quota of the account: each recipient gets exactly 2 messages, the rest go
// to the dead-letter topic with x-throttle-limit naming the layer.
func TestLayersKafkaEndToEnd(t *testing.T) {
	t.Parallel()
	redisAddr := testenv.RedisAddr(t)
	bin := cliBuild(t)
	const (
		recipients = 8
		perRecip   = 4
		allowed    = 2
	)
	name := cliName(t)
	topic := name
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic, topic+".dlq"),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	sink := cliNewSink(t)
	cfgPath := filepath.Join(t.TempDir(), "throttle.yaml")
	cfg := fmt.Sprintf(`
redis:
  addr: %q
  timeout: 2s
limit:
  bucket: %s
  rate: 500
  extra:
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 1/h
      burst: %d
      on_exceed: dead_letter
    - name: daily
      quota: 1000000
      per: day
      timezone: America/New_York
source:
  kafka:
    brokers: [%q]
    topic: %s
    group: %s
    dead_letter_topic: %s.dlq
sink:
  http:
    url: %q
    timeout: 5s
delivery:
  drain_timeout: 10s
metrics:
  listen: %q
`, redisAddr, name, allowed, brokers[0], topic, name, topic, sink.srv.URL+"/send", cliMetricsListen)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := cliStart(t, bin, "run", "--config", cfgPath)
	t.Cleanup(func() { p.stop(t, 15*time.Second) })
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })

	to := func(id int) string { return fmt.Sprintf("%s-r%d", name, id%recipients) }
	cl := suiteKgo(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for id := range recipients * perRecip {
		body := fmt.Sprintf(`{"id":%d,"to":%q}`, id, to(id))
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(to(id)), Value: []byte(body)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	wantDead := recipients * (perRecip - allowed)
	dl := suiteKgo(t, brokers, kgo.ConsumeTopics(topic+".dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var dead []*kgo.Record
	for len(dead) < wantDead {
		fs := dl.PollFetches(ctx)
		if ctx.Err() != nil {
			_, unique := sink.counts()
			t.Fatalf("read %d of %d dead letters (%d delivered): %v", len(dead), wantDead, unique, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) { dead = append(dead, r) })
	}
	cliWait(t, 20*time.Second, "the allowed messages delivered", func() bool {
		_, unique := sink.counts()
		return unique == recipients*allowed
	})
	checkPerRecipient(t, sink, recipients, allowed, to)
	for _, r := range dead {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		if h["x-throttle-limit"] != "per-recipient" || !strings.Contains(h["x-throttle-limit-reason"], "exceeded") {
			t.Errorf("dead letter %s: headers %v, want x-throttle-limit: per-recipient", r.Value, h)
		}
	}
	out := cliRun(t, bin, "bucket", "status", "--config", cfgPath, "--layer", "daily")
	if !strings.Contains(out, fmt.Sprintf("used:    %d of 1000000 this day", recipients*allowed)) {
		t.Errorf("bucket status --layer daily: want %d used (the refusals refunded nothing they did not take), got\n%s", recipients*allowed, out)
	}
}
