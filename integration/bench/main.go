// Command bench compares four ways for replicas to share one token bucket in
// Redis: a tutorial-style Lua bucket, go-redis/redis_rate, and this
// repository's limiter without and with token leasing; and, as a fifth
// implementation, this repository's limiter with leasing plus one keyed
// layer over 100k keys, against the shared bucket alone.
//
// Each implementation runs on the same workloads, one after the other, with
// N simulated replicas (each its own Redis client and its own limiter, with
// several goroutines calling Wait in a loop) on a fresh bucket. For each it
// reports granted tokens per second, Redis calls per token (from INFO
// commandstats), accuracy, the busiest one-second window, each replica's
// share and the CPU used; then, in an unsaturated phase, the latency that
// Wait adds and its allocations. It writes a markdown report and a plot of
// the low-rate run.
//
// Run it from this directory:
//
//	cd integration/bench && go run . [flags]
//
// INFO counts every client of the Redis server, so other traffic on it adds
// noise to the Redis figures; the client-side count in parentheses is exact.
//
// With -e2e it runs the end-to-end comparison instead: `throttle run`
// (cli.Run, in process) against a bare amqp091 loop on RabbitMQ and a bare
// kafka-go loop on kfake, each into the same HTTP sink, alternating, and
// throttle alone with a limit in reach; -profile DIR adds CPU, allocation,
// block and mutex profiles of throttle runs. It needs RabbitMQ on
// 127.0.0.1:5672 and redis-server on the PATH (it starts its own, so that
// INFO counts the replica's calls only); the sink and kfake run in a child
// process (this binary with -serve-services). It writes E2E.md.
//
// With -e2e-concurrency it measures the cost of a concurrency layer
// (limit.extra `concurrency: 3` per key over 10,000 keys) instead: throttle
// alone against throttle with the layer, alternating, on each source.
//
// With -campaign D it runs the seeded fault campaign of
// integration/campaign for D of faults instead (docs/campaign.md): it
// builds the binary from -campaign-root, needs RabbitMQ and redis-server
// like -e2e, prints the schedule and the checker's report, and exits 1
// when a promise was broken; -seed N reruns a schedule.
//
// With -keys it runs the keyed-layer mode instead (keys.go): on a private
// redis-server and a private 3-master Cluster, the used_memory growth per
// key of a keyed layer over -keys-memory keys, and msg/s, Redis scripts,
// commands and CPU per message, and the spread over the masters, of
// replicas leasing the shared bucket with a keyed layer, into KEYS.md.
//
// With -scale it runs the scale mode instead (scale.go): for each rate of
// -scale-rates and each N of -scale-n, N replicas in this process, each
// with its own Redis client and Bucket, on a private redis-server; it
// measures the grants as callers receive them (the busiest 1 s window
// against rate + burst, shares, the worst single wait), the utilisation
// under unequal demand, the recovery after half the replicas vanish
// without Close, and Redis scripts and CPU per grant, into SCALE.md.
//
// With -fair SCENARIO it measures fair shares among tenants (fair.go,
// docs/fair.md) through `throttle run` replicas in process on RabbitMQ and
// a private redis-server: two (a backlog and a tenant at 5/s), weights
// (3:1:1), scale (10,000 tenants and one tenant's burst), memory (Redis
// bytes per active tenant) or waits (the others' waits in the limiter
// alone, around one tenant's burst), and prints the figures.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// workload is a bucket that every implementation is run on.
type workload struct {
	name  string
	rate  float64
	burst int
	// saturated workloads ask for more than the rate, so granted tokens
	// measure accuracy; the others measure the ceiling.
	saturated bool
}

// workloads are all the workloads, in table order.
var workloads = []workload{
	{"low", 50, 5, true},
	{"medium", 5000, 500, true},
	{"high", 500_000, 50_000, true},
	{"fast", 1e9, 1e9, false},
}

// config is the command line.
type config struct {
	redisAddr string
	duration  time.Duration
	latency   time.Duration
	// latencyRate is the rate (tokens/s) and burst of the latency runs'
	// bucket, far above their demand.
	latencyRate float64
	// latencyRounds is how many latency phases each implementation runs,
	// alternating the order.
	latencyRounds int
	// latencyPhases selects one latency phase per implementation and
	// round instead of the implementations called in turn by each caller
	// (measureLatencyInterleaved).
	latencyPhases bool
	// layerRounds is how many paired rounds of (c) and (e) measure the
	// keyed layer's ratio (fast workload).
	layerRounds int
	replicas    int
	goroutines  int
	workloads   []workload
	impls       []impl
	// opts are the limiter options of (c) and (d); zero means the
	// limiter's defaults.
	opts       limiter.Options
	out, plot  string
	cpuProfile string
	flags      string // the flags as given, for the report
	// e2e, when set, selects the end-to-end comparison instead.
	e2e *e2eConfig
	// campaign, when set, selects the seeded fault campaign instead.
	campaign *campaignConfig
	// scale, when set, selects the scale mode instead (scale.go).
	scale *scaleConfig
	// keys, when set, selects the keyed-layer mode instead (keys.go).
	keys *keysConfig
	// fair, when set, selects a fair-shares scenario instead (fair.go).
	fair *fairConfig
}

func main() {
	if len(os.Args) >= 2 && os.Args[1] == servicesFlag {
		if err := serveServices(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench services:", err)
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	switch {
	case cfg.campaign != nil:
		err = runCampaign(ctx, *cfg.campaign)
	case cfg.e2e != nil:
		err = runE2E(ctx, *cfg.e2e)
	case cfg.scale != nil:
		err = runScale(ctx, *cfg.scale)
	case cfg.keys != nil:
		err = runKeys(ctx, *cfg.keys)
	case cfg.fair != nil:
		err = runFair(ctx, *cfg.fair)
	default:
		err = run(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var cfg config
	var wl, im string
	fs.StringVar(&cfg.redisAddr, "redis", "127.0.0.1:6379", "Redis address")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "length of each saturated or ceiling run")
	fs.DurationVar(&cfg.latency, "latency", time.Second, "length of each unsaturated latency run")
	fs.IntVar(&cfg.latencyRounds, "latency-rounds", 3, "latency runs, merged")
	fs.BoolVar(&cfg.latencyPhases, "latency-phases", false, "time each implementation in a phase of its own, their order alternating from round to round, instead of calling them in turn within each replica")
	fs.Float64Var(&cfg.latencyRate, "latency-rate", 1e9, "rate and burst of the bucket of the latency runs")
	fs.IntVar(&cfg.layerRounds, "layer-rounds", 5, "paired rounds of (c) and (e) on the fast workload, alternating, for the keyed layer's ratio; 0 for none")
	fs.IntVar(&cfg.replicas, "replicas", 8, "simulated replicas")
	fs.IntVar(&cfg.goroutines, "goroutines", 8, "goroutines calling Wait in each replica")
	fs.StringVar(&wl, "workloads", "low,medium,high,fast", "comma-separated workloads to run; none for the latency table only")
	fs.StringVar(&im, "impls", "a,b,c,d,e", "comma-separated implementations to run")
	fs.StringVar(&cfg.out, "out", "RESULTS.md", "markdown report to write")
	fs.StringVar(&cfg.plot, "plot", "lowrate.png", "PNG plot of the low-rate run to write")
	fs.DurationVar(&cfg.opts.MaxReserve, "reserve", 0, "limiter.Options.MaxReserve of (c) and (d); 0 for the default")
	fs.DurationVar(&cfg.opts.HeartbeatInterval, "heartbeat", 0, "limiter.Options.HeartbeatInterval of (c) and (d); 0 for the default")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	var fair fairConfig
	fs.StringVar(&fair.scenario, "fair", "", "run a fair-shares scenario instead (fair.go): two, weights, scale, memory or waits")
	fs.IntVar(&fair.replicas, "fair-replicas", 2, "(fair) throttle run replicas in process")
	fs.Float64Var(&fair.rate, "fair-rate", 0, "(fair) the bucket's rate; 0: 50/s, 300/s for scale and waits")
	fs.IntVar(&fair.backlog, "fair-backlog", 0, "(fair) two: A's backlog (default 20,000); weights: the three tenants' backlogs together (default 9,000)")
	fs.DurationVar(&fair.runFor, "fair-for", time.Minute, "(fair) how long B sends (two), the window measured (weights), each phase (scale, waits)")
	fs.IntVar(&fair.tenants, "fair-tenants", 10_000, "(fair) scale, memory, waits: the tenants")
	fs.Float64Var(&fair.others, "fair-others", 0.5, "(fair) scale: the share of the rate the tenants send before the burst")
	fs.StringVar(&fair.amqpURL, "fair-amqp", rabbitURL, "(fair) RabbitMQ URL")
	var e2e e2eConfig
	var e2eOn bool
	var scenarios string
	fs.BoolVar(&e2eOn, "e2e", false, "run the end-to-end comparison (throttle run against bare client loops) instead")
	fs.IntVar(&e2e.messages, "e2e-messages", 30_000, "(e2e) messages per run with the limit out of reach")
	fs.IntVar(&e2e.rounds, "e2e-rounds", 3, "(e2e) runs of each consumer, alternating which goes first")
	fs.BoolVar(&e2e.layer, "e2e-layer", false, "(e2e) also run throttle with a keyed per-recipient layer (limit.extra) in each round")
	fs.BoolVar(&e2e.concurrency, "e2e-concurrency", false, "measure a concurrency layer's cost instead: throttle alone against throttle with `concurrency: 3` per key over 10,000 keys, alternating, no bare loop (implies -e2e; writes CONCURRENCY.md unless -e2e-out)")
	fs.BoolVar(&e2e.dedupe, "e2e-dedupe", false, "(e2e) also run throttle with delivery.dedupe (a claim and a mark in Redis per message) in each round")
	fs.BoolVar(&e2e.window, "e2e-window", false, "(e2e) also run throttle with a send window by number (limit.extra window, timezone e164, open all day) in each round")
	fs.BoolVar(&e2e.policy, "e2e-policy", false, "run the sending policy's cost instead: throttle alone, with delivery.dedupe and with a send window, alternating, no bare loop (implies -e2e, -e2e-dedupe, -e2e-window)")
	fs.BoolVar(&e2e.readme, "e2e-readme", false, "(e2e) also run throttle in README.md's configuration (\"Run the binary\": cost template, per-recipient layer, header, form body, defaults for the rest), and without its layer, in each round")
	fs.BoolVar(&e2e.tracing, "e2e-tracing", false, "(e2e) also run throttle with tracing on, at sample_ratio 1 and 0.01, exporting over OTLP/HTTP to the child process, in each round")
	fs.IntVar(&e2e.bareQueue, "e2e-bare-queue", 32, "(e2e) messages each worker of the bare Kafka loop queues of its own")
	fs.StringVar(&e2e.kafkaOrdering, "e2e-kafka-ordering", "partition", "(e2e) throttle's kafka.ordering: partition (16 workers), key (by recipient, '{{.JSON.to}}') or none, both with max_in_flight 100; the bare loop works each partition in order")
	fs.IntVar(&e2e.maxConns, "e2e-max-conns", 0, fmt.Sprintf("(e2e) throttle's sink.http.max_conns, in every configuration but README.md's (0: the default, %d)", httpsink.DefaultMaxConns))
	fs.DurationVar(&e2e.sinkLatency, "e2e-sink-latency", 0, "(e2e) how long the HTTP sink takes to answer each message, as a provider's API does (0: at once)")
	fs.Float64Var(&e2e.inReach, "e2e-rate", 5000, "(e2e) the limit of the run with the limit in reach")
	fs.DurationVar(&e2e.inReachFor, "e2e-reach-for", 5*time.Second, "(e2e) how long the run with the limit in reach lasts")
	fs.StringVar(&scenarios, "e2e-scenarios", "rabbitmq,kafka", "(e2e) comma-separated sources: rabbitmq, kafka")
	fs.StringVar(&e2e.out, "e2e-out", "E2E.md", "(e2e) markdown report to write")
	fs.StringVar(&e2e.profileDir, "profile", "", "(e2e) before the measured runs, profile one throttle run per source (CPU, allocs, block, mutex) into this directory")
	var camp campaignConfig
	fs.DurationVar(&camp.duration, "campaign", 0, "run the seeded fault campaign (integration/campaign, docs/campaign.md) with this long a fault schedule instead")
	fs.Int64Var(&camp.seed, "seed", 0, "(campaign) the schedule's seed; 0 for a random one, printed")
	fs.StringVar(&camp.root, "campaign-root", "../..", "(campaign) the throttle module to build the binary from")
	fs.StringVar(&camp.logDir, "campaign-logs", "", "(campaign) a directory to write each replica's log to at the end")
	fs.StringVar(&camp.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "(campaign) RabbitMQ")
	var sc scaleConfig
	var scaleOn bool
	var scaleNs, scaleRates, scalePh string
	fs.BoolVar(&scaleOn, "scale", false, "run the scale mode (N replicas, each its own client, on a private redis-server) instead")
	fs.StringVar(&scaleNs, "scale-n", "10,100,1000", "(scale) comma-separated replica counts")
	fs.StringVar(&scaleRates, "scale-rates", "1000,1000000", "(scale) comma-separated rates (tokens/s)")
	fs.Float64Var(&sc.burst, "scale-burst", 0.1, "(scale) the bucket's burst, in seconds of its rate")
	fs.StringVar(&scalePh, "scale-phases", strings.Join(scalePhases, ","), "(scale) comma-separated phases: saturated, unequal, recovery")
	fs.DurationVar(&sc.duration, "scale-duration", 6*time.Second, "(scale) length of the saturated and unequal phases, and of the recovery phase before the vanish")
	fs.DurationVar(&sc.recovery, "scale-recovery", 12*time.Second, "(scale) how long the recovery phase runs after half the replicas vanish")
	fs.IntVar(&sc.callers, "scale-callers", 3, "(scale) callers of each saturated replica")
	fs.StringVar(&sc.lease, "scale-lease", "auto", "(scale) leasing: auto (off below 100k/s, default options from it), on, off")
	fs.Float64Var(&sc.leaseCalls, "scale-lease-calls", 0, "(scale) limiter.LeaseOptions.Calls of every replica, the refills per second the fleet aims at (0: the default, 4000)")
	fs.StringVar(&sc.out, "scale-out", "SCALE.md", "(scale) markdown report to write")
	fs.StringVar(&sc.goroutines, "scale-goroutines", "", "(scale) write the goroutines 1.5 s into each saturated phase to this path prefix")
	var kc keysConfig
	var keysOn bool
	var keysK, keysN, keysRates, keysTopos string
	fs.BoolVar(&keysOn, "keys", false, "run the keyed-layer mode (memory per key, Redis calls and CPU per message, on a private redis-server and a private 3-master Cluster) instead")
	fs.IntVar(&kc.memory, "keys-memory", 1_000_000, "(keys) keys of the memory run; 0 for none")
	fs.StringVar(&keysK, "keys-k", "100000", "(keys) comma-separated distinct keys of the throughput runs")
	fs.StringVar(&keysN, "keys-n", "8", "(keys) comma-separated replica counts of the throughput runs")
	fs.StringVar(&keysRates, "keys-rates", "1000000", "(keys) comma-separated shared bucket rates of the throughput runs")
	fs.StringVar(&keysTopos, "keys-topologies", "standalone,cluster", "(keys) comma-separated: standalone, cluster")
	fs.IntVar(&kc.callers, "keys-callers", 64, "(keys) callers over all replicas")
	fs.DurationVar(&kc.duration, "keys-duration", 5*time.Second, "(keys) length of each throughput run")
	fs.IntVar(&kc.rounds, "keys-rounds", 3, "(keys) throughput rounds, alternating the topologies; 0 for none")
	fs.StringVar(&kc.out, "keys-out", "KEYS.md", "(keys) markdown report to write")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if keysOn {
		var err error
		if kc.keys, err = parseInts(keysK); err != nil {
			return config{}, fmt.Errorf("-keys-k: %w", err)
		}
		if kc.replicas, err = parseInts(keysN); err != nil {
			return config{}, fmt.Errorf("-keys-n: %w", err)
		}
		if kc.rates, err = parseRates(keysRates); err != nil {
			return config{}, fmt.Errorf("-keys-rates: %w", err)
		}
		kc.topos = strings.Split(keysTopos, ",")
		for _, a := range args {
			kc.flags += " " + a
		}
		cfg.keys = &kc
		return cfg, nil
	}
	for _, a := range args {
		cfg.flags += " " + a
	}
	if camp.duration != 0 {
		if camp.duration < 10*time.Second {
			return config{}, fmt.Errorf("-campaign must be at least 10s")
		}
		cfg.campaign = &camp
		return cfg, nil
	}
	if scaleOn {
		var err error
		if sc.ns, err = parseInts(scaleNs); err != nil {
			return config{}, fmt.Errorf("-scale-n: %w", err)
		}
		if sc.rates, err = parseRates(scaleRates); err != nil {
			return config{}, fmt.Errorf("-scale-rates: %w", err)
		}
		for ph := range strings.SplitSeq(scalePh, ",") {
			if indexOf(scalePhases, func(p string) bool { return p == ph }) < 0 {
				return config{}, fmt.Errorf("-scale-phases: unknown phase %q", ph)
			}
			sc.phases = append(sc.phases, ph)
		}
		if !(sc.burst > 0) || math.IsInf(sc.burst, 0) {
			return config{}, fmt.Errorf("-scale-burst must be a number of seconds above 0")
		}
		if sc.duration < 3*time.Second || sc.recovery < 2*time.Second || sc.callers < 1 {
			return config{}, fmt.Errorf("-scale-duration must be at least 3s, -scale-recovery at least 2s and -scale-callers at least 1")
		}
		if sc.lease != "auto" && sc.lease != "on" && sc.lease != "off" {
			return config{}, fmt.Errorf("-scale-lease must be auto, on or off")
		}
		sc.flags = cfg.flags
		sc.cpuProfile = cfg.cpuProfile
		cfg.scale = &sc
		return cfg, nil
	}
	if e2e.policy || e2e.concurrency {
		e2eOn = true
		outSet := false
		fs.Visit(func(f *flag.Flag) { outSet = outSet || f.Name == "e2e-out" })
		if e2e.policy {
			e2e.dedupe, e2e.window = true, true
			if !outSet {
				e2e.out = "POLICY.md"
			}
		} else if !outSet {
			e2e.out = "CONCURRENCY.md"
		}
	}
	if fair.scenario != "" {
		if fair.rate == 0 {
			fair.rate = 50
			if fair.scenario == "scale" || fair.scenario == "waits" {
				fair.rate = 300
			}
		}
		if fair.backlog == 0 {
			fair.backlog = 20_000
			if fair.scenario == "weights" {
				fair.backlog = 9_000
			}
		}
		if fair.replicas < 1 || fair.rate <= 0 || fair.runFor < time.Second || fair.tenants < 1 || fair.others <= 0 || fair.others >= 1 {
			return config{}, fmt.Errorf("-fair-replicas must be at least 1, -fair-rate above 0, -fair-for at least 1s, -fair-tenants at least 1, -fair-others within (0, 1)")
		}
		fair.flags = cfg.flags
		fair.cpuProfile = cfg.cpuProfile
		cfg.fair = &fair
		return cfg, nil
	}
	if e2eOn {
		e2e.flags = cfg.flags
		e2e.scenarios = strings.Split(scenarios, ",")
		for _, s := range e2e.scenarios {
			if s != "rabbitmq" && s != "kafka" {
				return config{}, fmt.Errorf("-e2e-scenarios: unknown source %q", s)
			}
		}
		if e2e.messages < 100 || e2e.rounds < 1 || e2e.inReach <= 0 || e2e.inReachFor < 2*time.Second {
			return config{}, fmt.Errorf("-e2e-messages must be at least 100, -e2e-rounds at least 1, -e2e-rate above 0 and -e2e-reach-for at least 2s")
		}
		if o := e2e.kafkaOrdering; o != "partition" && o != "key" && o != "none" {
			return config{}, fmt.Errorf("-e2e-kafka-ordering must be partition, key or none, not %q", o)
		}
		if e2e.bareQueue < 1 || e2e.maxConns < 0 || e2e.sinkLatency < 0 {
			return config{}, fmt.Errorf("-e2e-bare-queue must be at least 1, -e2e-max-conns and -e2e-sink-latency not negative")
		}
		cfg.e2e = &e2e
		return cfg, nil
	}
	if cfg.duration < time.Second || cfg.latency <= 0 || cfg.latencyRounds < 1 || cfg.layerRounds < 0 {
		return config{}, fmt.Errorf("-duration must be at least 1s, -latency above 0 and -latency-rounds at least 1")
	}
	if cfg.latencyRate < 1e4 || cfg.latencyRate > 1e9 {
		return config{}, fmt.Errorf("-latency-rate must be within [1e4, 1e9]")
	}
	if cfg.replicas < 1 || cfg.goroutines < 1 {
		return config{}, fmt.Errorf("-replicas and -goroutines must be at least 1")
	}
	for name := range strings.SplitSeq(wl, ",") {
		if name == "none" { // the latency table only
			continue
		}
		i := indexOf(workloads, func(w workload) bool { return w.name == name })
		if i < 0 {
			return config{}, fmt.Errorf("-workloads: unknown workload %q", name)
		}
		cfg.workloads = append(cfg.workloads, workloads[i])
	}
	for key := range strings.SplitSeq(im, ",") {
		i := indexOf(impls, func(m impl) bool { return m.key == key })
		if i < 0 {
			return config{}, fmt.Errorf("-impls: unknown implementation %q", key)
		}
		cfg.impls = append(cfg.impls, impls[i])
	}
	return cfg, nil
}

func indexOf[T any](s []T, f func(T) bool) int {
	for i, v := range s {
		if f(v) {
			return i
		}
	}
	return -1
}

// run measures every workload and implementation, then writes the report.
func run(ctx context.Context, cfg config) error {
	admin := redis.NewClient(&redis.Options{Addr: cfg.redisAddr})
	defer admin.Close()
	if err := admin.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("connecting to Redis at %s: %w", cfg.redisAddr, err)
	}
	machine, err := describeMachine(ctx, admin)
	if err != nil {
		return err
	}
	load0 := loadAverage()
	stopProfile, err := startCPUProfile(cfg.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	b := &bench{cfg: cfg, admin: admin, runID: randomID()}
	var rep report
	rep.cfg, rep.machine = cfg, machine
	for _, w := range cfg.workloads {
		for _, im := range cfg.impls {
			r, err := b.measure(ctx, w, im)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", w.name, im.name, err)
			}
			fmt.Fprintf(os.Stderr, "%-7s %-44s %12.0f granted/s\n", w.name, im.name, r.perSecond())
			rep.results = append(rep.results, r)
		}
	}
	if rep.layerPairs, err = b.measureLayerPairs(ctx, cfg.layerRounds); err != nil {
		return fmt.Errorf("keyed layer rounds: %w", err)
	}
	measureLatency := b.measureLatencyInterleaved
	if cfg.latencyPhases {
		measureLatency = b.measureLatency
	}
	if rep.latencies, err = measureLatency(ctx, cfg.impls, cfg.latencyRounds); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	for _, l := range rep.latencies {
		fmt.Fprintf(os.Stderr, "latency %-44s p25 %v p50 %v p90 %v p99 %v\n", l.im.name, l.p25, l.p50, l.p90, l.p99)
	}
	if rep.leaseAllocs, err = b.leaseAllocs(ctx); err != nil {
		return fmt.Errorf("lease allocations: %w", err)
	}

	rep.load = fmt.Sprintf("%s at the start, %s at the end", load0, loadAverage())
	md := rep.markdown()
	fmt.Print(md)
	if err := os.WriteFile(cfg.out, []byte(md), 0o644); err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	if low := rep.byWorkload("low"); len(low) > 0 && cfg.plot != "" {
		if err := plotLow(cfg.plot, low, cfg.goroutines); err != nil {
			return fmt.Errorf("writing plot: %w", err)
		}
	}
	return nil
}

func randomID() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// startCPUProfile writes a CPU profile to path until stop is called; with
// an empty path it does nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting CPU profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
