package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/cli"
)

// The end-to-end comparison: `throttle run` (the same cli.Run the binary
// calls) against a bare client loop doing the same work, on the same
// broker, the same sink and the same machine, in one run.

// e2eConfig is the command line of the end-to-end comparison.
type e2eConfig struct {
	messages int  // messages per run with the limit out of reach
	rounds   int  // runs of each consumer, alternating
	layer    bool // also run consLayer in each round
	dedupe   bool // also run consDedupe in each round
	window   bool // also run consWindow in each round
	// policy runs throttle, consDedupe and consWindow only (no bare loop,
	// no run with the limit in reach): the cost of the sending policy.
	policy bool
	// concurrency runs throttle and consConc only, as policy does: the
	// cost of a concurrency layer.
	concurrency bool
	tracing     bool // also run consTrace1 and consTrace001 in each round
	// readme also runs consReadme and consReadmePlain in each round.
	readme bool
	// sinkLatency is how long the sink takes to answer each message.
	sinkLatency time.Duration
	// maxConns, when set, is throttle's sink.http.max_conns in every
	// configuration but README.md's.
	maxConns int
	// bareQueue is what each worker of the bare Kafka loop queues.
	bareQueue int
	// kafkaOrdering is throttle's kafka.ordering (partition, key by
	// recipient, none); the bare loop works each partition in order.
	kafkaOrdering string
	inReach       float64 // the limit of the in-reach runs
	inReachFor    time.Duration
	scenarios     []string
	out           string
	profileDir    string
	flags         string
}

// source is a broker scenario: RabbitMQ or Kafka.
type source interface {
	name() string
	// prepare fills a fresh queue or topic with n messages.
	prepare(ctx context.Context, n int) (prepared, error)
}

// prepared is a queue or topic filled for one run.
type prepared interface {
	// throttleConfig is the source section of throttle's YAML config.
	throttleConfig() string
	// bare consumes with the bare client loop until ctx ends, posting
	// each message to sinkURL.
	bare(ctx context.Context, sinkURL string) error
	// left counts the messages not acked or committed after the run.
	left(ctx context.Context) (int64, error)
	cleanup()
}

// The consumers compared.
const (
	consThrottle = "throttle"
	// consLayer is throttle with a keyed layer in limit.extra: one bucket
	// per recipient ("to" in the body; every message has its own), with a
	// limit far above reach, as layerYAML says.
	consLayer = "throttle + per-recipient layer"
	consBare  = "bare"
	// consConc is throttle with a concurrency layer in limit.extra: 3
	// slots per key over concKeys keys, as concYAML says. Its cost against
	// consThrottle is the layer's (docs/concurrency.md).
	consConc = "throttle + concurrency layer"
	// consDedupe is throttle with delivery.dedupe: a claim before each
	// send and a mark after it, in the private Redis, keyed by the
	// message's recipient (every message has its own), as dedupeYAML says.
	consDedupe = "throttle + dedupe"
	// consWindow is throttle with a send window by number in limit.extra
	// (timezone: e164, open all day, so that every message passes it),
	// keyed by the recipient, as windowYAML says.
	consWindow = "throttle + window"
	// consTrace1 and consTrace001 are throttle with tracing on
	// (tracing.enabled), at sample_ratio 1 and 0.01, exporting over
	// OTLP/HTTP to the child process, which decodes and counts the spans.
	consTrace1   = "throttle + tracing 1.0"
	consTrace001 = "throttle + tracing 0.01"
	// consReadme is throttle in the configuration README.md's "Run the
	// binary" gives (readmeYAML): a cost template, a per-recipient layer
	// (5/h, burst 5, dead_letter), an Authorization header, a form body
	// from a template, and the defaults for the rest (metrics on, log
	// level info, drain timeout), with the limit out of reach.
	consReadme = "throttle, README config"
	// consReadmePlain is consReadme without its per-recipient layer: the
	// README's plain path (cost template, header, form body).
	consReadmePlain = "throttle, README config without the layer"
)

// readmeYAML is the configuration of README.md's "Run the binary" for
// consReadme and consReadmePlain, with the benchmark's Redis, bucket,
// rate (out of reach), source and sink: %s are the Redis address, the
// bucket, the rate, the burst, limit.extra, the source section, the
// sink's URL and the metrics port. The source keeps the benchmark's
// settings (prefetch, concurrency) so that the consumers compare on the
// same footing; metrics listen on a free port rather than 9464 so that
// concurrent runs do not collide.
const readmeYAML = `redis: {addr: "%s"}
limit:
  bucket: %s
  rate: %s
  burst: %d
  cost_template: '{{sms_segments .JSON.text}}'
%ssource:
%s
sink:
  http:
    url: "%s/throttle"
    headers: {Authorization: "Bearer ${SMS_TOKEN}"}
    content_type: application/x-www-form-urlencoded
    body_template: '{{form "To" .JSON.to "Body" .JSON.text}}'
metrics:
  listen: 127.0.0.1:%d
`

// readmeLayerYAML is limit.extra of consReadme: README.md's per-recipient
// layer. Every message has its own recipient, so it refuses none.
const readmeLayerYAML = `  extra:
    - {name: per-recipient, key: '{{.JSON.to}}', rate: 5/h, burst: 5, on_exceed: dead_letter}
`

// sampleRatio returns the tracing.sample_ratio of consumer, or -1 for a
// consumer without tracing.
func sampleRatio(consumer string) float64 {
	switch consumer {
	case consTrace1:
		return 1
	case consTrace001:
		return 0.01
	}
	return -1
}

// layerYAML is limit.extra of consLayer.
const layerYAML = `  extra:
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 1000
      burst: 1000
`

// concKeys is the number of keys of consConc: the recipient's last 4
// digits, so message i has key i mod 10,000.
const concKeys = 10_000

// concYAML is limit.extra of consConc. The lease is the default (sink
// timeout × attempts).
const concYAML = `  extra:
    - name: per-endpoint
      key: '{{slice .JSON.to 8}}'
      concurrency: 3
`

// againstThrottle reports whether the runs compare features with throttle
// alone, without the bare loop and the run with the limit in reach.
func (c e2eConfig) againstThrottle() bool { return c.policy || c.concurrency }

// dedupeYAML is delivery.dedupe of consDedupe, under delivery.
const dedupeYAML = `  dedupe:
    key: '{{.JSON.to}}'
    window: 1h
`

// windowYAML is limit.extra of consWindow: a send window open from 00:00
// to 24:00 every day in the zone of each number, so that every message is
// decided by it (one layers script call) and none is set aside.
const windowYAML = `  extra:
    - name: quiet-hours
      key: '{{e164 .JSON.to}}'
      window: {from: "00:00", to: "24:00"}
      timezone: e164
`

// e2eRun is one consumer's run over one prepared queue or topic.
type e2eRun struct {
	source   string
	consumer string // consThrottle, consLayer or consBare
	round    int
	rate     float64 // the limit; 0 for the bare loop
	burst    int
	n        int
	arrivals []time.Duration // at the sink, sorted, since the sink's reset
	redis    redisStats      // delta over the run, private Redis
	cpu      time.Duration   // this process, over the run
	svcCPU   time.Duration   // the child process (sink, kfake), over the run
	mallocs  uint64
	left     int64
	spans    int64  // spans the OTLP receiver counted (tracing runs)
	load     string // the load average at the end of the run
}

// elapsed is the time from the first to the last message at the sink.
func (r e2eRun) elapsed() time.Duration {
	if len(r.arrivals) < 2 {
		return 0
	}
	return r.arrivals[len(r.arrivals)-1] - r.arrivals[0]
}

// perSecond is messages per second at the sink, first to last.
func (r e2eRun) perSecond() float64 {
	return float64(len(r.arrivals)-1) / r.elapsed().Seconds()
}

// steadyRate is the rate at the sink from 1 s after the first arrival to
// the last, which leaves the initial burst out.
func (r e2eRun) steadyRate() float64 {
	if len(r.arrivals) < 2 {
		return 0
	}
	from := r.arrivals[0] + time.Second
	i, _ := slices.BinarySearch(r.arrivals, from)
	last := r.arrivals[len(r.arrivals)-1]
	if last <= from {
		return 0
	}
	return float64(len(r.arrivals)-1-i) / (last - from).Seconds()
}

// maxWindow is the most arrivals in any one-second window.
func (r e2eRun) maxWindow() int {
	best, j := 0, 0
	for i, t := range r.arrivals {
		for r.arrivals[j] <= t-time.Second {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

type e2eBench struct {
	cfg   e2eConfig
	svc   *services
	redis *privateRedis
	admin *redis.Client
	runID string
	seq   int
	// onStart and onStop, when set, run just before the consumer starts
	// and just after it stopped, around what a profile should cover.
	onStart, onStop func() error
}

// runE2E runs the end-to-end comparison and writes its report.
func runE2E(ctx context.Context, cfg e2eConfig) error {
	svc, err := startServices(ctx, cfg.sinkLatency)
	if err != nil {
		return err
	}
	defer svc.stop()
	rds, err := startRedis(ctx)
	if err != nil {
		return err
	}
	defer rds.stop()
	admin := redis.NewClient(&redis.Options{Addr: rds.addr})
	defer admin.Close()
	machine, err := describeMachine(ctx, admin)
	if err != nil {
		return err
	}
	if cfg.readme && os.Getenv("SMS_TOKEN") == "" {
		// The README's header reads the token from the environment.
		if err := os.Setenv("SMS_TOKEN", "bench-token"); err != nil {
			return err
		}
	}
	if cfg.tracing {
		// The tracing runs export to the child process; the batch
		// processor keeps its defaults (OTEL_BSP_*).
		for k, v := range map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": svc.Sink, "OTEL_TRACES_SAMPLER": "",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "", "OTEL_SDK_DISABLED": ""} {
			if err := os.Setenv(k, v); err != nil {
				return err
			}
		}
	}
	b := &e2eBench{cfg: cfg, svc: svc, redis: rds, admin: admin, runID: randomID()}
	load0 := loadAverage()
	var runs []e2eRun
	for _, name := range cfg.scenarios {
		src, err := newSource(ctx, name, svc, cfg)
		if err != nil {
			return err
		}
		if cfg.profileDir != "" {
			if err := b.profile(ctx, src); err != nil {
				return fmt.Errorf("%s, profile: %w", name, err)
			}
		}
		for round := 1; round <= cfg.rounds; round++ {
			order := []string{consThrottle}
			if !cfg.againstThrottle() {
				order = append(order, consBare)
			}
			if cfg.concurrency {
				order = append(order, consConc)
			}
			if cfg.layer {
				order = append(order, consLayer)
			}
			if cfg.dedupe {
				order = append(order, consDedupe)
			}
			if cfg.window {
				order = append(order, consWindow)
			}
			if cfg.tracing {
				order = append(order, consTrace1, consTrace001)
			}
			if cfg.readme {
				order = append(order, consReadme, consReadmePlain)
			}
			if round%2 == 0 {
				slices.Reverse(order)
			}
			for _, c := range order {
				r, err := b.run(ctx, src, c, round, 1e6, 1_000_000, cfg.messages)
				if err != nil {
					return fmt.Errorf("%s, %s, round %d: %w", name, c, round, err)
				}
				fmt.Fprintf(os.Stderr, "%-9s %-9s round %d: %8.0f msg/s, %.4f Redis calls/msg, CPU %.1f µs/msg (services %.1f, Redis %.1f, its scripts %.1f), left %d, load %s\n",
					name, c, round, r.perSecond(), float64(r.redis.calls)/float64(r.n), perMsg(r.cpu, r.n), perMsg(r.svcCPU, r.n), perMsg(r.redis.cpu, r.n), perMsg(r.redis.scriptTime, r.n), r.left, r.load)
				runs = append(runs, r)
			}
		}
		if cfg.againstThrottle() {
			continue
		}
		// The limit binds only where throttle runs faster than it: with a
		// slow sink (-e2e-sink-latency) it may not, and the run would
		// only measure the sink.
		fastest := 0.0
		for _, r := range runs {
			if r.source == name && r.consumer == consThrottle {
				fastest = max(fastest, r.perSecond())
			}
		}
		if fastest < cfg.inReach {
			fmt.Fprintf(os.Stderr, "%-9s limit in reach skipped: throttle made at most %.0f msg/s, below the limit of %v/s\n", name, fastest, cfg.inReach)
			continue
		}
		burst := int(cfg.inReach / 10)
		n := int(cfg.inReach*cfg.inReachFor.Seconds()) + burst
		r, err := b.run(ctx, src, consThrottle, 0, cfg.inReach, burst, n)
		if err != nil {
			return fmt.Errorf("%s, limit in reach: %w", name, err)
		}
		fmt.Fprintf(os.Stderr, "%-9s throttle at %v/s: steady %.0f msg/s, %.4f Redis calls/msg\n",
			name, cfg.inReach, r.steadyRate(), float64(r.redis.calls)/float64(r.n))
		runs = append(runs, r)
	}
	md := e2eMarkdown(cfg, machine, load0+" at the start, "+loadAverage()+" at the end", runs)
	fmt.Print(md)
	if err := os.WriteFile(cfg.out, []byte(md), 0o644); err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	return nil
}

// run fills a fresh queue or topic with n messages, consumes them with
// consumer ("throttle" or "bare") until the sink has seen n, and stops it.
func (b *e2eBench) run(ctx context.Context, src source, consumer string, round int, rate float64, burst, n int) (e2eRun, error) {
	p, err := src.prepare(ctx, n)
	if err != nil {
		return e2eRun{}, err
	}
	defer p.cleanup()
	r := e2eRun{source: src.name(), consumer: consumer, round: round, n: n}
	if consumer != consBare {
		r.rate, r.burst = rate, burst
	}
	if err := b.svc.resetSink(ctx); err != nil {
		return r, err
	}
	runtime.GC()
	before, err := b.usage(ctx)
	if err != nil {
		return r, err
	}
	svc0 := b.svc.cpu()
	if b.onStart != nil {
		if err := b.onStart(); err != nil {
			return r, err
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var logs bytes.Buffer
	done := make(chan error, 1)
	switch consumer {
	case consThrottle, consLayer, consConc, consDedupe, consWindow, consTrace1, consTrace001, consReadme, consReadmePlain:
		path, err := b.writeConfig(p, rate, burst, consumer, sampleRatio(consumer))
		if err != nil {
			return r, err
		}
		defer os.Remove(path)
		go func() {
			if code := cli.Run(runCtx, []string{"run", "--config", path}, io.Discard, &syncWriter{w: &logs}); code != cli.ExitOK {
				done <- fmt.Errorf("throttle run exited %d", code)
				return
			}
			done <- nil
		}()
	case consBare:
		go func() { done <- p.bare(runCtx, b.svc.Sink+"/"+src.name()) }()
	}
	timeout := time.Duration(float64(n)/min(rate, 1000)*float64(time.Second)) + 60*time.Second
	if err := b.waitSink(ctx, n, timeout, done); err != nil {
		stop()
		return r, fmt.Errorf("%w; log: %s", err, logs.String())
	}
	stop()
	if err := <-done; err != nil {
		return r, fmt.Errorf("%w; log: %s", err, logs.String())
	}
	if b.onStop != nil {
		if err := b.onStop(); err != nil {
			return r, err
		}
	}
	after, err := b.usage(ctx)
	if err != nil {
		return r, err
	}
	r.svcCPU = b.svc.cpu() - svc0
	st, err := b.svc.sinkStats(ctx)
	if err != nil {
		return r, err
	}
	for _, at := range st.At {
		r.arrivals = append(r.arrivals, time.Duration(at))
	}
	slices.Sort(r.arrivals)
	d := after.sub(before)
	r.redis, r.cpu, r.mallocs = d.redis, d.cpu, d.mallocs
	r.load = loadAverage()
	if r.left, err = p.left(ctx); err != nil {
		return r, err
	}
	if sampleRatio(consumer) >= 0 {
		// Run returned after its tracer provider flushed: every span
		// exported is counted.
		if r.spans, err = b.svc.sinkSpans(ctx); err != nil {
			return r, err
		}
	}
	return r, nil
}

// perMsg is d per message, in µs.
func perMsg(d time.Duration, n int) float64 {
	return float64(d.Nanoseconds()) / 1e3 / float64(n)
}

// usage reads the private Redis's counters and this process's CPU.
func (b *e2eBench) usage(ctx context.Context) (usage, error) {
	return snapshot(ctx, b.admin, nil)
}

// waitSink waits until the sink has answered n requests, the consumer
// stops, or timeout passes.
func (b *e2eBench) waitSink(ctx context.Context, n int, timeout time.Duration, done <-chan error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-done:
			return fmt.Errorf("the consumer stopped early: %v", err)
		case <-tick.C:
		}
		st, err := b.svc.sinkCount(ctx)
		if err != nil {
			return err
		}
		if st >= int64(n) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the sink saw %d of %d messages in %v", st, n, timeout)
		}
	}
}

// writeConfig writes throttle's config for p and returns its path.
func (b *e2eBench) writeConfig(p prepared, rate float64, burst int, consumer string, sampleRatio float64) (string, error) {
	b.seq++
	port, err := freePort()
	if err != nil {
		return "", err
	}
	if consumer == consReadme || consumer == consReadmePlain {
		extra := ""
		if consumer == consReadme {
			extra = readmeLayerYAML
		}
		return writeTemp(fmt.Sprintf(readmeYAML, b.redis.addr, fmt.Sprintf("e2e-%s-%d", b.runID, b.seq),
			strconv.FormatFloat(rate, 'f', -1, 64), burst, extra, p.throttleConfig(), b.svc.Sink, port))
	}
	extra, delivery, maxConns := "", "", ""
	if b.cfg.maxConns > 0 {
		maxConns = fmt.Sprintf("    max_conns: %d\n", b.cfg.maxConns)
	}
	switch consumer {
	case consLayer:
		extra = layerYAML
	case consWindow:
		extra = windowYAML
	case consConc:
		extra = concYAML
	case consDedupe:
		delivery = dedupeYAML
	}
	yaml := fmt.Sprintf(`redis:
  addr: %s
limit:
  bucket: e2e-%s-%d
  rate: %s
  burst: %d
%ssource:
%s
sink:
  http:
    url: %s/throttle
%sdelivery:
  drain_timeout: 10s
%smetrics:
  listen: 127.0.0.1:%d
log:
  level: warn
`, b.redis.addr, b.runID, b.seq, strconv.FormatFloat(rate, 'f', -1, 64), burst, extra, p.throttleConfig(), b.svc.Sink, maxConns, delivery, port)
	if sampleRatio >= 0 {
		yaml += fmt.Sprintf("tracing:\n  enabled: true\n  sample_ratio: %s\n", strconv.FormatFloat(sampleRatio, 'f', -1, 64))
	}
	return writeTemp(yaml)
}

// writeTemp writes a config to a temporary file and returns its path.
func writeTemp(yaml string) (string, error) {
	f, err := os.CreateTemp("", "throttle-e2e-*.yaml")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.WriteString(yaml); err != nil {
		return "", err
	}
	return f.Name(), nil
}

// profile runs throttle twice with the limit out of reach, on four times
// the messages of a measured run: once recording a CPU and an allocation
// profile of this process, once a block and a mutex profile (which slow
// the run down), into cfg.profileDir, named after the source; and the bare
// loop once under a CPU and an allocation profile (bare-cpu, bare-allocs),
// and with -e2e-layer throttle with the keyed layer too (layer-cpu,
// layer-allocs, and in a run of its own layer-block, layer-mutex),
// likewise with -e2e-dedupe, -e2e-window and -e2e-concurrency
// (dedupe-cpu, window-cpu, conc-cpu, ...), and with
// -e2e-readme throttle in the README's configuration without its layer
// (readme-plain-cpu, ...).
func (b *e2eBench) profile(ctx context.Context, src source) error {
	if err := os.MkdirAll(b.cfg.profileDir, 0o755); err != nil {
		return err
	}
	defer func() { b.onStart, b.onStop = nil, nil }()
	path := func(kind string) string { return filepath.Join(b.cfg.profileDir, src.name()+"-"+kind+".pprof") }
	n := 4 * b.cfg.messages
	b.cpuProfiled(path)
	r, err := b.run(ctx, src, consThrottle, 0, 1e6, 1_000_000, n)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%-9s throttle, CPU profile: %8.0f msg/s\n", src.name(), r.perSecond())
	// The bare loop under the same CPU and allocation profile, to compare
	// with.
	b.cpuProfiled(func(kind string) string { return path("bare-" + kind) })
	if r, err = b.run(ctx, src, consBare, 0, 1e6, 1_000_000, n); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%-9s bare, CPU profile: %8.0f msg/s\n", src.name(), r.perSecond())
	if b.cfg.layer {
		// throttle with the keyed layer (-e2e-layer), under the same
		// profiles (layer-cpu, layer-allocs).
		b.cpuProfiled(func(kind string) string { return path("layer-" + kind) })
		if r, err = b.run(ctx, src, consLayer, 0, 1e6, 1_000_000, n); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "%-9s throttle + layer, CPU profile: %8.0f msg/s\n", src.name(), r.perSecond())
	}
	for _, c := range []struct {
		on         bool
		name, kind string
	}{{b.cfg.dedupe, consDedupe, "dedupe"}, {b.cfg.window, consWindow, "window"}, {b.cfg.concurrency, consConc, "conc"},
		{b.cfg.readme, consReadmePlain, "readme-plain"}} {
		if !c.on {
			continue
		}
		// throttle with dedupe (-e2e-dedupe) or a send window
		// (-e2e-window), under the same profiles (dedupe-cpu,
		// window-allocs, ...).
		b.cpuProfiled(func(kind string) string { return path(c.kind + "-" + kind) })
		if r, err = b.run(ctx, src, c.name, 0, 1e6, 1_000_000, n); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "%-9s %s, CPU profile: %8.0f msg/s\n", src.name(), c.name, r.perSecond())
	}
	b.blockProfiled(func(kind string) string { return path(kind) })
	if r, err = b.run(ctx, src, consThrottle, 0, 1e6, 1_000_000, n); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%-9s throttle, block profile: %8.0f msg/s\n", src.name(), r.perSecond())
	if b.cfg.layer {
		// Where the keyed layer's handlers wait (layer-block,
		// layer-mutex).
		b.blockProfiled(func(kind string) string { return path("layer-" + kind) })
		if r, err = b.run(ctx, src, consLayer, 0, 1e6, 1_000_000, n); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "%-9s throttle + layer, block profile: %8.0f msg/s\n", src.name(), r.perSecond())
	}
	return nil
}

// blockProfiled makes the next run write a block and a mutex profile to
// path("block") and path("mutex"), from path("block-base") and
// path("mutex-base").
func (b *e2eBench) blockProfiled(path func(kind string) string) {
	b.onStart = func() error {
		// The block and mutex profiles count from the start of the
		// process: the bases let pprof -base show this run alone.
		if err := writeProfile("block", path("block-base")); err != nil {
			return err
		}
		if err := writeProfile("mutex", path("mutex-base")); err != nil {
			return err
		}
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
		runtime.SetMutexProfileFraction(5)
		return nil
	}
	b.onStop = func() error {
		runtime.SetBlockProfileRate(0)
		runtime.SetMutexProfileFraction(0)
		if err := writeProfile("block", path("block")); err != nil {
			return err
		}
		return writeProfile("mutex", path("mutex"))
	}
}

// cpuProfiled makes the next run write a CPU profile to path("cpu") and
// the allocations to path("allocs"), from path("allocs-base").
func (b *e2eBench) cpuProfiled(path func(kind string) string) {
	var cpu *os.File
	b.onStart = func() error {
		var err error
		if cpu, err = os.Create(path("cpu")); err != nil {
			return err
		}
		if err := writeProfile("allocs", path("allocs-base")); err != nil {
			return err
		}
		return pprof.StartCPUProfile(cpu)
	}
	b.onStop = func() error {
		pprof.StopCPUProfile()
		if err := cpu.Close(); err != nil {
			return err
		}
		return writeProfile("allocs", path("allocs"))
	}
}

func writeProfile(kind, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup(kind).WriteTo(f, 0)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// newSource returns the named scenario.
func newSource(ctx context.Context, name string, svc *services, cfg e2eConfig) (source, error) {
	switch name {
	case "rabbitmq":
		return newRabbitSource(ctx)
	case "kafka":
		return newKafkaSource(svc.Kafka, cfg.bareQueue, cfg.kafkaOrdering), nil
	}
	return nil, errors.New("unknown scenario " + name)
}
