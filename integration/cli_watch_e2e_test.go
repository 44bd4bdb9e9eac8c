package integration

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestCLIWatch runs 'bucket watch' from the built binary against live
// replicas.
func TestCLIWatch(t *testing.T) {
	redisAddr := testenv.RedisAddr(t)
	amqpURL := testenv.AMQPURL(t)
	bin := cliBuild(t)
	t.Run("the delivered rate is what the sinks count", func(t *testing.T) {
		cliTestWatchDelivered(t, bin, redisAddr, amqpURL)
	})
	t.Run("a signal ends it quietly", func(t *testing.T) {
		cliTestWatchSignal(t, bin, redisAddr)
	})
}

// cliTestWatchDelivered runs two replicas, each with its own sink, fed 10
// messages a second under a limit of 50/s, so that the bucket stays about
// full (where an estimate from its tokens sees nothing), and checks every
// frame of 'bucket watch' on a terminal: each delivered rate it shows, in
// total and per replica, is within 10% of what the sinks counted over the
// last 5 s, and is the replicas' report, not an estimate.
func cliTestWatchDelivered(t *testing.T, bin, redisAddr, amqpURL string) {
	const (
		replicas = 2
		publish  = 10.0 // messages a second
		window   = 5 * time.Second
		bound    = 0.10
	)
	name := cliName(t)
	conn, ch := cliQueue(t, amqpURL, name)
	dir := t.TempDir()
	sinks := make([]*cliSink, replicas)
	ids := make([]string, replicas) // the replica ids start with host-pid-
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for i := range replicas {
		sinks[i] = cliNewSink(t)
		cfgPath := filepath.Join(dir, fmt.Sprintf("replica-%d.yaml", i+1))
		cfg := fmt.Sprintf(`
redis: {addr: %q, timeout: 2s}
limit: {bucket: %s, rate: 50, burst: 50}
source:
  rabbitmq: {url: %q, queue: %s, prefetch: 5, declare: true}
sink:
  http: {url: %q, timeout: 5s}
delivery: {drain_timeout: 2s}
metrics: {listen: "off"}
`, redisAddr, name, amqpURL, name, sinks[i].srv.URL+"/send")
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		p := cliStart(t, bin, "run", "--config", cfgPath)
		ids[i] = host + "-" + strconv.Itoa(p.cmd.Process.Pid) + "-"
	}
	t.Cleanup(func() { cliRun(t, bin, "bucket", "reset", name, "--redis", redisAddr) })
	cliWait(t, 20*time.Second, "two consumers on the queue", func() bool { return cliQueueState(conn, name).Consumers == replicas })

	// The publisher runs until the test ends.
	stop, published := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(published)
		tick := time.NewTicker(time.Duration(float64(time.Second) / publish))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			err := ch.Publish("", name, false, false, amqp.Publishing{ContentType: "application/json", Body: []byte(fmt.Sprintf(`{"id":%d}`, i))})
			if err != nil {
				t.Errorf("publishing: %v", err)
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-published })
	start := time.Now()
	cliWait(t, 20*time.Second, "messages at both sinks", func() bool {
		a, _ := sinks[0].counts()
		b, _ := sinks[1].counts()
		return a > 0 && b > 0
	})
	// The sinks' rates are measured over window: wait until they have run
	// that long.
	cliWait(t, 2*window, "a window of deliveries", func() bool { return time.Since(start) > window+time.Second })

	cmd := exec.Command(bin, "bucket", "watch", name, "--redis", redisAddr, "--interval", "500ms")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 160})
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-watchDone
		ptmx.Close()
	})

	// sinkRate is what sink s counted over the last window; -1 for both.
	sinkRate := func(s int) float64 {
		n := 0
		from := time.Now().Add(-window)
		for _, i := range []int{0, 1} {
			if s >= 0 && i != s {
				continue
			}
			for _, at := range sinks[i].times() {
				if at.After(from) {
					n++
				}
			}
		}
		return float64(n) / window.Seconds()
	}
	total := regexp.MustCompile(`delivered   (\S+)(.*)`)
	row := func(id string) *regexp.Regexp {
		return regexp.MustCompile(regexp.QuoteMeta(id) + `\d+\s+\S+\s+(\S+)`)
	}
	rows := []*regexp.Regexp{row(ids[0]), row(ids[1])}
	var (
		buf        bytes.Buffer
		frames     int // frames with every rate known
		checked    []string
		watchStart = time.Now()
		firstKnown time.Duration
	)
	deadline := time.Now().Add(20 * time.Second)
	chunk := make([]byte, 4096)
	for frames < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("%d frames with every delivered rate known within 20 s, want 10; last output:\n%s", frames, lastFrame(buf.String()))
		}
		_ = ptmx.SetReadDeadline(time.Now().Add(time.Second))
		n, err := ptmx.Read(chunk)
		buf.Write(chunk[:n])
		if err != nil && !os.IsTimeout(err) {
			t.Fatalf("reading the terminal: %v", err)
		}
		// Every complete frame read so far, then keep the last, partial one.
		parts := strings.Split(buf.String(), "\x1b[H")
		if len(parts) < 2 {
			continue
		}
		for _, f := range parts[1 : len(parts)-1] {
			f = strings.ReplaceAll(strings.ReplaceAll(f, "\x1b[K", ""), "\x1b[J", "")
			m := total.FindStringSubmatch(f)
			if m == nil {
				continue
			}
			if strings.Contains(m[2], "estimated") {
				t.Errorf("the delivered rate is estimated while the replicas report theirs:\n%s", f)
			}
			known := 0
			check := func(what, shown string, want float64) {
				if shown == "?" {
					return
				}
				known++
				got, err := strconv.ParseFloat(strings.TrimSuffix(shown, "/s"), 64)
				if err != nil {
					t.Errorf("%s: %q is not a rate:\n%s", what, shown, f)
					return
				}
				checked = append(checked, fmt.Sprintf("%s %v (sink %.1f)", what, got, want))
				if math.Abs(got-want) > bound*want {
					t.Errorf("%s shows %v/s, the sink counted %.2f/s over the last %v: not within %.0f%%:\n%s", what, got, want, window, 100*bound, f)
				}
			}
			check("delivered", m[1], sinkRate(-1))
			for i, re := range rows {
				r := re.FindStringSubmatch(f)
				if r == nil {
					t.Fatalf("no row for replica %s in:\n%s", ids[i], f)
				}
				check("replica "+strconv.Itoa(i+1), r[1], sinkRate(i))
			}
			if known == 1+replicas {
				if frames == 0 {
					firstKnown = time.Since(watchStart)
				}
				frames++
			}
		}
		buf.Reset()
		buf.WriteString("\x1b[H" + parts[len(parts)-1])
	}
	t.Logf("every rate known %v after watch started; rates shown and counted: %s", firstKnown.Round(time.Millisecond), strings.Join(checked, "; "))
}

// lastFrame returns the last frame drawn in a terminal's output.
func lastFrame(out string) string {
	parts := strings.Split(out, "\x1b[H")
	return parts[len(parts)-1]
}

// cliTestWatchSignal stops 'bucket watch' the way timeout(1) does, with
// the signal sent twice at once (to the process, then to its group), and
// checks that it exits 0 and says nothing: it has nothing to drain.
func cliTestWatchSignal(t *testing.T, bin, redisAddr string) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		var stdout, stderr testenv.Buffer
		cmd := exec.Command(bin, "bucket", "watch", cliName(t), "--redis", redisAddr, "--interval", "100ms")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// A line is out once the signals are handled.
		cliWait(t, 10*time.Second, "a first line from bucket watch", func() bool { return strings.Contains(stdout.String(), "\n") })
		for range 2 {
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("bucket watch did not exit within 10 s of %v", sig)
		}
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("bucket watch exited with %d after %v twice, want 0", code, sig)
		}
		if s := stderr.String(); s != "" {
			t.Errorf("bucket watch wrote to stderr after %v twice: %q", sig, s)
		}
	}
}
