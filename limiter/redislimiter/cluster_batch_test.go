package redislimiter

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// testCluster is a private Redis Cluster of three masters without
// replicas.
type testCluster struct {
	client  *redis.ClusterClient
	masters []*redis.Client // one client per master, in start order
	ids     []string        // their node IDs
}

// privateCluster starts three cluster-enabled redis-servers of this
// test's own on free loopback ports, joins them with `redis-cli --cluster
// create` and waits until each reports cluster_state:ok. The servers go
// with the test.
func privateCluster(t testing.TB) *testCluster {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Missing(t, "redis-server", "install redis", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		testenv.Missing(t, "redis-cli", "install redis", err)
	}
	freePort := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}
	// start starts node i on ports found free and returns its client,
	// or nil when the server exited first: another process took a port
	// in between (both ports are picked again then, up to 5 times).
	start := func(i, attempt int) *redis.Client {
		dir := t.TempDir()
		port := freePort()
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+strconv.Itoa(i)+".conf",
			"--cluster-node-timeout", "5000", "--cluster-port", strconv.Itoa(freePort()), "--loglevel", "warning")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		m := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), MaxRetries: -1})
		t.Cleanup(func() { m.Close() })
		testenv.Eventually(t, 10*time.Second, m.Options().Addr+" answering", func() bool {
			select {
			case <-exited:
				return true
			default:
				return m.Ping(context.Background()).Err() == nil
			}
		})
		select {
		case <-exited:
			if !strings.Contains(out.String(), "Address already in use") || attempt == 5 {
				t.Fatalf("redis-server on port %d exited:\n%s", port, out.String())
			}
			return nil
		default:
			return m
		}
	}
	c := &testCluster{}
	var addrs []string
	for i := range 3 {
		var m *redis.Client
		for attempt := 1; m == nil; attempt++ {
			m = start(i, attempt)
		}
		addrs = append(addrs, m.Options().Addr)
		c.masters = append(c.masters, m)
		c.ids = append(c.ids, m.ClusterMyID(context.Background()).Val())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, m := range c.masters {
		testenv.Eventually(t, 20*time.Second, m.Options().Addr+" reporting cluster_state:ok", func() bool {
			info, err := m.ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
	}
	c.client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { c.client.Close() })
	// Every node must agree on the slots before the client learns them.
	testenv.Eventually(t, 20*time.Second, "the client seeing three masters", func() bool {
		var n atomic.Int32 // ForEachMaster calls fn concurrently
		err := c.client.ForEachMaster(context.Background(), func(context.Context, *redis.Client) error { n.Add(1); return nil })
		return err == nil && n.Load() == 3
	})
	return c
}

// withNewClient returns c with a cluster client of its own, closed when
// the test ends.
func (c *testCluster) withNewClient(t testing.TB) *testCluster {
	var addrs []string
	for _, m := range c.masters {
		addrs = append(addrs, m.Options().Addr)
	}
	n := *c
	n.client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { n.client.Close() })
	return &n
}

// master returns the index of the master that holds key now, as the
// nodes' slot map has it (not the client's).
func (c *testCluster) master(t testing.TB, key string) int {
	t.Helper()
	ctx := context.Background()
	slot := c.masters[0].ClusterKeySlot(ctx, key).Val()
	slots, err := c.masters[0].ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			for i, id := range c.ids {
				if s.Nodes[0].ID == id {
					return i
				}
			}
		}
	}
	t.Fatalf("no master holds %q", key)
	return -1
}

// moveSlot moves the slot of Redis key key, with its keys, from master from to
// master to, the way redis-cli --cluster reshard does: IMPORTING,
// MIGRATING, MIGRATE, then SETSLOT NODE on every master. The cluster
// client is not told: its slot map still names from.
func (c *testCluster) moveSlot(t *testing.T, key string, from, to int) {
	t.Helper()
	slot := c.migrate(t, key, from, to)
	for _, m := range []*redis.Client{c.masters[to], c.masters[from], c.masters[3-from-to]} {
		if err := m.Do(context.Background(), "CLUSTER", "SETSLOT", slot, "NODE", c.ids[to]).Err(); err != nil {
			t.Fatalf("moving slot %d: %v", slot, err)
		}
	}
}

// migrate starts moving the slot of Redis key key from master from to
// master to, and moves its keys, but leaves the slot from's: from answers
// ASK for a key it no longer has. It returns the slot.
func (c *testCluster) migrate(t *testing.T, key string, from, to int) int64 {
	t.Helper()
	ctx := context.Background()
	src, dst := c.masters[from], c.masters[to]
	slot := src.ClusterKeySlot(ctx, key).Val()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("moving slot %d: %v", slot, err)
		}
	}
	must(dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", c.ids[from]).Err())
	must(src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", c.ids[to]).Err())
	keys, err := src.ClusterGetKeysInSlot(ctx, int(slot), 1000).Result()
	must(err)
	if len(keys) > 0 {
		host, port, _ := net.SplitHostPort(dst.Options().Addr)
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(src.Do(ctx, args...).Err())
	}
	return slot
}

// scriptCalls returns the calls of EVALSHA and EVAL on each master since
// the last CONFIG RESETSTAT (INFO commandstats).
func (c *testCluster) scriptCalls(t testing.TB) []int64 {
	t.Helper()
	out := make([]int64, len(c.masters))
	for i, m := range c.masters {
		info, err := m.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
					n, _ := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
					out[i] += n
				}
			}
		}
	}
	return out
}

// usedCPU returns the CPU time the masters have used (used_cpu_user and
// used_cpu_sys of INFO cpu, summed).
func (c *testCluster) usedCPU(t testing.TB) time.Duration {
	t.Helper()
	var sec float64
	for _, m := range c.masters {
		info, err := m.Info(context.Background(), "cpu").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
					x, _ := strconv.ParseFloat(v, 64)
					sec += x
				}
			}
		}
	}
	return time.Duration(sec * float64(time.Second))
}

func (c *testCluster) resetStats(t testing.TB) {
	t.Helper()
	for _, m := range c.masters {
		if err := m.ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// clusterKeyed returns a Layered of its own bucket on c's client with
// layer, its only layer: a Cluster batch's step (clusterStep).
func clusterKeyed(t testing.TB, c *testCluster, layer limiter.Layer) *Layered {
	t.Helper()
	s, err := New(c.client, Config{Bucket: fmt.Sprintf("test-%d", time.Now().UnixNano()), Rate: 1000, Burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.WithLayers([]limiter.Layer{layer})
	if err != nil {
		t.Fatal(err)
	}
	if l.batch == nil || l.clusterStep == nil {
		t.Fatal("no Cluster batch for a single keyed layer")
	}
	return l
}

// pendings returns one leased request (SkipShared) per key, of cost 1,
// ready for the batcher's send; with a holder, the i-th request's holder is
// holder-i.
func pendings(t testing.TB, l *Layered, holder string, keys ...string) []*layerPending {
	t.Helper()
	out := make([]*layerPending, len(keys))
	for i, k := range keys {
		req := backend.LayerRequest{Cost: 1, SkipShared: true, Keys: map[string]string{l.layers[0].Name: k}}
		if holder != "" {
			req.Holder = fmt.Sprint(holder, "-", i)
		}
		ks, err := backend.LayerKeys(l.layers, req)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = &layerPending{req: req, keys: ks}
	}
	return out
}

// masterOf returns the index of the master that holds the state of
// request q now.
func (c *testCluster) masterOf(t *testing.T, l *Layered, q *layerPending) int {
	t.Helper()
	loc, _ := l.bucketLoc(0, q.keys[0])
	return c.master(t, loc)
}

// TestClusterBatch runs a Layered's batches on a private 3-master Cluster:
// a batch sends one script call per master, decides as one call per
// request does, and falls back to one call per request, deciding each
// request once, when a slot has moved behind the client's back.
func TestClusterBatch(t *testing.T) {
	t.Parallel()
	c := privateCluster(t)
	ctx := context.Background()
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = fmt.Sprintf("+4420%06d", i)
	}

	t.Run("one call per master", func(t *testing.T) {
		l := clusterKeyed(t, c, limiter.Layer{Name: "per-key", Keyed: true, Rate: 100, Burst: 100})
		l.batch.send(ctx, pendings(t, l, "", keys...), nil) // loads the scripts
		c.resetStats(t)
		batch := pendings(t, l, "", keys...)
		per := make([]int, 3)
		for _, q := range batch {
			per[c.masterOf(t, l, q)]++
		}
		l.batch.send(ctx, batch, nil)
		if got := c.scriptCalls(t); fmt.Sprint(got) != "[1 1 1]" {
			t.Errorf("script calls per master %v for %v requests per master, want one each", got, per)
		}
		for i, q := range batch {
			if q.err != nil || !q.res.Granted {
				t.Errorf("request %d: %+v, %v; want granted", i, q.res, q.err)
			}
		}
	})

	// Charges of keys on every master, one call per shard.
	t.Run("charge", func(t *testing.T) {
		storetest.RunChargeLayers(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.ChargeClockedStore {
			return clockedLayers{newLayered(t, c.client, rate, burst, layers)}
		})
	})

	// Masters that lost the scripts: each charge runs again with its
	// script loaded, once.
	t.Run("charge after NOSCRIPT", func(t *testing.T) {
		l := clusterKeyed(t, c, limiter.Layer{Name: "per-key", Keyed: true, Rate: 1, Burst: 5})
		for _, m := range c.masters {
			if err := m.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		charges := make([]backend.LayerCharge, len(keys))
		for i, k := range keys {
			charges[i] = backend.LayerCharge{Layer: "per-key", Key: k, Tokens: 2}
		}
		if err := l.ChargeLayers(ctx, charges); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			st, err := l.LayerStatus(ctx, "per-key", k)
			if err != nil {
				t.Fatal(err)
			}
			if st.Tokens > 3.1 || st.Tokens < 2.9 {
				t.Fatalf("per-key %s after a charge of 2 = %v tokens, want about 3 (charged once)", k, st.Tokens)
			}
		}
	})

	// A master that lost the scripts (a restart, SCRIPT FLUSH): the
	// batch loads them and decides every request.
	t.Run("NOSCRIPT", func(t *testing.T) {
		l := clusterKeyed(t, c, limiter.Layer{Name: "per-key", Keyed: true, Rate: 100, Burst: 100})
		l.batch.send(ctx, pendings(t, l, "", keys...), nil)
		for _, m := range c.masters {
			if err := m.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		batch := pendings(t, l, "", keys...)
		l.batch.send(ctx, batch, nil)
		for i, q := range batch {
			if q.err != nil || !q.res.Granted {
				t.Errorf("request %d: %+v, %v; want granted", i, q.res, q.err)
			}
		}
	})

	// A master that cannot compile the flagged script (a Redis before 7
	// reads no shebang; here a body that does not compile): the batch
	// decides every request one call each, and from then on sends no
	// call per master.
	t.Run("script not compiled", func(t *testing.T) {
		l := clusterKeyed(t, c, limiter.Layer{Name: "per-key", Keyed: true, Rate: 100, Burst: 100})
		l.batch.byMaster = redis.NewScript("return (")
		batch := pendings(t, l, "", keys...)
		l.batch.send(ctx, batch, nil)
		for i, q := range batch {
			if q.err != nil || !q.res.Granted {
				t.Fatalf("request %d: %+v, %v; want granted", i, q.res, q.err)
			}
		}
		if !l.noCrossSlot.Load() {
			t.Fatal("one call per master still on")
		}
		c.resetStats(t)
		l.batch.send(ctx, pendings(t, l, "", keys...), nil)
		var calls int64
		for _, n := range c.scriptCalls(t) {
			calls += n
		}
		if calls != int64(len(keys)) {
			t.Errorf("%d script calls for %d requests, want one each", calls, len(keys))
		}
	})

	// The same requests, at the same instants, batched by master on one
	// bucket and one call each on another: the same results and states.
	// Some keys come twice or more in a batch; the bucket refuses past its
	// burst, the concurrency layer past its limit.
	for _, layer := range []limiter.Layer{
		{Name: "per-key", Keyed: true, Rate: 2, Burst: 3, OnExceed: limiter.ActionDeadLetter, MaxWait: 800 * time.Millisecond},
		{Name: "per-key", Keyed: true, Rate: 2, Burst: 3, OnExceed: limiter.ActionWait},
		{Name: "slots", Keyed: true, Concurrency: 2, Lease: time.Second, OnExceed: limiter.ActionDeadLetter},
	} {
		t.Run("same as each request "+layer.Name+" "+string(layer.OnExceed), func(t *testing.T) {
			grouped, each := clusterKeyed(t, c, layer), clusterKeyed(t, c, layer)
			at := time.UnixMicro(1_800_000_000_000_000)
			outcomes := map[string]int{}
			for step := range 12 {
				at = at.Add(time.Duration(step%4) * 150 * time.Millisecond)
				var ks []string
				for i := range 20 {
					ks = append(ks, keys[(step*7+i*i)%10])
				}
				holder := fmt.Sprint("h", step)
				a, b := pendings(t, grouped, holder, ks...), pendings(t, each, holder, ks...)
				if rest := grouped.batch.sendByMaster(ctx, at, c.client, c.client.Pipeline(), nil, a); len(rest) > 0 {
					t.Fatalf("step %d: %d requests not run", step, len(rest))
				}
				each.batch.sendEach(ctx, at, c.client.Pipeline(), nil, b)
				for i := range a {
					g, w := a[i], b[i]
					if fmt.Sprint(g.err) != fmt.Sprint(w.err) || g.res.Granted != w.res.Granted || g.res.Wait != w.res.Wait ||
						g.res.Limiting != w.res.Limiting || !g.res.At.Equal(w.res.At) || fmt.Sprint(g.res.Exceeded) != fmt.Sprint(w.res.Exceeded) {
						t.Fatalf("step %d request %d (%s):\n got %+v, %v\nwant %+v, %v", step, i, ks[i], g.res, g.err, w.res, w.err)
					}
					switch {
					case g.err != nil:
						outcomes["error"]++
					case g.res.Exceeded != nil:
						outcomes["refused"]++
					case g.res.Granted:
						outcomes["granted"]++
					default:
						outcomes["not granted"]++
					}
				}
				for _, k := range ks[:10] {
					sa, err := grouped.layerStatus(ctx, at, layer.Name, k)
					if err != nil {
						t.Fatal(err)
					}
					sb, err := each.layerStatus(ctx, at, layer.Name, k)
					if err != nil {
						t.Fatal(err)
					}
					if fmt.Sprintf("%+v", sa) != fmt.Sprintf("%+v", sb) {
						t.Fatalf("step %d key %s: %+v, one call each %+v", step, k, sa, sb)
					}
				}
			}
			if outcomes["granted"] == 0 || outcomes["refused"]+outcomes["not granted"] == 0 {
				t.Errorf("outcomes %v, want grants and others", outcomes)
			}
		})
	}

	// A slot moves behind the client's back, twice: the batch finds a key
	// gone from the master its slot map names, in the middle of that
	// master's requests, then first (the call is MOVED). Each time every
	// request is answered, granted, and charged once (its key's tokens).
	t.Run("slot moved", func(t *testing.T) {
		// A client of its own, whose slot map is fresh: go-redis reloads
		// a map 10 s old by itself, which would learn the moves.
		c := c.withNewClient(t)
		l := clusterKeyed(t, c, limiter.Layer{Name: "per-key", Keyed: true, Rate: 0.001, Burst: 10, OnExceed: limiter.ActionDeadLetter})
		// Every master knows both scripts: a NOSCRIPT would count calls.
		for _, s := range []*redis.Script{layersKeyedScript, layersKeyedClusterScript} {
			if err := s.Load(ctx, c.client).Err(); err != nil {
				t.Fatal(err)
			}
		}
		at := time.UnixMicro(1_800_000_000_000_000)
		check := func(round int, batch []*layerPending) {
			t.Helper()
			for i, q := range batch {
				if q.err != nil || !q.res.Granted {
					t.Fatalf("round %d request %d: %+v, %v; want granted", round, i, q.res, q.err)
				}
			}
			for _, k := range keys[:30] {
				st, err := l.layerStatus(ctx, at, "per-key", k)
				if err != nil {
					t.Fatal(err)
				}
				if want := float64(10 - round); st.Tokens != want {
					t.Fatalf("round %d key %s: %v tokens, want %v (each request charged once)", round, k, st.Tokens, want)
				}
			}
		}
		batch := pendings(t, l, "", keys[:30]...)
		l.batch.sendCluster(ctx, at, c.client.Pipeline(), nil, batch)
		check(1, batch)

		// The second request of master 0's, moved to master 1.
		batch = pendings(t, l, "", keys[:30]...)
		var on0 []int
		for i, q := range batch {
			if c.masterOf(t, l, q) == 0 {
				on0 = append(on0, i)
			}
		}
		if len(on0) < 3 {
			t.Fatalf("%d of 30 keys on master 0", len(on0))
		}
		moved := batch[on0[1]]
		movedLoc, _ := l.bucketLoc(0, moved.keys[0])
		c.moveSlot(t, movedLoc, 0, 1)
		if c.master(t, movedLoc) != 1 {
			t.Fatal("the slot did not move")
		}
		rest := l.batch.sendByMaster(ctx, at, c.client, c.client.Pipeline(), nil, batch)
		if len(rest) != len(on0)-1 || rest[0] != moved {
			t.Fatalf("%d requests not run, want the %d of master 0 from the moved one on", len(rest), len(on0)-1)
		}
		for _, q := range rest {
			if q.err != nil || q.res.Granted {
				t.Fatalf("a request not run has an answer: %+v, %v", q.res, q.err)
			}
		}
		c.client.ReloadState(ctx)
		l.batch.sendEach(ctx, at, c.client.Pipeline(), nil, rest)
		check(2, batch)

		// The client's map learns the move; then the first request of
		// master 2's moves to master 0: its call is MOVED.
		testenv.Eventually(t, 10*time.Second, "the client's slot map learning the move", func() bool {
			m, err := c.client.MasterForKey(ctx, movedLoc)
			return err == nil && m.Options().Addr == c.masters[1].Options().Addr
		})
		batch = pendings(t, l, "", keys[:30]...)
		var first *layerPending
		for _, q := range batch {
			if c.masterOf(t, l, q) == 2 {
				first = q
				break
			}
		}
		firstLoc, _ := l.bucketLoc(0, first.keys[0])
		c.moveSlot(t, firstLoc, 2, 0)
		c.resetStats(t)
		l.batch.sendCluster(ctx, at, c.client.Pipeline(), nil, batch)
		calls := c.scriptCalls(t)
		check(3, batch)
		on2 := 0 // master 2's requests but the moved one
		for _, q := range batch {
			if c.masterOf(t, l, q) == 2 {
				on2++
			}
		}
		// Master 0: its call and master 2's, MOVED (the moved request,
		// then "m"); master 2: the rest of its requests one by one.
		if calls[0] != 2 || calls[1] != 1 || calls[2] != int64(on2) {
			t.Errorf("script calls per master %v, want [2 1 %d]", calls, on2)
		}

		// The second request of master 1's: its slot migrating to master
		// 2, its keys already there, the slot still master 1's, which
		// answers ASK for them; go-redis follows it to master 2.
		testenv.Eventually(t, 10*time.Second, "the client's slot map learning the second move", func() bool {
			m, err := c.client.MasterForKey(ctx, firstLoc)
			return err == nil && m.Options().Addr == c.masters[0].Options().Addr
		})
		batch = pendings(t, l, "", keys[:30]...)
		var on1 []*layerPending
		for _, q := range batch {
			if c.masterOf(t, l, q) == 1 {
				on1 = append(on1, q)
			}
		}
		if len(on1) < 3 {
			t.Fatalf("%d of 30 keys on master 1", len(on1))
		}
		migLoc, _ := l.bucketLoc(0, on1[1].keys[0])
		c.migrate(t, migLoc, 1, 2)
		c.resetStats(t)
		l.batch.sendCluster(ctx, at, c.client.Pipeline(), nil, batch)
		calls = c.scriptCalls(t)
		check(4, batch)
		// Master 2: its call and, by ASK, the migrating request.
		if calls[2] < 2 {
			t.Errorf("script calls per master %v, want master 2 to decide the migrating request", calls)
		}
	})
}

// TestKeyedClusterScriptStandalone runs layersKeyedClusterScript, flags and
// keys in ARGV, on a single Redis 7 node: its replies are
// layersKeyedScript's, the same requests at the same instants with their
// keys declared.
func TestKeyedClusterScriptStandalone(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ctx := context.Background()
	layers := []limiter.Layer{
		{Name: "per-key", Keyed: true, Rate: 2, Burst: 3, OnExceed: limiter.ActionDeadLetter},
		{Name: "slots", Keyed: true, Concurrency: 2, Lease: time.Second},
	}
	flagged, plain := newLayered(t, c, 1000, 1000, layers), newLayered(t, c, 1000, 1000, layers)
	at := time.UnixMicro(1_800_000_000_000_000)
	for step := range 6 {
		at = at.Add(time.Duration(step) * 100 * time.Millisecond)
		var reqs []backend.LayerRequest
		var keys [][]string
		for i := range 8 {
			req := backend.LayerRequest{Cost: 1, SkipShared: true, Holder: fmt.Sprint("h", step, "-", i),
				Keys: map[string]string{"per-key": fmt.Sprint("k", i%3), "slots": fmt.Sprint("s", i%2)}}
			ks, err := backend.LayerKeys(layers, req)
			if err != nil {
				t.Fatal(err)
			}
			reqs, keys = append(reqs, req), append(keys, ks)
		}
		rk, args := flagged.keyedArgs(at, flagged.allLayers, reqs, keys, 0, true)
		got, err := layersKeyedClusterScript.Run(ctx, c, rk, args...).Text()
		if err != nil {
			t.Fatal(err)
		}
		rk, args = plain.keyedArgs(at, plain.allLayers, reqs, keys, 0, false)
		want, err := layersKeyedScript.Run(ctx, c, rk, args...).Text()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("step %d: %q, layersKeyedScript %q", step, got, want)
		}
	}
}

// BenchmarkClusterBatch sends batches of 6 and of 40 leased requests (6:
// about what 8 callers on a replica queue behind a call in flight), over
// 100,000 keys, on a private 3-master Cluster: one script call per master
// (what a batch sends) against one call per request (what a batch sent
// before, and its fallback). It reports Redis's CPU per request
// (used_cpu_user and used_cpu_sys, summed over the masters) and script
// calls per request. The parallel-16 runs take through TakeLayers from
// 16 goroutines, batched as in production, and report msg/s too.
func BenchmarkClusterBatch(b *testing.B) {
	c := privateCluster(b)
	for _, per := range []int{6, 40} {
		for _, grouped := range []bool{false, true} {
			name := fmt.Sprintf("batch-%d/%s", per, map[bool]string{false: "one-call-each", true: "one-call-per-master"}[grouped])
			b.Run(name, func(b *testing.B) { benchClusterBatch(b, c, per, grouped) })
		}
	}
	for _, grouped := range []bool{false, true} {
		b.Run("parallel-16/"+map[bool]string{false: "one-call-each", true: "one-call-per-master"}[grouped], func(b *testing.B) {
			benchClusterParallel(b, c, grouped)
		})
	}
}

// benchClusterParallel is BenchmarkClusterBatch's parallel-16 run: the
// batch's call per master on or off (Layered.noCrossSlot).
func benchClusterParallel(b *testing.B, c *testCluster, grouped bool) {
	ctx := context.Background()
	l := clusterKeyed(b, c, limiter.Layer{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000})
	l.noCrossSlot.Store(!grouped)
	var n atomic.Int64
	take := func() {
		i := n.Add(7919) // prime: every key in turn
		res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, SkipShared: true, Keys: map[string]string{"per-key": fmt.Sprint("+1555", i%100000)}})
		if err != nil || !res.Granted {
			b.Fatalf("%+v, %v; want granted", res, err)
		}
	}
	take() // loads the script
	c.resetStats(b)
	cpu := c.usedCPU(b)
	start := time.Now()
	b.SetParallelism(16 / runtime.GOMAXPROCS(0))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			take()
		}
	})
	took := time.Since(start)
	cpu = c.usedCPU(b) - cpu
	var calls int64
	for _, v := range c.scriptCalls(b) {
		calls += v
	}
	b.ReportMetric(float64(b.N)/took.Seconds(), "msg/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "redis-µs/req")
	b.ReportMetric(float64(calls)/float64(b.N), "scripts/req")
}

// benchClusterBatch is BenchmarkClusterBatch with batches of per
// requests, grouped by master or not.
func benchClusterBatch(b *testing.B, c *testCluster, per int, grouped bool) {
	const keys = 100000
	ctx := context.Background()
	l := clusterKeyed(b, c, limiter.Layer{Name: "per-key", Keyed: true, Rate: 1000, Burst: 1000})
	next := 0
	batch := func() []*layerPending {
		ks := make([]string, per)
		for i := range ks {
			ks[i] = fmt.Sprint("+1555", next%keys)
			next += 7919 // prime: every key in turn
		}
		return pendings(b, l, "", ks...)
	}
	send := func(qs []*layerPending) {
		if !grouped {
			l.batch.sendEach(ctx, time.Time{}, c.client.Pipeline(), nil, qs)
		} else if rest := l.batch.sendByMaster(ctx, time.Time{}, c.client, c.client.Pipeline(), nil, qs); len(rest) > 0 {
			b.Fatalf("%d requests not run", len(rest))
		}
		for _, q := range qs {
			if q.err != nil || !q.res.Granted {
				b.Fatalf("%+v, %v; want granted", q.res, q.err)
			}
		}
	}
	send(batch()) // loads the script
	c.resetStats(b)
	cpu := c.usedCPU(b)
	n := 0
	for b.Loop() {
		send(batch())
		n++
	}
	cpu = c.usedCPU(b) - cpu
	var calls int64
	for _, v := range c.scriptCalls(b) {
		calls += v
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(n*per), "redis-µs/req")
	b.ReportMetric(float64(calls)/float64(n*per), "scripts/req")
}
