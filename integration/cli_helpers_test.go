package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/testenv"
)

// cliVersion is the version stamped into the binary that cliBuild builds.
const cliVersion = "v0.0.0-e2e"

// cliBuilt is the binary that cliBuild built once for the whole test
// binary, in cliBuildDir, which TestMain removes.
var (
	cliBuildOnce sync.Once
	cliBuildDir  string
	cliBuilt     string
	cliBuildErr  error
)

// minParallel is the least -test.parallel the package runs with when the
// command line does not set it (go test's default is GOMAXPROCS). The
// tests here spend their time waiting on servers, brokers and timers, not
// on the CPU: run 2 at a time on 2 cores, the package and the processes it
// started used a sixth of one core (70 s of CPU in 480 s).
const minParallel = 8

// TestMain runs the parallel tests up to minParallel at a time, unless
// -test.parallel (go test -parallel) is given, and removes the binary that
// cliBuild built once every test ran. A test that holds a rate or a
// latency to a fixed bound (TestCLIEndToEnd, TestPriorityOTPMarketingE2E,
// TestKafkaKeyOrderingThroughput) does not call t.Parallel, so it runs
// before the parallel ones and without them; the fleet fault tests run in
// parallel and widen their bounds by the stalls they measure
// (testenv.MeasureStalls), and only by those.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if p := runtime.GOMAXPROCS(0); !given && p < minParallel {
		if err := flag.Set("test.parallel", strconv.Itoa(minParallel)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	code := m.Run()
	if cliBuildDir != "" {
		os.RemoveAll(cliBuildDir)
	}
	os.Exit(code)
}

// cliBuild builds the throttle binary, stamping cliVersion the way releases
// do, once for every test of the package, and returns its path.
func cliBuild(t *testing.T) string {
	t.Helper()
	cliBuildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			cliBuildErr = err
			return
		}
		if cliBuildDir, cliBuildErr = os.MkdirTemp("", "throttle-e2e-"); cliBuildErr != nil {
			return
		}
		bin := filepath.Join(cliBuildDir, "throttle")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin,
			"-ldflags", "-s -w -X github.com/throttlehq/throttle/internal/cli.version="+cliVersion,
			"./cmd/throttle")
		cmd.Dir = ".." // the module root
		if out, err := cmd.CombinedOutput(); err != nil {
			cliBuildErr = fmt.Errorf("go build ./cmd/throttle: %v\n%s", err, out)
			return
		}
		cliBuilt = bin
	})
	if cliBuildErr != nil {
		if errors.Is(cliBuildErr, exec.ErrNotFound) {
			testenv.Missing(t, "the go command", "put the Go toolchain on PATH", cliBuildErr)
		}
		t.Fatal(cliBuildErr)
	}
	return cliBuilt
}

// cliName returns a bucket or queue name unique to this test run.
func cliName(t testing.TB) string { return testenv.Name(t, "cli") }

// cliMetricsListen is the metrics.listen of a replica under test: the
// system picks the port, and cliServingAddr reads it from the log.
const cliMetricsListen = "127.0.0.1:0"

// cliServingAddr waits up to 20 s for the replica's "serving metrics" log
// line, in the text or the JSON format, and returns the address in it.
func cliServingAddr(t *testing.T, p *cliProcess) string {
	t.Helper()
	text := regexp.MustCompile(`msg="serving metrics" addr=(\S+)`)
	jsonRe := regexp.MustCompile(`"msg":"serving metrics","addr":"([^"]+)"`)
	var addr string
	cliWait(t, 20*time.Second, "the \"serving metrics\" log line", func() bool {
		out := p.stderr.String()
		for _, re := range []*regexp.Regexp{text, jsonRe} {
			if m := re.FindStringSubmatch(out); m != nil {
				addr = m[1]
				return true
			}
		}
		return false
	})
	return addr
}

// cliFreeAddr returns a loopback address that was free a moment ago. Prefer
// cliMetricsListen: another process may take the port before the replica
// binds it.
func cliFreeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// cliProcess is a running throttle process.
type cliProcess struct {
	cmd    *exec.Cmd
	stderr *testenv.Buffer
	done   chan struct{}
	err    error // Wait's result, once done is closed
}

// cliStart starts the binary with args. The process is killed when the
// test ends, if it still runs; its stderr is logged when the test failed.
func cliStart(t *testing.T, bin string, args ...string) *cliProcess {
	t.Helper()
	return cliStartEnv(t, bin, nil, args...)
}

// cliStartEnv is cliStart with env (NAME=value) added to this process's
// environment.
func cliStartEnv(t *testing.T, bin string, env []string, args ...string) *cliProcess {
	t.Helper()
	p := &cliProcess{cmd: exec.Command(bin, args...), stderr: &testenv.Buffer{}, done: make(chan struct{})}
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout = io.Discard
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("stderr of %v:\n%s", args, p.stderr.String())
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit code, failing the test when the
// process does not exit within d.
func (p *cliProcess) stop(t *testing.T, d time.Duration) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("the process did not exit within %v of SIGTERM", d)
	}
	return p.cmd.ProcessState.ExitCode()
}

// cliRun runs the binary to completion and returns its stdout, failing the
// test on a non-zero exit.
func cliRun(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("throttle %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

// cliGet returns the status and body of a GET, or status 0 when the server
// does not answer.
func cliGet(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// cliWait is testenv.Eventually, for the tests that call it by this name.
func cliWait(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, d, what, cond)
}

// cliArrival is one request the sink received.
type cliArrival struct {
	id int
	at time.Time
}

// cliSink is an HTTP sink that records when each message arrived. It is
// safe for concurrent use.
type cliSink struct {
	srv *httptest.Server

	mu       sync.Mutex
	arrivals []cliArrival
	seen     map[int]int
}

func cliNewSink(t *testing.T) *cliSink {
	s := &cliSink{seen: map[int]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			ID int `json:"id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		now := time.Now()
		s.mu.Lock()
		s.arrivals = append(s.arrivals, cliArrival{id: body.ID, at: now})
		s.seen[body.ID]++
		s.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// counts returns the requests and the distinct messages received so far.
func (s *cliSink) counts() (requests, unique int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.arrivals), len(s.seen)
}

// times returns the arrival times in order.
func (s *cliSink) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := make([]time.Time, len(s.arrivals))
	for i, a := range s.arrivals {
		ts[i] = a.at
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts
}

// cliRate returns the rate at which a bucket of the given burst granted the
// arrivals ts: a full bucket hands out burst at once, then rate per second,
// so n arrivals over the span give (n - burst) / span. Pass burst 0 for a
// window that starts with an empty bucket.
func cliRate(ts []time.Time, burst int) float64 {
	if len(ts) < 2 {
		return 0
	}
	n := len(ts) - 1 // intervals, when the bucket starts empty
	if burst > 0 {
		n = len(ts) - burst
	}
	return float64(n) / ts[len(ts)-1].Sub(ts[0]).Seconds()
}

// cliMetric sums the samples of a metric in a Prometheus text exposition.
func cliMetric(body, name string) float64 {
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := strings.TrimPrefix(line, name)
		if rest != "" && rest[0] != '{' && rest[0] != ' ' {
			continue // a longer name
		}
		var v float64
		if _, err := fmt.Sscan(rest[strings.LastIndexByte(rest, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}

// cliQueue connects to RabbitMQ for a test that uses the queue name, and
// deletes the queue and its dead-letter exchange and queue when the test
// ends.
func cliQueue(t *testing.T, amqpURL, name string) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatalf("connecting to rabbitmq: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_, _ = ch.QueueDelete(name+".dlq", false, false, false)
		_ = ch.ExchangeDelete(name+".dlx", false, false)
		for _, dq := range rabbitmq.DelayQueues(name, math.MaxInt64) {
			_, _ = ch.QueueDelete(dq, false, false, false)
			_ = ch.ExchangeDelete(dq, false, false)
		}
	})
	return conn, ch
}

// cliQueueState returns the queue's message and consumer counts, or zeros
// when the queue does not exist yet.
func cliQueueState(conn *amqp.Connection, name string) amqp.Queue {
	ch, err := conn.Channel()
	if err != nil {
		return amqp.Queue{}
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return amqp.Queue{}
	}
	return q
}

// cliRabbitFleet starts replicas of bin in the end-to-end tests' usual
// deployment: Redis at the test's address with a 2 s timeout (a loaded
// machine answers slower than the 250 ms default, which would send a
// replica to its fallback), limit.bucket name followed by limitYAML (lines
// under limit:, indented two spaces), the RabbitMQ queue name with
// sourceYAML (settings besides url and queue, indented four spaces), the
// HTTP sink at sinkURL, metrics on a free port. It resets the bucket when
// the test ends, waits for the replicas' consumers on conn, and returns the
// config's path and each replica's metrics address.
func cliRabbitFleet(t *testing.T, bin string, conn *amqp.Connection, name string, replicas int, limitYAML, sourceYAML, sinkURL string) (cfgPath string, metrics []string) {
	t.Helper()
	cfgPath = filepath.Join(t.TempDir(), "throttle.yaml")
	cfg := fmt.Sprintf(`
redis:
  addr: %q
  timeout: 2s
limit:
  bucket: %s
%s
source:
  rabbitmq:
    url: %q
    queue: %s
%s
    declare: true
sink:
  http:
    url: %q
    timeout: 5s
delivery:
  drain_timeout: 10s
metrics:
  listen: %q
`, testenv.RedisAddr(t), name, strings.TrimRight(limitYAML, "\n"), testenv.AMQPURL(t), name, strings.TrimRight(sourceYAML, "\n"), sinkURL, cliMetricsListen)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for range replicas {
		p := cliStart(t, bin, "run", "--config", cfgPath)
		t.Cleanup(func() { p.stop(t, 15*time.Second) })
		metrics = append(metrics, cliServingAddr(t, p))
	}
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", "--config", cfgPath) })
	cliWait(t, 20*time.Second, fmt.Sprintf("%d consumers on the queue", replicas), func() bool {
		return cliQueueState(conn, name).Consumers == replicas
	})
	return cfgPath, metrics
}
