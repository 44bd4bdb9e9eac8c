package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/integration/campaign"
	"github.com/throttlehq/throttle/internal/testenv"
)

// A fleet is a set of throttle replicas, each a process of the built
// binary, that consume one RabbitMQ queue through one shared bucket and
// deliver to one recording HTTP sink. The fault tests on the binary break
// Redis under a fleet and measure what the sink received.

// faultFleetSpec says how to run a fleet.
type faultFleetSpec struct {
	// Redis is the YAML of the redis section's body, indented by four
	// spaces, such as "    addr: 127.0.0.1:6380\n".
	Redis string
	// Rates are the configured limit.rate of each replica; one replica per
	// entry.
	Rates []float64
	// Burst is limit.burst.
	Burst int
	// OnStoreError is limit.on_store_error; empty for the default.
	OnStoreError string
	// LimitExtra is added to the limit section as is, indented by two
	// spaces, such as "  fallback_rate: 5\n".
	LimitExtra string
	// Prefetch is source.rabbitmq.prefetch; 0 means 10.
	Prefetch int
	// Extra is appended to the config as is, such as a sink.http.push_back
	// override.
	Extra string
	// Env is added to each replica's environment.
	Env []string
	// SinkURL is the HTTP sink's URL; empty for the fleet's recording sink.
	SinkURL string
	// Metrics turns the metrics server on, on a port the system picks;
	// faultFleetProc.MetricsAddr finds it.
	Metrics bool
}

// sinkURL returns sink.http.url for spec.
func (f *faultFleet) sinkURL(spec faultFleetSpec) string {
	if spec.SinkURL != "" {
		return spec.SinkURL
	}
	return f.Sink.srv.URL + "/send"
}

// metricsListen returns metrics.listen for spec.
func (f *faultFleet) metricsListen(spec faultFleetSpec) string {
	if !spec.Metrics {
		return "off"
	}
	return "127.0.0.1:0"
}

// faultFleet is a running fleet.
type faultFleet struct {
	t       *testing.T
	bin     string
	name    string // the bucket and the queue
	amqpURL string
	conn    *amqp.Connection
	ch      *amqp.Channel
	Sink    *cliSink
	Procs   []*faultFleetProc
	// Stalls measures how late the test's goroutines wake up: the sink's
	// clock stands still as long.
	Stalls *testenv.Stalls
}

// faultFleetProc is one replica.
type faultFleetProc struct {
	*faultProc
	Config string // the path of its config file
}

// faultStartFleet starts one replica per spec.Rates entry and waits until
// every one consumes from the queue.
func faultStartFleet(t *testing.T, spec faultFleetSpec) *faultFleet {
	t.Helper()
	f := faultNewFleet(t)
	for _, rate := range spec.Rates {
		f.Start(spec, rate)
	}
	f.WaitConsumers(len(spec.Rates))
	return f
}

// faultSharedRedis is the redis: block (lines indented two spaces) of a
// fleet on the shared Redis whose test is not about Redis failing: a 2 s
// timeout, since a loaded machine answers slower than the 250 ms default
// now and then, and a replica then limits locally, where its fleet's
// promises hold per replica only (full suites logged such i/o timeouts
// on the shared Redis, and after them pauses of 1 to 1.6 s while replicas
// started limiting locally, and duplicate sends under dedupe).
func faultSharedRedis(t testing.TB) string {
	return "  addr: " + testenv.RedisAddr(t) + "\n  timeout: 2s\n"
}

// faultNewFleet prepares a fleet without replicas: the binary, a unique
// name, the queue's connection and the sink.
func faultNewFleet(t *testing.T) *faultFleet {
	t.Helper()
	f := &faultFleet{t: t, amqpURL: testenv.AMQPURL(t), name: faultName(t)}
	f.bin = cliBuild(t)
	f.conn, f.ch = cliQueue(t, f.amqpURL, f.name)
	f.Sink = cliNewSink(t)
	f.Stalls = testenv.MeasureStalls(t)
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range f.Procs {
				t.Logf("%s output:\n%s", p.name, faultTail(p.out.String(), 60))
			}
		}
	})
	return f
}

// WindowBound returns bound, the most deliveries a 1 s window may hold at
// rate on a machine that never stalls, widened by the longest stall
// measured so far.
func (f *faultFleet) WindowBound(bound int, rate float64) int {
	return testenv.WindowBound(bound, rate, f.Stalls.Max())
}

// ReplicaStalls returns the longest stall any replica logged so far
// (campaign.LoggedStalls): a replica stalled that long delivered that
// late.
func (f *faultFleet) ReplicaStalls() time.Duration {
	var outs []string
	for _, p := range f.Procs {
		outs = append(outs, p.out.String())
	}
	return campaign.LoggedStalls(outs...).Max()
}

// Name returns the fleet's bucket and queue name.
func (f *faultFleet) Name() string { return f.name }

// Config writes the config of one replica at rate and returns its path.
func (f *faultFleet) Config(spec faultFleetSpec, rate float64) string {
	f.t.Helper()
	prefetch := spec.Prefetch
	if prefetch == 0 {
		prefetch = 10
	}
	onErr := spec.LimitExtra
	if spec.OnStoreError != "" {
		onErr += "  on_store_error: " + spec.OnStoreError + "\n"
	}
	yaml := fmt.Sprintf(`redis:
%slimit:
  bucket: %s
  rate: %v
  burst: %d
%ssource:
  rabbitmq:
    url: ${FAULT_AMQP_URL}
    queue: %s
    prefetch: %d
    declare: true
sink:
  http:
    url: %s
    timeout: 5s
delivery:
  drain_timeout: 10s
metrics:
  listen: %q
log:
  level: info
  format: json
%s`, spec.Redis, f.name, rate, spec.Burst, onErr, f.name, prefetch, f.sinkURL(spec), f.metricsListen(spec), spec.Extra)
	path := filepath.Join(f.t.TempDir(), "throttle.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return path
}

// Start starts one more replica at rate without waiting for it.
func (f *faultFleet) Start(spec faultFleetSpec, rate float64) *faultFleetProc {
	f.t.Helper()
	path := f.Config(spec, rate)
	cmd := exec.Command(f.bin, "run", "--config", path)
	cmd.Env = append(append(os.Environ(), "FAULT_AMQP_URL="+f.amqpURL), spec.Env...)
	p := &faultFleetProc{faultProc: faultStartCmd(f.t, fmt.Sprintf("replica %d (%v/s)", len(f.Procs)+1, rate), cmd), Config: path}
	f.Procs = append(f.Procs, p)
	return p
}

// WaitConsumers waits until RabbitMQ counts n consumers on the queue.
func (f *faultFleet) WaitConsumers(n int) {
	f.t.Helper()
	testenv.Eventually(f.t, 30*time.Second, fmt.Sprintf("%d consumers on the queue", n), func() bool {
		for _, p := range f.Procs {
			if p.Exited() {
				f.t.Fatalf("%s exited early:\n%s", p.name, faultTail(p.out.String(), 40))
			}
		}
		return cliQueueState(f.conn, f.name).Consumers == n
	})
}

// Publish publishes n messages {"id": from..from+n-1}.
func (f *faultFleet) Publish(from, n int) {
	f.t.Helper()
	ctx := testenv.Context(f.t, 30*time.Second)
	for i := from; i < from+n; i++ {
		err := f.ch.PublishWithContext(ctx, "", f.name, true, false, amqp.Publishing{
			ContentType: "application/json",
			MessageId:   strconv.Itoa(i),
			Body:        []byte(fmt.Sprintf(`{"id":%d}`, i)),
		})
		if err != nil {
			f.t.Fatalf("publishing: %v", err)
		}
	}
}

// Admin runs `throttle bucket ARGS... NAME --config C` with the first
// replica's config and returns its exit code, stdout and stderr.
func (f *faultFleet) Admin(args ...string) (int, string, string) {
	f.t.Helper()
	args = append(append([]string{"bucket"}, args...), f.name, "--config", f.Procs[0].Config)
	return faultExec(f.t, []string{"FAULT_AMQP_URL=" + f.amqpURL}, f.bin, args...)
}

// Stop sends SIGTERM to every replica still running and fails the test
// unless each exits 0 within 20 s.
func (f *faultFleet) Stop() {
	f.t.Helper()
	for _, p := range f.Procs {
		if p.Exited() {
			continue
		}
		if code := p.Stop(syscall.SIGTERM, 20*time.Second); code != 0 {
			f.t.Errorf("%s exited with %d after SIGTERM, want 0", p.name, code)
		}
	}
}

// MetricsAddr returns the address the replica's metrics server listens on,
// from its "serving metrics" log line, waiting for it up to 20 s.
func (p *faultFleetProc) MetricsAddr(t *testing.T) string {
	t.Helper()
	var addr string
	testenv.Eventually(t, 20*time.Second, p.name+" logging its metrics address", func() bool {
		for _, rec := range faultLogRecords(p.out.String()) {
			if rec["msg"] == "serving metrics" {
				addr, _ = rec["addr"].(string)
				return addr != ""
			}
		}
		return false
	})
	return addr
}

// faultLogRecords parses the JSON log lines of out, skipping other lines.
func faultLogRecords(out string) []map[string]any {
	var recs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var rec map[string]any
		if json.Unmarshal(line, &rec) == nil {
			recs = append(recs, rec)
		}
	}
	return recs
}

// faultExec runs the binary to completion, within 20 s, with env added to
// the environment, and returns its exit code and output.
func faultExec(t *testing.T, env []string, bin string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stdout, stderr testenv.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("throttle %v did not finish within 20 s", args)
	}
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("throttle %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// faultTail returns the last n lines of s.
func faultTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// faultWindow is the busiest window of a series of arrivals.
type faultWindow struct {
	N  int       // arrivals in [At, At+width)
	At time.Time // the first of them
}

// faultWorstWindow returns the window of the given width, starting at an
// arrival in [from, to), that holds the most arrivals of ts (sorted) in
// [from, to).
func faultWorstWindow(ts []time.Time, from, to time.Time, width time.Duration) faultWindow {
	var worst faultWindow
	j := 0
	for i, t := range ts {
		if t.Before(from) || !t.Before(to) {
			continue
		}
		if j < i {
			j = i
		}
		end := t.Add(width)
		if end.After(to) {
			end = to
		}
		for j < len(ts) && ts[j].Before(end) {
			j++
		}
		if n := j - i; n > worst.N {
			worst = faultWindow{N: n, At: t}
		}
	}
	return worst
}

// faultLongestGap returns the longest time in [from, to) without an
// arrival, counting from from and up to to.
func faultLongestGap(ts []time.Time, from, to time.Time) (gap time.Duration, at time.Time) {
	prev := from
	for _, t := range ts {
		if t.Before(from) {
			continue
		}
		if !t.Before(to) {
			break
		}
		if d := t.Sub(prev); d > gap {
			gap, at = d, prev
		}
		prev = t
	}
	if d := to.Sub(prev); d > gap {
		gap, at = d, prev
	}
	return gap, at
}

// faultPerSecond returns the arrivals in each whole second from from, for
// logs.
func faultPerSecond(ts []time.Time, from, to time.Time) []int {
	out := make([]int, int(to.Sub(from)/time.Second))
	for _, t := range ts {
		if d := t.Sub(from); d >= 0 && int(d/time.Second) < len(out) {
			out[d/time.Second]++
		}
	}
	return out
}

// faultCount returns the arrivals of ts in [from, to).
func faultCount(ts []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range ts {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

// TestFaultHangupDrains sends SIGHUP to a replica while it delivers a
// message to a slow sink: the replica must drain as on SIGTERM, finishing
// and acking the message, and exit 0. SIGHUP once killed it
// with status 129, and the message went back to the queue.
func TestFaultHangupDrains(t *testing.T) {
	t.Parallel()
	f := faultNewFleet(t)
	entered := make(chan struct{}, 10)
	var finished atomic.Int64
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		entered <- struct{}{}
		time.Sleep(time.Second)
		finished.Add(1)
	}))
	t.Cleanup(slow.Close)
	srv := faultStartRedis(t)
	p := f.Start(faultFleetSpec{Redis: "  addr: " + srv.Addr() + "\n", Burst: 5, Prefetch: 1, SinkURL: slow.URL}, 50)
	f.WaitConsumers(1)
	f.Publish(0, 3)
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("no message reached the sink")
	}
	if code := p.Stop(syscall.SIGHUP, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGHUP, want 0 (drained)", code)
	}
	if !strings.Contains(p.out.String(), "shutting down") {
		t.Errorf("no \"shutting down\" in the log after SIGHUP:\n%s", p.out.String())
	}
	if n := finished.Load(); n != 1 {
		t.Errorf("%d deliveries finished, want the 1 in flight at SIGHUP", n)
	}
	// The message in flight was acked; the other two wait in the queue.
	testenv.Eventually(t, 10*time.Second, "2 messages left in the queue", func() bool {
		return cliQueueState(f.conn, f.name).Messages == 2
	})
}
