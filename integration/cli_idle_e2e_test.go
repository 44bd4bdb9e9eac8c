package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestCLIIdleKafkaMember runs two replicas of the binary in one Kafka
// group on a topic of one partition: the member given no partition is idle,
// and 'bucket status' and 'bucket watch' say which.
func TestCLIIdleKafkaMember(t *testing.T) {
	t.Parallel()
	redisAddr := testenv.RedisAddr(t)
	bin := cliBuild(t)
	name := cliName(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, name), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	sink := cliNewSink(t)
	cfgPath := filepath.Join(t.TempDir(), "throttle.yaml")
	cfg := fmt.Sprintf(`
redis: {addr: %q, timeout: 2s}
limit: {bucket: %s, rate: 50}
source:
  kafka: {brokers: [%q], topic: %s, group: %s}
sink:
  http: {url: %q, timeout: 5s}
delivery: {drain_timeout: 2s}
metrics: {listen: "off"}
`, redisAddr, name, c.ListenAddrs()[0], name, name, sink.srv.URL+"/send")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		p := cliStart(t, bin, "run", "--config", cfgPath)
		t.Cleanup(func() { p.stop(t, 15*time.Second) })
	}
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })
	var st struct {
		Replicas []struct {
			ID   string `json:"id"`
			Idle bool   `json:"idle"`
		} `json:"replicas"`
	}
	idle := 0
	cliWait(t, 40*time.Second, "two live replicas, one of them idle", func() bool {
		out := cliRun(t, bin, "bucket", "status", name, "--redis", redisAddr, "--json")
		if json.Unmarshal([]byte(out), &st) != nil || len(st.Replicas) != 2 {
			return false
		}
		idle = 0
		for _, r := range st.Replicas {
			if r.Idle {
				idle++
			}
		}
		return idle == 1
	})
	out := cliRun(t, bin, "bucket", "status", name, "--redis", redisAddr)
	if !strings.Contains(out, "2 alive, 1 idle") || !strings.Contains(out, "(idle: consumes nothing)") {
		t.Errorf("bucket status does not show the idle member:\n%s", out)
	}
	t.Logf("bucket status:\n%s", out)
}
