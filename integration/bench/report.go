package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// perSecond is the granted tokens per second.
func (r result) perSecond() float64 { return float64(r.t.granted()) / r.d.Seconds() }

// perToken divides n by the tokens granted in the steady window.
func (r result) perToken(n int64) float64 { return float64(n) / float64(max(1, r.steady)) }

// allowed is the most a saturated bucket may grant in the run: rate × T +
// burst.
func (r result) allowed() float64 { return r.w.rate*r.d.Seconds() + float64(r.w.burst) }

// accuracy is granted against allowed, in percent above (+) or below (−).
func (r result) accuracy() float64 { return (float64(r.t.granted())/r.allowed() - 1) * 100 }

// maxWindow is the most tokens granted in any one-second window, sliding
// by one millisecond (or in the whole run, if shorter).
func (r result) maxWindow() int64 {
	const width = 1000
	var sum, best int64
	for i, v := range r.t.bins {
		sum += v
		if i >= width {
			sum -= r.t.bins[i-width]
		}
		best = max(best, sum)
	}
	return best
}

// shares returns the smallest and largest replica's share, in percent.
func (r result) shares() (lo, hi float64) {
	total := float64(max(1, r.t.granted()))
	lo = 100
	for _, n := range r.t.perReplica {
		s := float64(n) / total * 100
		lo, hi = min(lo, s), max(hi, s)
	}
	return lo, hi
}

// cpuPerMillion is CPU seconds per million tokens granted in the steady
// window.
func (r result) cpuPerMillion(d time.Duration) float64 { return r.perToken(int64(d)) / 1e3 }

// report is everything one invocation measured.
type report struct {
	cfg         config
	machine     string
	load        string // load averages during the run
	results     []result
	latencies   []latency
	leaseAllocs float64
	// layerPairs are the paired rounds of (c) and (e); see
	// measureLayerPairs.
	layerPairs []layerPair
}

func (rep *report) byWorkload(name string) []result {
	var out []result
	for _, r := range rep.results {
		if r.w.name == name {
			out = append(out, r)
		}
	}
	return out
}

func (rep *report) find(workload, implKey string) (result, bool) {
	for _, r := range rep.results {
		if r.w.name == workload && r.im.key == implKey {
			return r, true
		}
	}
	return result{}, false
}

// markdown renders the report.
func (rep *report) markdown() string {
	var b strings.Builder
	c := rep.cfg
	fmt.Fprintf(&b, "## Results\n\n")
	fmt.Fprintf(&b, "Command: `cd integration/bench && go run .%s`\n\n", c.flags)
	fmt.Fprintf(&b, "Machine: %s. Load average (1, 5, 15 min): %s.\n\n", rep.machine, rep.load)
	from, to := steadyWindow(c.duration)
	if len(rep.results) > 0 {
		fmt.Fprintf(&b, "%d replicas, each its own Redis client and limiter with %d goroutines calling `Wait(ctx, 1)` in a loop, on one fresh bucket per run at %s; each run lasts %v. Rates and accuracy count the whole run; Redis calls and CPU are per token granted in the steady window from %v to %v.",
			c.replicas, c.goroutines, c.redisAddr, c.duration, from, to)
		if c.opts.MaxReserve > 0 || c.opts.HeartbeatInterval > 0 {
			fmt.Fprintf(&b, " Limiter options of (c) and (d): MaxReserve %v, HeartbeatInterval %v (0: default).", c.opts.MaxReserve, c.opts.HeartbeatInterval)
		}
		b.WriteString("\n\n")
		b.WriteString("| workload | implementation | granted/s | Redis calls/token (client) | Redis cmds/token | accuracy | max 1 s window | replica share min–max | CPU s/M tokens | Redis CPU s/M tokens |\n")
		b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, r := range rep.results {
			acc := "—"
			if r.w.saturated {
				acc = fmt.Sprintf("%+.2f%%", r.accuracy())
				if r.accuracy() < -10 {
					acc += " †"
				}
			}
			lo, hi := r.shares()
			fmt.Fprintf(&b, "| %s | %s | %s | %s (%s) | %s | %s | %s | %.1f–%.1f%% | %.2f | %.2f |\n",
				workloadLabel(r.w), r.im.name, thousands(r.perSecond()),
				ratio(r.perToken(r.u.redis.calls)), ratio(r.perToken(r.u.clientCalls)), ratio(r.perToken(r.u.redis.cmds)),
				acc, thousands(float64(r.maxWindow())), lo, hi,
				r.cpuPerMillion(r.u.cpu), r.cpuPerMillion(r.u.redis.cpu))
		}
		b.WriteString(`
- Redis calls/token: commands from INFO commandstats deltas, without INFO itself and without the commands that scripts run inside Redis; in parentheses the same count taken by a hook on the benchmark's own clients, which other traffic on the server cannot disturb (the targets use it). Redis cmds/token counts the commands inside scripts too. Heartbeats, reservations cancelled and lease refunds count.
- accuracy: granted against rate × T + burst; meaningful only for saturated workloads. † the implementation's ceiling is below the rate, so the figure is a shortfall, not an error.
- max 1 s window: the most tokens granted in any one-second window sliding by 1 ms, including the initial burst; its bound is rate + burst.
- CPU: this process's user + system time (getrusage), and Redis's used_cpu_user + used_cpu_sys deltas (all of Redis's clients).

`)
	}
	if len(rep.layerPairs) > 0 {
		layerPairsMarkdown(&b, rep.layerPairs)
	}
	if c.latencyPhases {
		fmt.Fprintf(&b, "Latency that `Wait` adds when tokens are plentiful (rate and burst %g/s, one caller per replica pausing 1 ms between calls; %d runs of %v per implementation, their order alternating, merged):\n\n", c.latencyRate, c.latencyRounds, c.latency)
	} else {
		fmt.Fprintf(&b, "Latency that `Wait` adds when tokens are plentiful (rate and burst %g/s; one caller per replica, holding a limiter of each implementation on its own client and bucket, calls them in turn, pausing 1 ms after each call; %d runs of %v, merged; allocations counted after, one implementation at a time):\n\n", c.latencyRate, c.latencyRounds, c.latency)
	}
	b.WriteString("| implementation | waits | p25 | p50 | p90 | p99 | Redis calls/Wait | allocs/Wait |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, l := range rep.latencies {
		fmt.Fprintf(&b, "| %s | %d | %v | %v | %v | %v | %s | %.1f |\n", l.im.name, l.waits, roundDur(l.p25), roundDur(l.p50), roundDur(l.p90), roundDur(l.p99), ratio(l.calls), l.allocs)
	}
	fmt.Fprintf(&b, "\n`Wait` served from a lease: %.4f allocations per call (whole process, least of 5 rounds of 20,000 calls).\n\n", rep.leaseAllocs)
	b.WriteString("Targets:\n\n")
	for _, t := range rep.targets() {
		verdict := "PASS"
		if !t.ok {
			verdict = "MISS"
		}
		fmt.Fprintf(&b, "- **%s** %s: %s\n", verdict, t.name, t.got)
	}
	if len(rep.byWorkload("low")) > 0 && c.plot != "" {
		fmt.Fprintf(&b, "\n![Granted per second at 50/s](%s)\n", c.plot)
	}
	return b.String()
}

// target is one of the limiter's targets and how this run did.
type target struct {
	name string
	got  string
	ok   bool
}

// targets checks the targets whose runs were made. Redis calls are the
// client-side count, which other traffic on the server cannot inflate; the
// INFO commandstats figure is shown beside it.
func (rep *report) targets() []target {
	calls := func(r result) (float64, string) {
		n := r.perToken(r.u.clientCalls)
		return n, fmt.Sprintf("%s (commandstats %s)", ratio(n), ratio(r.perToken(r.u.redis.calls)))
	}
	var ts []target
	if h, ok := rep.find("high", "d"); ok {
		n, got := calls(h)
		ts = append(ts,
			target{"leasing sustains ≥ 500,000 tokens/s across the replicas (high, 500,000/s saturated)",
				thousands(h.perSecond()) + "/s", h.perSecond() >= 500_000},
			target{"leasing ≤ 0.05 Redis calls/token (high)", got, n <= 0.05},
			target{"leasing accuracy within ±1% (high)", fmt.Sprintf("%+.2f%%", h.accuracy()), h.accuracy() >= -1 && h.accuracy() <= 1})
	}
	if f, ok := rep.find("fast", "d"); ok {
		ts = append(ts, target{"leasing ceiling ≥ 500,000 tokens/s (fast)", thousands(f.perSecond()) + "/s", f.perSecond() >= 500_000})
	}
	if f, ok := rep.find("fast", "c"); ok {
		ts = append(ts, target{"without leasing ≥ 50,000 tokens/s from one bucket (fast)", thousands(f.perSecond()) + "/s", f.perSecond() >= 50_000})
	}
	if len(rep.layerPairs) > 0 {
		r := layerPairsMarkdown(&strings.Builder{}, rep.layerPairs)
		var calls, msgs int64
		for _, p := range rep.layerPairs {
			calls, msgs = calls+p.keyed.u.clientCalls, msgs+p.keyed.steady
		}
		n := float64(calls) / float64(max(1, msgs))
		ts = append(ts,
			target{"(e) a keyed layer over 100k keys, leasing on: ≥ 0.8× the shared bucket alone, (c) (fast, median of the paired rounds)", fmt.Sprintf("%.2f×", r), r >= 0.8},
			target{"(e) a keyed layer over 100k keys: at most 1 Redis call per message (fast, paired rounds)", ratio(n), n <= 1})
	} else if e, ok := rep.find("fast", "e"); ok {
		if c, ok := rep.find("fast", "c"); ok {
			r := e.perSecond() / c.perSecond()
			n, got := calls(e)
			ts = append(ts,
				target{"(e) a keyed layer over 100k keys, leasing on: ≥ 0.8× the shared bucket alone, (c) (fast)",
					fmt.Sprintf("%.2f× (%s/s against %s/s)", r, thousands(e.perSecond()), thousands(c.perSecond())), r >= 0.8},
				target{"(e) a keyed layer over 100k keys: at most 1 Redis call per message (fast)", got, n <= 1})
		}
	}
	for _, k := range []string{"c", "d"} {
		if l, ok := rep.find("low", k); ok {
			n, got := calls(l)
			if a, ok := rep.find("low", "a"); ok {
				_, ga := calls(a)
				got += "; tutorial polling: " + ga
			}
			ts = append(ts, target{l.im.name + " ≤ 1.1 Redis calls/token at 50/s, 8 saturated replicas", got, n <= 1.1})
		}
	}
	var rr, tc *latency
	for i, l := range rep.latencies {
		switch l.im.key {
		case "b":
			rr = &rep.latencies[i]
		case "c":
			tc = &rep.latencies[i]
		}
	}
	if rr != nil && tc != nil {
		ts = append(ts,
			target{"(c) a single `Wait` without leasing: p50 at or below redis_rate's", fmt.Sprintf("%v against %v", roundDur(tc.p50), roundDur(rr.p50)), tc.p50 <= rr.p50},
			target{"(c) a single `Wait` without leasing: no more allocations than redis_rate", fmt.Sprintf("%.1f against %.1f", tc.allocs, rr.allocs), tc.allocs <= rr.allocs})
	}
	ts = append(ts, target{"`Wait` served from a lease does not allocate", fmt.Sprintf("%.4f allocs/Wait", rep.leaseAllocs), rep.leaseAllocs == 0})
	return ts
}

func workloadLabel(w workload) string {
	if !w.saturated {
		return w.name + " (limit 1e9/s)"
	}
	return fmt.Sprintf("%s (%s/s, burst %s)", w.name, thousands(w.rate), thousands(float64(w.burst)))
}

// thousands formats v rounded, with thousands separators.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// ratio formats a per-token figure with three significant digits at
// least down to 0.0001.
func ratio(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 0.01:
		return fmt.Sprintf("%.5f", v)
	case v < 1:
		return fmt.Sprintf("%.3f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func roundDur(d time.Duration) time.Duration {
	if d < 10*time.Microsecond {
		return d.Round(10 * time.Nanosecond)
	}
	return d.Round(time.Microsecond)
}

// loadAverage returns the 1, 5 and 15 minute load averages, which tell how
// much else the machine was doing.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// describeMachine names the CPU, the core count, Go and Redis.
func describeMachine(ctx context.Context, c *redis.Client) (string, error) {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("reading INFO server: %w", err)
	}
	redisVersion := "unknown"
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			redisVersion = v
		}
	}
	return fmt.Sprintf("%d cores (nproc), %s, %s %s/%s, Redis %s on the same machine, %s",
		runtime.NumCPU(), model, runtime.Version(), runtime.GOOS, runtime.GOARCH, redisVersion,
		time.Now().UTC().Format("2006-01-02")), nil
}
