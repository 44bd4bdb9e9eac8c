package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

// faultRecordingSink is an HTTP endpoint that records the requests of the
// body template faultBodyTemplate, and rejects the permanent ids with 400.
type faultRecordingSink struct {
	*httptest.Server
	mu          sync.Mutex
	ok          map[string]int
	rejected    map[string]int
	redelivered int
}

// faultBodyTemplate makes the HTTP sink say which message it sends and
// whether the broker redelivered it.
const faultBodyTemplate = `{"id":"{{.Body}}","redelivered":{{.Source.Redelivered}}}`

func faultStartRecordingSink(t *testing.T) *faultRecordingSink {
	t.Helper()
	s := &faultRecordingSink{ok: map[string]int{}, rejected: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID          string `json:"id"`
			Redelivered bool   `json:"redelivered"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if req.Redelivered {
			s.redelivered++
		}
		if faultIsPermanent(req.ID) {
			s.rejected[req.ID]++
			http.Error(w, "rejected by the test", http.StatusBadRequest)
			return
		}
		s.ok[req.ID]++
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(s.Close)
	return s
}

// counts returns the distinct ids delivered and rejected, the duplicate
// deliveries, and the redelivered requests.
func (s *faultRecordingSink) counts() (ok, rejected, dup, redelivered int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.ok {
		dup += n - 1
	}
	return len(s.ok), len(s.rejected), dup, s.redelivered
}

// TestFaultReplicaKilled runs three `throttle run` processes on one
// RabbitMQ queue, sharing one bucket in a test-owned Redis, and SIGKILLs
// one mid-run: the broker redelivers its unacked messages to the others,
// which handle them, and every message ends delivered or dead-lettered.
// The other two then stop on SIGTERM with exit code 0.
func TestFaultReplicaKilled(t *testing.T) {
	t.Parallel()
	const rate = 100
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	redisSrv := faultStartRedis(t)
	sink := faultStartRecordingSink(t)
	queue := faultName(t)
	ids := faultMessageIDs(600)
	ch := faultRabbitQueue(t, amqpURL, queue, ids)

	dir := t.TempDir()
	conf := filepath.Join(dir, "throttle.yaml")
	yaml := fmt.Sprintf(`redis:
  addr: %s
  timeout: 250ms
limit:
  bucket: %s
  rate: %d
  burst: 10
source:
  rabbitmq:
    url: ${FAULT_AMQP_URL}
    queue: %s
    prefetch: 10
    declare: true
sink:
  http:
    url: %s
    timeout: 2s
    body_template: '%s'
delivery:
  max_attempts: 5
  backoff: 50ms
  drain_timeout: 5s
metrics:
  listen: "off"
log:
  level: info
  format: json
`, redisSrv.Addr(), faultName(t), rate, queue, sink.URL+"/send", faultBodyTemplate)
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var procs []*faultProc
	for i := range 3 {
		cmd := exec.Command(bin, "run", "--config", conf)
		cmd.Env = append(os.Environ(), "FAULT_AMQP_URL="+amqpURL)
		procs = append(procs, faultStartCmd(t, fmt.Sprintf("throttle run #%d", i), cmd))
	}
	defer func() {
		if t.Failed() {
			for _, p := range procs {
				t.Logf("%s output:\n%s", p.name, p.out)
			}
		}
	}()

	start := time.Now()
	testenv.Eventually(t, 30*time.Second, "a quarter of the messages delivered", func() bool {
		ok, _, _, _ := sink.counts()
		return ok >= len(ids)/4
	})
	atKill, _, _, _ := sink.counts()
	killAt := time.Now()
	procs[0].Kill()
	for _, p := range procs[1:] {
		if p.Exited() {
			t.Fatalf("%s exited:\n%s", p.name, p.out)
		}
	}
	wantOK, wantDead := 0, 0
	for _, id := range ids {
		if faultIsPermanent(id) {
			wantDead++
		} else {
			wantOK++
		}
	}
	testenv.Eventually(t, 30*time.Second, "every message delivered", func() bool {
		ok, _, _, _ := sink.counts()
		return ok == wantOK
	})
	doneAt := time.Now()
	testenv.Eventually(t, 10*time.Second, "the dead-letter queue holding exactly the rejected messages", func() bool {
		return faultQueueDepth(t, ch, queue+".dlq") == wantDead
	})
	for _, p := range procs[1:] {
		if code := p.Stop(syscall.SIGTERM, 15*time.Second); code != 0 {
			t.Errorf("%s exited with %d after SIGTERM, want 0:\n%s", p.name, code, p.out)
		}
	}
	if n := faultQueueDepth(t, ch, queue); n != 0 {
		t.Errorf("%d messages left in the queue after the replicas stopped", n)
	}
	ok, rejected, dup, redelivered := sink.counts()
	if redelivered == 0 {
		t.Error("no redelivered message reached the sink: the killed replica's unacked deliveries were not handled by the others")
	}
	rateAll := float64(ok+rejected+dup) / doneAt.Sub(start).Seconds()
	t.Logf("3 replicas at a shared %d/s, one SIGKILLed after %d deliveries (%v in): %d delivered (+%d duplicates), %d rejected and dead-lettered (%d in the DLQ), %d redelivered requests handled by the survivors, 0 left in the queue; %.0f requests/s overall, done %v after the kill",
		rate, atKill, killAt.Sub(start).Round(time.Millisecond), ok, dup, rejected, wantDead, redelivered, rateAll, doneAt.Sub(killAt).Round(time.Millisecond))
	if strings.Contains(procs[1].out.String(), "guest:guest@") {
		t.Error("a replica logged the AMQP password")
	}
}
