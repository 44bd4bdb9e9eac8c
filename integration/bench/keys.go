package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// keysConfig is the -keys mode: what keyed layers cost Redis, on a private
// redis-server and on a private 3-master Cluster.
type keysConfig struct {
	memory   int           // keys of the memory run
	keys     []int         // distinct keys of the throughput runs
	replicas []int         // replicas (each its own client and Bucket) of the throughput runs
	rates    []float64     // shared bucket rates of the throughput runs
	callers  int           // callers over all replicas
	duration time.Duration // each throughput run
	rounds   int           // throughput rounds, alternating the topologies
	topos    []string      // standalone, cluster
	out      string
	flags    string
}

// keysBucketName is the bucket of every -keys run: 38 characters, as in
// TestLayerKeyMemory's figures.
const keysBucketName = "bench-keys-0123456789abcdef0123456789a"

// topology is a private Redis: one server or a Cluster of three masters.
type topology struct {
	name   string
	client redis.UniversalClient
	// masters are one client per master (one for a single server), for
	// INFO.
	masters []*redis.Client
	stop    func()
	// newClient returns a client of its own (one per replica).
	newClient func() redis.UniversalClient
}

func startTopology(ctx context.Context, name string) (*topology, error) {
	switch name {
	case "standalone":
		srv, err := startRedis(ctx)
		if err != nil {
			return nil, err
		}
		mk := func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 64}) }
		return &topology{name: name, client: mk(), masters: []*redis.Client{redis.NewClient(&redis.Options{Addr: srv.addr})}, stop: srv.stop, newClient: mk}, nil
	case "cluster":
		return startCluster(ctx)
	}
	return nil, fmt.Errorf("unknown topology %q", name)
}

func (t *topology) close() {
	t.client.Close()
	for _, m := range t.masters {
		m.Close()
	}
	t.stop()
}

// startCluster starts three redis-servers with cluster-enabled and joins
// them as three masters without replicas (redis-cli --cluster create).
func startCluster(ctx context.Context) (*topology, error) {
	dir, err := os.MkdirTemp("", "bench-cluster-")
	if err != nil {
		return nil, err
	}
	var cmds []*exec.Cmd
	var addrs []string
	stop := func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		os.RemoveAll(dir)
	}
	freePort := func() (int, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port, nil
	}
	for i := range 3 {
		port, err := freePort()
		if err != nil {
			stop()
			return nil, err
		}
		bus, err := freePort()
		if err != nil {
			stop()
			return nil, err
		}
		nd := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(nd, 0o755); err != nil {
			stop()
			return nil, err
		}
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning", "--dir", nd,
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000",
			"--cluster-port", strconv.Itoa(bus))
		if err := cmd.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("starting redis-server: %w", err)
		}
		cmds = append(cmds, cmd)
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(port))
	}
	masters := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		masters[i] = redis.NewClient(&redis.Options{Addr: a})
		deadline := time.Now().Add(10 * time.Second)
		for masters[i].Ping(ctx).Err() != nil {
			if time.Now().After(deadline) {
				stop()
				return nil, fmt.Errorf("redis-server on %s does not answer", a)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, m := range masters {
		for {
			info, err := m.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				stop()
				return nil, fmt.Errorf("%s never reported cluster_state:ok", m.Options().Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	mk := func() redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	}
	return &topology{name: "cluster", client: mk(), masters: masters, stop: stop, newClient: mk}, nil
}

// infoInt returns the integer field of INFO section on c.
func infoInt(ctx context.Context, c *redis.Client, section, field string) (int64, error) {
	txt, err := c.Info(ctx, section).Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(txt, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in INFO %s", field, section)
}

// keysMemory is the memory run on one topology.
type keysMemory struct {
	topo      string
	keys      int
	bytes     int64   // used_memory growth, all masters
	perMaster []int64 // keys per master
	sample    string  // one key's name and MEMORY USAGE
	took      time.Duration
}

// measureKeysMemory charges n distinct keys of a per-recipient layer
// (5/h, burst 5: each key lives 12 minutes) once each, the way a leased
// message does (the keyed layer alone), and reads the growth of
// used_memory over every master.
func measureKeysMemory(ctx context.Context, t *topology, n int) (keysMemory, error) {
	for _, m := range t.masters {
		if err := m.FlushAll(ctx).Err(); err != nil {
			return keysMemory{}, err
		}
	}
	s, err := redislimiter.New(t.client, redislimiter.Config{Bucket: keysBucketName, Rate: 1e9, Burst: 1e9})
	if err != nil {
		return keysMemory{}, err
	}
	l, err := s.WithLayers([]limiter.Layer{{Name: "per-recipient", Keyed: true, Rate: 5.0 / 3600, Burst: 5}})
	if err != nil {
		return keysMemory{}, err
	}
	// One take first, so that the scripts are loaded before the count.
	if _, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, SkipShared: true, Keys: map[string]string{"per-recipient": "warm"}}); err != nil {
		return keysMemory{}, err
	}
	var before int64
	for _, m := range t.masters {
		v, err := infoInt(ctx, m, "memory", "used_memory")
		if err != nil {
			return keysMemory{}, err
		}
		before += v
	}
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, SkipShared: true, Keys: map[string]string{"per-recipient": fmt.Sprintf("+1555%07d", i)}})
				if err == nil && !res.Granted {
					err = fmt.Errorf("key %d not granted: %+v", i, res)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return keysMemory{}, err
	}
	out := keysMemory{topo: t.name, keys: n, took: time.Since(start)}
	for _, m := range t.masters {
		v, err := infoInt(ctx, m, "memory", "used_memory")
		if err != nil {
			return keysMemory{}, err
		}
		out.bytes += v
		size, err := m.DBSize(ctx).Result()
		if err != nil {
			return keysMemory{}, err
		}
		out.perMaster = append(out.perMaster, size)
	}
	out.bytes -= before
	// One key's name as Redis holds it, and MEMORY USAGE of it.
	for _, m := range t.masters {
		k, err := m.RandomKey(ctx).Result()
		if err != nil {
			continue
		}
		mu, _ := m.MemoryUsage(ctx, k).Result()
		out.sample = fmt.Sprintf("%q, MEMORY USAGE %d", k, mu)
		break
	}
	for _, m := range t.masters {
		_ = m.FlushAll(ctx).Err()
	}
	return out, nil
}

// keysRun is one throughput run.
type keysRun struct {
	topo               string
	keys, replicas     int
	rate               float64
	msgs               int64
	d                  time.Duration
	scripts, cmds      int64 // over every master
	cpu                time.Duration
	scriptsPerMaster   []int64 // EVAL/EVALSHA per master
	keyedPerMaster     []int64 // keys per master at the end
	leaseCallsPerMsg   float64
	processCPUPerMsgUS float64
}

func (r keysRun) perSecond() float64 { return float64(r.msgs) / r.d.Seconds() }

// measureKeysRun runs replicas Buckets (each with its own client), leasing
// on, callers in all, each message the next of keys keys of a keyed layer
// (1000/s, burst 1000: never the limit), for d, and reads Redis's counters
// over every master.
func measureKeysRun(ctx context.Context, t *topology, keys, replicas int, rate float64, callers int, d time.Duration, round int) (keysRun, error) {
	name := fmt.Sprintf("%s-%d-%d-%d-%d", keysBucketName[:10], keys, replicas, int(rate), round)
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("+1555%07d", i)
	}
	var buckets []*limiter.Bucket
	var clients []redis.UniversalClient
	defer func() {
		for _, b := range buckets {
			b.Close()
		}
		for _, c := range clients {
			c.Close()
		}
	}()
	for range replicas {
		c := t.newClient()
		clients = append(clients, c)
		s, err := redislimiter.New(c, redislimiter.Config{Bucket: name, Rate: rate, Burst: max(1, int(rate/10))})
		if err != nil {
			return keysRun{}, err
		}
		l, err := s.WithLayers([]limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000}})
		if err != nil {
			return keysRun{}, err
		}
		b, err := limiter.New(l, limiter.Options{})
		if err != nil {
			return keysRun{}, err
		}
		buckets = append(buckets, b)
	}
	// Warm up: every replica's heartbeat, the scripts on every master.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	for i, b := range buckets {
		if err := b.WaitN(wctx, limiter.Request{Cost: 1, Keys: map[string]string{"per-key": names[i%keys]}}); err != nil {
			cancel()
			return keysRun{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	cancel()
	time.Sleep(500 * time.Millisecond)
	before, err := topoStats(ctx, t)
	if err != nil {
		return keysRun{}, err
	}
	var seq, msgs atomic.Int64
	rctx, stop := context.WithTimeout(ctx, d)
	defer stop()
	start := time.Now()
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for c := range callers {
		b := buckets[c%replicas]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil {
				k := names[seq.Add(1)%int64(keys)]
				if err := b.WaitN(rctx, limiter.Request{Cost: 1, Keys: map[string]string{"per-key": k}}); err != nil {
					if rctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
					}
					return
				}
				msgs.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if e, _ := firstErr.Load().(error); e != nil {
		return keysRun{}, e
	}
	after, err := topoStats(ctx, t)
	if err != nil {
		return keysRun{}, err
	}
	r := keysRun{topo: t.name, keys: keys, replicas: replicas, rate: rate, msgs: msgs.Load(), d: elapsed}
	for i := range after {
		r.scripts += after[i].scripts - before[i].scripts
		r.cmds += after[i].cmds - before[i].cmds
		r.cpu += after[i].cpu - before[i].cpu
		r.scriptsPerMaster = append(r.scriptsPerMaster, after[i].scripts-before[i].scripts)
	}
	return r, nil
}

func topoStats(ctx context.Context, t *topology) ([]redisStats, error) {
	var out []redisStats
	for _, m := range t.masters {
		s, err := readRedisStats(ctx, m)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// spread returns the least and the most of v over their mean.
func spread(v []int64) (lo, hi float64) {
	var sum int64
	for _, x := range v {
		sum += x
	}
	if sum == 0 || len(v) == 0 {
		return 0, 0
	}
	mean := float64(sum) / float64(len(v))
	lo, hi = float64(v[0])/mean, float64(v[0])/mean
	for _, x := range v[1:] {
		lo, hi = min(lo, float64(x)/mean), max(hi, float64(x)/mean)
	}
	return lo, hi
}

func runKeys(ctx context.Context, cfg keysConfig) error {
	load0 := loadAverage()
	redis.SetLogger(quietLogger{})
	topos := map[string]*topology{}
	for _, name := range cfg.topos {
		t, err := startTopology(ctx, name)
		if err != nil {
			return err
		}
		defer t.close()
		topos[name] = t
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Keyed layers: memory, Redis calls and CPU per message\n\n`go run .%s`\n\n", cfg.flags)
	if cfg.memory > 0 {
		fmt.Fprintf(&b, "Memory: %d keys of a per-recipient layer (5/h, burst 5), each charged once as a leased message is (the keyed layer alone), 64 callers; bucket name of %d characters.\n\n", cfg.memory, len(keysBucketName))
		b.WriteString("| topology | used_memory growth per key | keys per master | a key | filled in |\n|---|--:|---|---|--:|\n")
		for _, name := range cfg.topos {
			fmt.Fprintf(os.Stderr, "keys: memory, %s, %d keys...\n", name, cfg.memory)
			m, err := measureKeysMemory(ctx, topos[name], cfg.memory)
			if err != nil {
				return fmt.Errorf("memory on %s: %w", name, err)
			}
			line := fmt.Sprintf("| %s | **%.1f B** | %v | %s | %v |\n", name, float64(m.bytes)/float64(m.keys), m.perMaster, m.sample, m.took.Round(100*time.Millisecond))
			fmt.Fprint(os.Stderr, line)
			b.WriteString(line)
		}
		fmt.Fprintf(&b, "\nload average %s\n\n", loadAverage())
	}
	if cfg.rounds > 0 {
		fmt.Fprintf(&b, "Throughput: leasing on (defaults), a keyed layer (1000/s, burst 1000 per key: never the limit) over K keys taken in turn, %d callers over N replicas (each its own client and Bucket), %v per run, %d rounds alternating the topologies; medians. Scripts and CPU are Redis's, summed over the masters.\n\n", cfg.callers, cfg.duration, cfg.rounds)
		b.WriteString("| topology | N | K | shared rate/s | msg/s (rounds) | scripts/msg | Redis commands/msg | Redis CPU µs/msg | scripts per master (min–max of mean) |\n|---|--:|--:|--:|---|--:|--:|--:|---|\n")
		for _, keys := range cfg.keys {
			for _, n := range cfg.replicas {
				for _, rate := range cfg.rates {
					runs := map[string][]keysRun{}
					for round := range cfg.rounds {
						order := cfg.topos
						if round%2 == 1 {
							order = reverse(order)
						}
						for _, name := range order {
							fmt.Fprintf(os.Stderr, "keys: %s K=%d N=%d rate=%v round %d...\n", name, keys, n, rate, round)
							r, err := measureKeysRun(ctx, topos[name], keys, n, rate, cfg.callers, cfg.duration, round)
							if err != nil {
								return fmt.Errorf("%s K=%d N=%d: %w", name, keys, n, err)
							}
							fmt.Fprintf(os.Stderr, "  %.0f msg/s, %.3f scripts/msg, %.1f µs Redis CPU/msg, per master %v\n", r.perSecond(), float64(r.scripts)/float64(r.msgs), float64(r.cpu.Microseconds())/float64(r.msgs), r.scriptsPerMaster)
							runs[name] = append(runs[name], r)
						}
					}
					for _, name := range cfg.topos {
						rs := runs[name]
						med := medianRun(rs)
						var all []string
						for _, r := range rs {
							all = append(all, fmt.Sprintf("%.0f", r.perSecond()))
						}
						lo, hi := spread(med.scriptsPerMaster)
						sp := "one server"
						if len(med.scriptsPerMaster) > 1 {
							sp = fmt.Sprintf("%v (%.2f–%.2f)", med.scriptsPerMaster, lo, hi)
						}
						fmt.Fprintf(&b, "| %s | %d | %d | %s | **%.0f** (%s) | %.3f | %.2f | %.1f | %s |\n", name, n, keys, fmtRate(rate), med.perSecond(), strings.Join(all, ", "),
							float64(med.scripts)/float64(med.msgs), float64(med.cmds)/float64(med.msgs), float64(med.cpu.Microseconds())/float64(med.msgs), sp)
					}
				}
			}
		}
	}
	fmt.Fprintf(&b, "\nload average %s at the start, %s at the end\n", load0, loadAverage())
	fmt.Print(b.String())
	return os.WriteFile(cfg.out, []byte(b.String()), 0o644)
}

func reverse(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

// medianRun returns the run of median throughput.
func medianRun(rs []keysRun) keysRun {
	sorted := append([]keysRun(nil), rs...)
	for i := range sorted {
		for j := i + 1; j < len(sorted); j++ {
			if sorted[j].perSecond() < sorted[i].perSecond() {
				sorted[i], sorted[j] = sorted[j], sorted[i]
			}
		}
	}
	return sorted[len(sorted)/2]
}
