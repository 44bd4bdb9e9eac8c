package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

func TestSparkline(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		vals []float64
		want string
	}{
		{[]float64{nan, nan}, "  "},
		{[]float64{0, 0, nan}, "▁▁ "},
		{[]float64{nan, 0, 4, 8}, " ▁▄█"},
		{[]float64{10, 5, 0}, "█▄▁"},
	} {
		if got := sparkline(tc.vals); got != tc.want {
			t.Errorf("sparkline(%v) = %q, want %q", tc.vals, got, tc.want)
		}
	}
}

func TestDownsample(t *testing.T) {
	nan := math.NaN()
	// Groups of 3 ending at the newest value: [NaN 1 2] [3 4 5] [NaN NaN 9].
	vals := []float64{nan, 1, 2, 3, 4, 5, nan, nan, 9}
	if got := downsample(vals, 3); len(got) != 3 || got[0] != 1.5 || got[1] != 4 || got[2] != 9 {
		t.Errorf("downsample(%v, 3) = %v, want [1.5 4 9]", vals, got)
	}
	// Groups of 3 from the newest: [2 4 6], then the partial [NaN NaN].
	if got := downsample([]float64{nan, nan, 2, 4, 6}, 2); len(got) != 2 || !math.IsNaN(got[0]) || got[1] != 4 {
		t.Errorf("downsample into 2 = %v, want [NaN 4]", got)
	}
	if got := downsample([]float64{1, 2}, 60); len(got) != 2 {
		t.Errorf("fewer values than cells: %v, want them as they are", got)
	}
}

// TestWatchHistorySteps feeds samples at fixed instants and checks what
// each frame shows.
func TestWatchHistorySteps(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	conf := &limitsJSON{Rate: 50, Burst: 50}
	st := func(tokens, rate float64, paused time.Duration, o *redislimiter.OverrideStatus) redislimiter.BucketStatus {
		return redislimiter.BucketStatus{Bucket: "sms", Rate: rate, Burst: 50, TokensKnown: true, Tokens: tokens, PausedFor: paused, Override: o}
	}
	reps := []redislimiter.Replica{{ID: "r1", Rate: 50, Burst: 50}, {ID: "r2"}}
	h := newWatchHistory("sms", time.Second)
	h.layersKnown = true // from a config file
	steps := []struct {
		at   time.Duration
		s    redislimiter.BucketStatus
		err  error
		want []string // in the full-screen view
		line string   // the one-line view
	}{
		{0, st(40, 50, 0, nil), nil,
			[]string{"tokens      40 of 50", "rate        50/s (configured)", "override    none", "delivered   ?", "paused      no", "2 alive", "r1", "not reported", "layers      none"},
			"2026-12-01T03:00:00Z sms tokens=40/50 rate=50/s(configured) paused=0s replicas=2 delivered=? waiting=?"},
		// 40 + 50·1 − 30 = 60 tokens granted in the second.
		{time.Second, st(30, 50, 0, nil), nil,
			[]string{"delivered   60/s (estimated from the bucket's tokens: the replicas report no counts", "last 1m0s, 60/s–60/s",
				"layers      1 (limit.extra of throttle.yaml)", "    per-recipient  1/s, burst 3, per key, on_exceed delay  12 keys in use  ?         ?"},
			"2026-12-01T03:00:01Z sms tokens=30/50 rate=50/s(configured) paused=0s replicas=2 delivered=60/s(estimated) waiting=? exceeded=per-recipient:?"},
		// An override to 80/s: the rate changed, so no estimate.
		{3 * time.Second, st(50, 80, 0, &redislimiter.OverrideStatus{Rate: 80, ExpiresIn: 90 * time.Second}), nil,
			[]string{"rate        80/s (override)", "override    80/s, each replica's burst, expires in 1m30s", "delivered   ?"},
			"2026-12-01T03:00:03Z sms tokens=50/50 rate=80/s(override) paused=0s replicas=2 delivered=? waiting=?"},
		{4 * time.Second, st(50, 80, 2*time.Second, &redislimiter.OverrideStatus{Rate: 80}), nil,
			[]string{"rate        0/s while paused, then 80/s (override)", "paused      for 2s more", "override    80/s, each replica's burst, until cleared"},
			"2026-12-01T03:00:04Z sms tokens=50/50 rate=80/s(override) paused=2s replicas=2 delivered=? waiting=?"},
		{5 * time.Second, redislimiter.BucketStatus{}, errors.New("dial tcp: connection refused"),
			[]string{"! reading Redis failed: dial tcp: connection refused", "rate        0/s while paused"},
			`2026-12-01T03:00:05Z sms tokens=50/50 rate=80/s(override) paused=2s replicas=2 delivered=? waiting=? error="dial tcp: connection refused"`},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		var layers []layerView
		if i == 1 {
			layers = []layerView{{name: "per-recipient", desc: "1/s, burst 3, per key, on_exceed delay", state: "12 keys in use"}}
		}
		v := h.add(sample{at: now, status: s.s, replicas: reps, configured: conf, from: "throttle.yaml", layers: layers}, s.err, now)
		screen := renderWatch(v)
		for _, w := range s.want {
			if !strings.Contains(screen, w) {
				t.Errorf("step %d: screen lacks %q:\n%s", i, w, screen)
			}
		}
		if got := watchLine(v); got != s.line {
			t.Errorf("step %d: line\n got %s\nwant %s", i, got, s.line)
		}
	}
	// The first six cells of the sparkline are the oldest: blanks.
	if got := h.spark[len(h.spark)-5:]; !math.IsNaN(got[0]) || got[1] != 60 || !math.IsNaN(got[2]) {
		t.Errorf("sparkline values %v: want NaN, 60, NaN, ...", got)
	}
}

func TestWatchUsage(t *testing.T) {
	for _, args := range [][]string{
		{"bucket", "watch"},
		{"bucket", "watch", "--redis", "127.0.0.1:6379"},
		{"bucket", "watch", "a", "b", "--redis", "127.0.0.1:6379"},
		{"bucket", "watch", "a", "--redis", "127.0.0.1:6379", "--config", "x.yaml"},
		{"bucket", "watch", "a", "--redis", "127.0.0.1:6379", "--interval", "1ms"},
	} {
		if code, _, stderr := runCLI(t, args...); code != ExitUsage {
			t.Errorf("%q: exit %d, want %d; stderr %s", args, code, ExitUsage, stderr)
		}
	}
	if code, stdout, _ := runCLI(t, "bucket", "watch", "--help"); code != ExitOK || !strings.Contains(stdout, "throttle bucket watch") {
		t.Errorf("--help: exit %d, output %q", code, stdout)
	}
}

// runningBucket starts a replica of bucket name at rate/s that takes
// tokens as fast as it may until the test ends, and waits until its
// heartbeat is in Redis.
func runningBucket(t *testing.T, addr, name string, rate float64, burst int) {
	t.Helper()
	_, store := redisStore(t, addr, name, rate, burst)
	b, err := limiter.New(store, limiter.Options{ReplicaID: "watched-replica"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			_ = b.Wait(ctx, 1)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		b.Close()
		runCLI(t, "bucket", "reset", "--redis", addr, name)
	})
	wctx := testenv.Context(t, 10*time.Second)
	for {
		reps, err := store.Admin().Replicas(wctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(reps) > 0 {
			return
		}
		select {
		case <-wctx.Done():
			t.Fatal("the replica never sent a heartbeat")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestWatchNotTerminal checks the one-line form on a standard output that
// is not a terminal.
func TestWatchNotTerminal(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "watch")
	runningBucket(t, addr, name, 50, 50)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"bucket", "watch", name, "--redis", addr, "--interval", "100ms"}, &out, io.Discard)
	}()
	deadline := time.After(10 * time.Second)
	for strings.Count(out.String(), "\n") < 3 {
		select {
		case <-deadline:
			t.Fatalf("3 lines expected within 10s, got %q", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if code := <-done; code != ExitOK {
		t.Errorf("exit %d after cancel, want 0", code)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for _, l := range lines {
		if strings.Contains(l, "\x1b") || !strings.Contains(l, " "+name+" tokens=") || !strings.Contains(l, "rate=50/s(configured) ") || !strings.Contains(l, " replicas=1 ") {
			t.Errorf("line %q: want plain text with the bucket, its tokens, rate 50/s (configured) and 1 replica", l)
		}
	}
	if !strings.Contains(lines[len(lines)-1], "delivered=") || strings.HasSuffix(lines[len(lines)-1], "delivered=?") {
		t.Errorf("last line %q: want a delivered rate", lines[len(lines)-1])
	}
}

// screen collects what a program writes to a pseudo-terminal.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// frame returns the last complete frame: the text between the last two
// cursor-home sequences.
func (s *screen) frame() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	frames := strings.Split(s.buf.String(), "\x1b[H")
	if len(frames) < 3 {
		return ""
	}
	return strings.ReplaceAll(strings.ReplaceAll(frames[len(frames)-2], "\x1b[K", ""), "\x1b[J", "")
}

// waitFrame waits until a frame holds every string of want.
func (s *screen) waitFrame(t *testing.T, d time.Duration, want ...string) string {
	t.Helper()
	return s.waitFrameFunc(t, d, fmt.Sprintf("%q", want), func(f string) bool {
		for _, w := range want {
			if !strings.Contains(f, w) {
				return false
			}
		}
		return true
	})
}

// waitFrameFunc waits until a frame satisfies ok, described by what.
func (s *screen) waitFrameFunc(t *testing.T, d time.Duration, what string, ok func(string) bool) string {
	t.Helper()
	deadline := time.After(d)
	for {
		f := s.frame()
		if f != "" && ok(f) {
			return f
		}
		select {
		case <-deadline:
			t.Fatalf("no frame with %s within %v; last frame:\n%s", what, d, f)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// watchOnTerminal runs the CLI with args on a pseudo-terminal of 40×120
// and returns its screen, and stop, which cancels it, checks that it exits
// with 0 and shows the cursor again, and returns the whole output.
func watchOnTerminal(t *testing.T, args ...string) (scr *screen, stop func() string) {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	t.Cleanup(func() { tty.Close() })
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	scr = &screen{}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			scr.mu.Lock()
			scr.buf.Write(buf[:n])
			scr.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan int, 1)
	go func() { done <- Run(ctx, args, tty, os.Stderr) }()
	return scr, func() string {
		t.Helper()
		cancel()
		if code := <-done; code != ExitOK {
			t.Errorf("exit %d after cancel, want 0", code)
		}
		tty.Close()
		<-readDone
		scr.mu.Lock()
		defer scr.mu.Unlock()
		out := scr.buf.String()
		if !strings.Contains(out, "\x1b[?25h") {
			t.Error("the cursor was not shown again at exit")
		}
		return out
	}
}

// TestWatchTerminal runs bucket watch on a pseudo-terminal against a
// running bucket and checks that the screen shows the rate change made by
// bucket set.
func TestWatchTerminal(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "watch")
	runningBucket(t, addr, name, 50, 50)
	scr, stop := watchOnTerminal(t, "bucket", "watch", name, "--redis", addr, "--interval", "200ms")

	// The replica's heartbeat reports its mode.
	f := scr.waitFrame(t, 10*time.Second, "rate        50/s (configured)", "override    none", "1 alive", "watched-replica  shared", "50/s burst 50")
	if !strings.Contains(f, "throttle bucket watch: "+name) {
		t.Errorf("frame lacks the title:\n%s", f)
	}
	if code, _, stderr := runCLI(t, "bucket", "set", name, "--redis", addr, "--rate", "80", "--for", "1m"); code != ExitOK {
		t.Fatalf("bucket set: exit %d: %s", code, stderr)
	}
	scr.waitFrame(t, 10*time.Second, "rate        80/s (override)", "override    80/s, each replica's burst, expires in")
	// The replica takes 80 tokens a second now; the estimate from the
	// bucket follows within a few frames.
	f = scr.waitFrameFunc(t, 10*time.Second, "a delivered rate near 80/s", func(f string) bool {
		_, rest, ok := strings.Cut(f, "delivered   ")
		rate, _, ok2 := strings.Cut(rest, "/s")
		r, err := strconv.ParseFloat(rate, 64)
		return ok && ok2 && err == nil && r > 60 && r < 100
	})
	t.Logf("screen:\n%s", f)
	stop()
}

// TestWatchLayers reads the extra layers of a config file from Redis: an
// unkeyed layer's tokens and a keyed layer's keys in use.
func TestWatchLayers(t *testing.T) {
	path, name := writeLayersConfig(t, "watch", `    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 1/s
      burst: 3
    - name: whole-provider
      rate: 1/h # slow enough that no token comes back before the screen is read
      burst: 20`)
	client, ls := openLayers(t, path)
	ctx := testenv.Context(t, 10*time.Second)
	// Two recipients and the provider layer take tokens.
	for _, to := range []string{"+1555000001", "+1555000002"} {
		req := backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-recipient": to}}
		if _, err := ls.TakeLayers(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, l := range []struct{ layer, key string }{{"per-recipient", "+1555000001"}, {"per-recipient", "+1555000002"}, {"whole-provider", ""}} {
			_ = ls.ResetLayer(context.Background(), l.layer, l.key)
		}
		runCLI(t, "bucket", "reset", "--config", path)
	})
	w := &watcher{name: name, client: client, admin: client, interval: time.Second, layers: ls,
		configured: &limitsJSON{Rate: 100, Burst: 100}, from: path}
	s, err := w.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := newWatchHistory(name, time.Second)
	h.layersKnown = true
	screen := renderWatch(h.add(s, nil, time.Now()))
	for _, want := range []string{"layers      2 (limit.extra of " + path, "per-recipient", "2 keys in use", "whole-provider", "18 of 20 tokens"} {
		if !strings.Contains(screen, want) {
			t.Errorf("screen lacks %q:\n%s", want, screen)
		}
	}
}

// TestGrantTrackSteps follows a replica's reported count, read every
// second while its heartbeat updates it every 3 s.
func TestGrantTrackSteps(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	var g grantTrack
	for i, s := range []struct {
		at      int // seconds
		granted int64
		want    float64 // NaN: unknown
	}{
		{0, 1000, math.NaN()}, // may be old: not a change
		{1, 1000, math.NaN()},
		{2, 1150, math.NaN()}, // first change
		{3, 1150, math.NaN()},
		{5, 1300, 50},        // 150 in 3 s
		{8, 1450, 50},        // 300 in 6 s
		{11, 1750, 600. / 9}, // 600 in 9 s
		{20, 1750, 600. / 9}, // unchanged for 9 s: still the last rate
		{21, 1750, 0},        // unchanged for 10 s: idle
		{22, 100, 0},         // restarted: the old changes are gone
		{25, 250, math.NaN()},
		{28, 400, 50},
	} {
		g.observe(t0.Add(time.Duration(s.at)*time.Second), time.Time{}, s.granted)
		got := g.rate(t0.Add(time.Duration(s.at) * time.Second))
		if !(math.IsNaN(got) && math.IsNaN(s.want)) && math.Abs(got-s.want) > 1e-9 {
			t.Errorf("step %d (t=%ds, granted %d): rate %v, want %v", i, s.at, s.granted, got, s.want)
		}
	}
}

// TestWatchReportedReplicas checks the replica table and the delivered
// rate when the replicas report with their heartbeats.
func TestWatchReportedReplicas(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	h := newWatchHistory("sms", time.Second)
	st := redislimiter.BucketStatus{Bucket: "sms", Rate: 1e6, Burst: 1e6, TokensKnown: true, Tokens: 1e6}
	var v watchView
	for sec, g := range [][2]int64{{0, 0}, {100, 0}, {400, 300}, {700, 600}} {
		at := t0.Add(time.Duration(3*sec) * time.Second)
		reps := []redislimiter.Replica{
			{ID: "a", Rate: 1e6, Burst: 1e6, Reported: true, Mode: limiter.ModeShared, Granted: g[0], Waiting: 2},
			{ID: "b", Rate: 1e6, Burst: 1e6, Reported: true, Mode: limiter.ModeLocal, Granted: g[1], Waiting: 5},
		}
		v = h.add(sample{at: at, status: st, replicas: reps, configured: &limitsJSON{Rate: 1e6, Burst: 1e6}, from: "x.yaml"}, nil, at)
	}
	screen := renderWatch(v)
	// a: 600 in 6 s; b: 600 in 6 s, from its first change at 6 s.
	for _, want := range []string{"delivered   200/s (reported by the replicas)", "a   shared  100/s      2", "b   local   100/s      5"} {
		if !strings.Contains(screen, want) {
			t.Errorf("screen lacks %q:\n%s", want, screen)
		}
	}
	if line := watchLine(v); !strings.Contains(line, " delivered=200/s waiting=7") {
		t.Errorf("line %q: want delivered=200/s waiting=7", line)
	}
}

// TestWatchExceededSteps feeds samples whose replicas report their layers'
// refusals, at fixed instants, and checks the layer table and the line.
func TestWatchExceededSteps(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	st := redislimiter.BucketStatus{Bucket: "sms", Rate: 50, Burst: 50, TokensKnown: true, Tokens: 50}
	layers := []layerView{
		{name: "per-recipient", desc: "1/s, burst 3, per key, on_exceed dead_letter", state: "12 keys in use"},
		{name: "daily", desc: "quota 100 per day, UTC, on_exceed delay", state: "used 100 of 100 this day"},
	}
	rep := func(id string, exceeded map[string]int64) redislimiter.Replica {
		return redislimiter.Replica{ID: id, Rate: 50, Burst: 50, Reported: true, Mode: limiter.ModeShared, Exceeded: exceeded}
	}
	h := newWatchHistory("sms", time.Second)
	h.layersKnown = true
	for i, s := range []struct {
		at       time.Duration
		replicas []redislimiter.Replica
		rows     map[string][2]string // layer → EXCEEDED, LAST MINUTE
		line     string               // the end of the one-line view
	}{
		// Replicas that do not report: unknown.
		{0, []redislimiter.Replica{{ID: "a"}}, map[string][2]string{"per-recipient": {"?", "?"}, "daily": {"?", "?"}},
			" exceeded=per-recipient:?,daily:?"},
		// The first reports: counts since the replicas started, no
		// increase yet; a layer that refused none is 0.
		{time.Second, []redislimiter.Replica{rep("a", map[string]int64{"per-recipient": 4}), rep("b", map[string]int64{"per-recipient": 1})},
			map[string][2]string{"per-recipient": {"5", "+0"}, "daily": {"0", "+0"}}, " exceeded=per-recipient:5,daily:0"},
		{31 * time.Second, []redislimiter.Replica{rep("a", map[string]int64{"per-recipient": 10, "daily": 2}), rep("b", map[string]int64{"per-recipient": 1})},
			map[string][2]string{"per-recipient": {"11", "+6"}, "daily": {"2", "+2"}}, " exceeded=per-recipient:11,daily:2"},
		// A minute after the first report, the increase is taken from the
		// read at 31 s; b left, which lowers the sum, not below 0.
		{62 * time.Second, []redislimiter.Replica{rep("a", map[string]int64{"per-recipient": 10, "daily": 3})},
			map[string][2]string{"per-recipient": {"10", "+0"}, "daily": {"3", "+1"}}, " exceeded=per-recipient:10,daily:3"},
		// A layer the config does not have, reported by a replica of
		// another version of it, is listed after the known ones; it
		// refused none in the reads before (a report leaves out zeros).
		{63 * time.Second, []redislimiter.Replica{rep("a", map[string]int64{"per-recipient": 10, "daily": 3, "old-layer": 7})},
			map[string][2]string{"per-recipient": {"10", "+0"}, "daily": {"3", "+1"}, "old-layer": {"7", "+7"}}, " exceeded=per-recipient:10,daily:3,old-layer:7"},
	} {
		now := t0.Add(s.at)
		v := h.add(sample{at: now, status: st, replicas: s.replicas, configured: &limitsJSON{Rate: 50, Burst: 50}, from: "x.yaml", layers: layers}, nil, now)
		screen := renderWatch(v)
		if !strings.Contains(screen, "LAYER          LIMIT") || !strings.Contains(screen, "EXCEEDED  LAST MINUTE") {
			t.Errorf("step %d: no layer table header:\n%s", i, screen)
		}
		if head := "layers      2 (limit.extra of x.yaml)"; !strings.Contains(screen, head) {
			t.Errorf("step %d: screen lacks %q:\n%s", i, head, screen)
		}
		for layer, want := range s.rows {
			f := layerRow(screen, layer)
			if len(f) < 2 || f[len(f)-2] != want[0] || f[len(f)-1] != want[1] {
				t.Errorf("step %d: layer %s row %q, want exceeded %s, last minute %s:\n%s", i, layer, f, want[0], want[1], screen)
			}
		}
		if line := watchLine(v); !strings.HasSuffix(line, s.line) {
			t.Errorf("step %d: line %q, want it to end with %q", i, line, s.line)
		}
	}
}

// layerRow returns the cells of layer's row in a screen's layer table.
func layerRow(screen, layer string) []string {
	for l := range strings.SplitSeq(screen, "\n") {
		if rest, ok := strings.CutPrefix(l, "    "+layer+" "); ok {
			cells := []string{layer}
			for c := range strings.SplitSeq(rest, "  ") {
				if c = strings.TrimSpace(c); c != "" {
					cells = append(cells, c)
				}
			}
			return cells
		}
	}
	return nil
}

// TestWatchTerminalLayers runs bucket watch --config on a pseudo-terminal
// against a replica of a bucket with a keyed dead_letter layer, and checks
// that the layer's refusals, reported with the replica's heartbeat, show
// on the screen as they happen.
func TestWatchTerminalLayers(t *testing.T) {
	path, _ := writeLayersConfig(t, "watch", `    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 1/h
      burst: 1
      on_exceed: dead_letter`)
	_, ls := openLayers(t, path)
	b, err := limiter.New(ls, limiter.Options{ReplicaID: "layered-replica", HeartbeatInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		_ = ls.ResetLayer(context.Background(), "per-recipient", "+1555000001")
		runCLI(t, "bucket", "reset", "--config", path)
	})
	scr, stop := watchOnTerminal(t, "bucket", "watch", "--config", path, "--interval", "200ms")
	row := func(want ...string) func(string) bool {
		return func(f string) bool {
			r := layerRow(f, "per-recipient")
			return len(r) >= len(want) && slices.Equal(r[len(r)-len(want):], want)
		}
	}
	// The replica reports, with no refusal yet.
	f := scr.waitFrameFunc(t, 10*time.Second, "per-recipient refused 0", row("0 keys in use", "0", "+0"))
	if !strings.Contains(f, "layers      1 (limit.extra of "+path+")") || !strings.Contains(f, "1/h, burst 1, per key, on_exceed dead_letter") {
		t.Errorf("frame lacks the layer and its limit:\n%s", f)
	}
	ctx := testenv.Context(t, 10*time.Second)
	req := limiter.Request{Cost: 1, Keys: map[string]string{"per-recipient": "+1555000001"}}
	if err := b.WaitN(ctx, req); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := b.WaitN(ctx, req); !errors.Is(err, limiter.ErrLimitExceeded) {
			t.Fatalf("WaitN on a spent key = %v, want ErrLimitExceeded", err)
		}
	}
	// With the key refused, as the heartbeat reports it.
	f = scr.waitFrameFunc(t, 10*time.Second, "per-recipient refused 3, +3 in the last minute, +1555000001 3 times", row("3", "+3", "+1555000001 3"))
	t.Logf("screen:\n%s", f)
	stop()
}

func TestEstimateDelivered(t *testing.T) {
	st := func(tokens float64) redislimiter.BucketStatus {
		return redislimiter.BucketStatus{Rate: 50, Burst: 50, TokensKnown: true, Tokens: tokens}
	}
	for _, tc := range []struct {
		before, after float64
		want          float64
	}{
		{40, 30, 60}, // 40 + 50 − 30
		{50, 50, 0},  // full at both reads: idle as far as it can tell
		{45, 50, 0},  // full now: only 5 of the 50 refilled tokens counted
		{10, 40, 20}, // 10 + 50 − 40
	} {
		if got, est := estimateDelivered(st(tc.before), st(tc.after), 1); got != tc.want || !est {
			t.Errorf("estimateDelivered(%v → %v tokens in 1 s at 50/s, burst 50) = %v, want %v", tc.before, tc.after, got, tc.want)
		}
	}
}

// TestGrantTrackBeats follows a replica whose heartbeats (every 3 s, at
// instants that Redis stamps) are read every second: the rate is the
// count's increase between the stamps of the last 10 s, known from the
// second heartbeat on, whatever the reads' timing.
func TestGrantTrackBeats(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	var g grantTrack
	for i, s := range []struct {
		read, beat int // ms
		granted    int64
		want       float64 // NaN: unknown
	}{
		{0, -2900, 1000, math.NaN()}, // one heartbeat: no rate yet
		{1000, -2900, 1000, math.NaN()},
		{2000, 100, 1030, 10}, // 30 in 3 s, though read 2 s apart
		{3000, 100, 1030, 10},
		{4000, 3050, 1060, 60. / 5.95},
		{5000, 6100, 1090, 90. / 9},
		{9000, 9100, 1090, 60. / 9}, // nothing granted in the last 3 s
		{10000, 12100, 1090, 30. / 9.05},
		{13000, 15100, 1090, 0},
		{14000, 18100, 40, math.NaN()}, // restarted
		{15000, 21100, 100, 20},
	} {
		g.observe(ms(s.read), ms(s.beat), s.granted)
		got := g.rate(ms(s.read))
		if !(math.IsNaN(got) && math.IsNaN(s.want)) && math.Abs(got-s.want) > 1e-9 {
			t.Errorf("step %d (read %d ms, beat %d ms, granted %d): rate %v, want %v", i, s.read, s.beat, s.granted, got, s.want)
		}
	}
}

// TestWatchDeliveredSource checks what the delivered rate says of its
// source: the replicas' sum once every one has beaten twice ("?" before,
// never an estimate), an estimate only when replicas report no counts,
// and the idle replicas.
func TestWatchDeliveredSource(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	full := redislimiter.BucketStatus{Bucket: "sms", Rate: 50, Burst: 50, TokensKnown: true, Tokens: 50}
	rep := func(id string, beat time.Duration, granted int64, idle bool) redislimiter.Replica {
		return redislimiter.Replica{ID: id, Rate: 50, Burst: 50, Reported: true, Mode: limiter.ModeShared, Granted: granted, Idle: idle, BeatAt: t0.Add(beat)}
	}
	h := newWatchHistory("sms", time.Second)
	steps := []struct {
		at   time.Duration
		reps []redislimiter.Replica
		want []string // on the screen
		line string   // in the line
	}{
		{0, []redislimiter.Replica{rep("a", 0, 100, false), rep("b", 0, 0, true)},
			[]string{"delivered   ? (measuring: each replica's rate shows from its second heartbeat)", "2 alive, 1 idle", "a   shared        ?", "b   shared, idle  ?"},
			"delivered=? waiting=0 idle=1"},
		// The bucket is full: an estimate would say 0/s.
		{time.Second, []redislimiter.Replica{rep("a", 0, 100, false), rep("b", 0, 0, true)},
			[]string{"delivered   ? (measuring"}, "delivered=? waiting=0 idle=1"},
		{3 * time.Second, []redislimiter.Replica{rep("a", 3*time.Second, 130, false), rep("b", 3*time.Second, 0, true)},
			[]string{"delivered   10/s (reported by the replicas)", "a   shared        10/s", "b   shared, idle  0/s"},
			"delivered=10/s waiting=0 idle=1"},
		// A replica of an older version reports nothing: an estimate.
		{4 * time.Second, []redislimiter.Replica{rep("a", 3*time.Second, 130, false), {ID: "old", Rate: 50, Burst: 50}},
			[]string{"delivered   0/s (estimated from the bucket's tokens: 1 of 2 replicas report no count; it undercounts while the bucket is full)"},
			"delivered=0/s(estimated) waiting=0"},
		{5 * time.Second, []redislimiter.Replica{{ID: "old", Rate: 50, Burst: 50}},
			[]string{"delivered   0/s (estimated from the bucket's tokens: the replicas report no counts; it undercounts while the bucket is full)"},
			"delivered=0/s(estimated) waiting=?"},
	}
	for i, s := range steps {
		at := t0.Add(s.at)
		v := h.add(sample{at: at, status: full, replicas: s.reps, configured: &limitsJSON{Rate: 50, Burst: 50}, from: "x.yaml"}, nil, at)
		screen := renderWatch(v)
		for _, w := range s.want {
			if !strings.Contains(screen, w) {
				t.Errorf("step %d: screen lacks %q:\n%s", i, w, screen)
			}
		}
		if line := watchLine(v); !strings.Contains(line, " "+s.line) {
			t.Errorf("step %d: line %q lacks %q", i, line, s.line)
		}
	}
}
