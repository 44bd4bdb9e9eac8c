package integration

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/faultproxy"
	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// faultRedisTimeout is the client timeout of the fault tests: short, so that
// a dead Redis is noticed at once.
const faultRedisTimeout = config.Duration(100 * time.Millisecond)

// faultCheckCounts fails the test unless every Wait was granted and the
// per-replica counts add up to the total.
func faultCheckCounts(t *testing.T, run *faultRun) (int, []int) {
	t.Helper()
	if err := run.Wait(); err != nil {
		t.Errorf("Wait failed: %v", err)
	}
	total, per := run.Total()
	sum := 0
	for _, n := range per {
		sum += n
	}
	if sum != total || int64(total) != run.handled.Load() {
		t.Errorf("counts do not add up: per replica %v (sum %d), total %d, handled %d", per, sum, total, run.handled.Load())
	}
	if total == 0 {
		t.Error("no Wait was granted")
	}
	return total, per
}

// TestFaultRedisKilledLocalFallback kills the Redis of three replicas that
// saturate a 60/s bucket, restarts it 5 s later on the same port, and
// checks that they limit locally at a third of the rate each meanwhile and
// share the bucket again afterwards.
func TestFaultRedisKilledLocalFallback(t *testing.T) {
	t.Parallel()
	const (
		rate    = 60.0
		outage  = 5 * time.Second
		perRep  = 8
		reps    = 3
		shared  = 2 * time.Second
		settled = 1500 * time.Millisecond
	)
	srv := faultStartRedis(t)
	ctx := context.Background()
	replicas := faultNewReplicas(t, faultBucketSpec{
		Redis:  config.Redis{Addr: srv.Addr(), Timeout: faultRedisTimeout},
		Bucket: faultName(t), Rate: rate, Burst: 6, Replicas: reps,
	})
	// The local share comes from the heartbeats seen before the outage.
	testenv.Eventually(t, 5*time.Second, "the replicas seeing each other's heartbeats", func() bool {
		for _, r := range replicas {
			if r.Bucket.Stats().Replicas != reps {
				return false
			}
		}
		return true
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	run := faultDrive(runCtx, replicas, perRep, nil)

	faultSleepUntil(ctx, start.Add(shared))
	killAt := time.Now()
	srv.Kill()
	testenv.Eventually(t, 2*time.Second, "the replicas falling back to local limiting", func() bool {
		return faultAllModes(replicas, limiter.ModeLocal)
	})
	switchedIn := time.Since(killAt)
	// The local bucket grants nothing (rate 0) until the reservations
	// already booked in the shared bucket are due, then runs at the share.
	for i, r := range replicas {
		var st limiter.State
		testenv.Eventually(t, 3*time.Second, fmt.Sprintf("replica %d limiting locally at %.2f/s", i, rate/reps), func() bool {
			var err error
			st, err = r.Bucket.State(ctx)
			return err == nil && st.Mode == limiter.ModeLocal && st.Rate >= rate/reps*0.99 && st.Rate <= rate/reps*1.01
		})
	}

	faultSleepUntil(ctx, killAt.Add(outage))
	restartAt := time.Now()
	srv.Start()
	testenv.Eventually(t, 5*time.Second, "the replicas back on the shared bucket", func() bool {
		return faultAllModes(replicas, limiter.ModeShared)
	})
	backAt := time.Now()
	faultSleepUntil(ctx, backAt.Add(settled))
	end := time.Now()
	stop()
	total, per := faultCheckCounts(t, run)

	sharedRate := faultRate(run.Count(start.Add(time.Second), killAt), start.Add(time.Second), killAt)
	outageN := run.Count(killAt, restartAt)
	outageRate := faultRate(outageN, killAt, restartAt)
	afterRate := faultRate(run.Count(backAt, end), backAt, end)
	t.Logf("rate %.0f/s, %d replicas x %d goroutines: shared %.1f/s; Redis down %v: %d grants = %.1f/s (switched to local in %v); back in shared %v after restart: %.1f/s; total %d grants %v, 0 errors",
		rate, reps, perRep, sharedRate, restartAt.Sub(killAt).Round(time.Millisecond), outageN, outageRate,
		switchedIn.Round(time.Millisecond), backAt.Sub(restartAt).Round(time.Millisecond), afterRate, total, per)
	if outageRate > rate*1.1 {
		t.Errorf("aggregate rate during the outage %.1f/s > %.0f/s × 1.1", outageRate, rate)
	}
	if outageRate < rate*0.7 {
		t.Errorf("aggregate rate during the outage %.1f/s; the local fallback should keep delivering near %.0f/s", outageRate, rate)
	}
	for i, r := range replicas {
		if r.Transitions.Load() < 2 {
			t.Errorf("replica %d saw %d mode transitions, want fallback and recovery", i, r.Transitions.Load())
		}
	}
}

// TestFaultRedisKilledClosed checks that ModeClosed grants nothing while
// Redis is down, and resumes when it is back.
func TestFaultRedisKilledClosed(t *testing.T) {
	t.Parallel()
	const rate = 40.0
	srv := faultStartRedis(t)
	ctx := context.Background()
	replicas := faultNewReplicas(t, faultBucketSpec{
		Redis:  config.Redis{Addr: srv.Addr(), Timeout: faultRedisTimeout},
		Bucket: faultName(t), Rate: rate, Burst: 4, Replicas: 2,
		Options: limiter.Options{OnStoreError: limiter.ModeClosed},
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	run := faultDrive(runCtx, replicas, 3, nil)
	faultSleepUntil(ctx, start.Add(time.Second))
	killAt := time.Now()
	srv.Kill()
	testenv.Eventually(t, 2*time.Second, "the replicas closed", func() bool {
		return faultAllModes(replicas, limiter.ModeClosed)
	})
	// Reservations made before the kill fall due within the 1s horizon.
	quietFrom := time.Now().Add(time.Second)
	faultSleepUntil(ctx, killAt.Add(3*time.Second))
	restartAt := time.Now()
	srv.Start()
	testenv.Eventually(t, 5*time.Second, "the replicas reopened", func() bool {
		return faultAllModes(replicas, limiter.ModeShared)
	})
	backAt := time.Now()
	faultSleepUntil(ctx, backAt.Add(time.Second))
	end := time.Now()
	stop()
	total, _ := faultCheckCounts(t, run)
	during := run.Count(quietFrom, restartAt)
	after := run.Count(backAt, end)
	t.Logf("closed: %d grants in the %v of the outage after pending reservations, %d in %v after recovery, %d in all",
		during, restartAt.Sub(quietFrom).Round(time.Millisecond), after, end.Sub(backAt).Round(time.Millisecond), total)
	if during != 0 {
		t.Errorf("ModeClosed granted %d tokens while Redis was down", during)
	}
	if after == 0 {
		t.Error("no grant after Redis came back")
	}
}

// TestFaultRedisKilledOpen checks that ModeOpen grants without a limit
// while Redis is down, and limits again when it is back.
func TestFaultRedisKilledOpen(t *testing.T) {
	t.Parallel()
	const rate = 20.0
	srv := faultStartRedis(t)
	ctx := context.Background()
	replicas := faultNewReplicas(t, faultBucketSpec{
		Redis:  config.Redis{Addr: srv.Addr(), Timeout: faultRedisTimeout},
		Bucket: faultName(t), Rate: rate, Burst: 2, Replicas: 2,
		Options: limiter.Options{OnStoreError: limiter.ModeOpen},
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	// The handler's 2ms bounds the unlimited rate, so the test does not
	// spin a core.
	run := faultDrive(runCtx, replicas, 2, func() { time.Sleep(2 * time.Millisecond) })
	faultSleepUntil(ctx, start.Add(time.Second))
	srv.Kill()
	testenv.Eventually(t, 2*time.Second, "the replicas open", func() bool {
		return faultAllModes(replicas, limiter.ModeOpen)
	})
	openAt := time.Now()
	faultSleepUntil(ctx, openAt.Add(2*time.Second))
	restartAt := time.Now()
	srv.Start()
	testenv.Eventually(t, 5*time.Second, "the replicas back on the shared bucket", func() bool {
		return faultAllModes(replicas, limiter.ModeShared)
	})
	backAt := time.Now()
	faultSleepUntil(ctx, backAt.Add(2*time.Second))
	end := time.Now()
	stop()
	total, _ := faultCheckCounts(t, run)
	openRate := faultRate(run.Count(openAt, restartAt), openAt, restartAt)
	// Skip the first second back: the restarted Redis starts with a full
	// bucket and reservations may straddle the switch.
	afterRate := faultRate(run.Count(backAt.Add(time.Second), end), backAt.Add(time.Second), end)
	t.Logf("open: %.0f/s while Redis was down, %.1f/s after recovery (rate %.0f/s), %d grants in all", openRate, afterRate, rate, total)
	if openRate < 5*rate {
		t.Errorf("ModeOpen granted %.1f/s while Redis was down, want far above the rate %.0f/s", openRate, rate)
	}
	if afterRate > rate*1.5 {
		t.Errorf("after recovery the rate is %.1f/s, want about %.0f/s", afterRate, rate)
	}
}

// TestFaultRedisLatency puts 20 ms each way between every replica and
// Redis: reservations keep the bucket's rate, and a slow Redis that still
// answers within the timeout does not trigger the fallback.
func TestFaultRedisLatency(t *testing.T) {
	t.Parallel()
	const (
		rate    = 100.0
		latency = 20 * time.Millisecond
		// The timeout is far above the 40ms round trip, so that a loaded
		// CI machine does not turn the slow Redis into a failed one.
		timeout = time.Second
		reps    = 3
		// 24 callers keep 240 ms of reservations queued at 100/s, so
		// the bucket stays saturated while load stretches the 40 ms
		// round trip several times over: with 4 a replica, the full
		// suite's load once let the queue run dry (94.8/s).
		perRep = 8
	)
	srv := faultStartRedis(t)
	ctx := context.Background()
	name := faultName(t)
	var replicas []*faultReplica
	for range reps {
		p, err := faultproxy.New(srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		p.SetLatency(latency)
		replicas = append(replicas, faultNewReplicas(t, faultBucketSpec{
			Redis:  config.Redis{Addr: p.Addr(), Timeout: config.Duration(timeout)},
			Bucket: name, Rate: rate, Burst: 10, Replicas: 1,
		})...)
	}
	// Measure the round trip the replicas see, on a warm connection.
	if err := replicas[0].Client.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ping := time.Now()
	if err := replicas[0].Client.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(ping)
	if rtt < 2*latency {
		t.Fatalf("round trip through the proxy took %v, want >= %v", rtt, 2*latency)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	run := faultDrive(runCtx, replicas, perRep, nil)
	faultSleepUntil(ctx, start.Add(6*time.Second))
	stop()
	total, per := faultCheckCounts(t, run)
	from, to := start.Add(time.Second), start.Add(6*time.Second)
	got := faultRate(run.Count(from, to), from, to)
	t.Logf("latency %v each way (round trip %v), %d replicas x %d goroutines: %.1f/s of %.0f/s; %d grants %v",
		latency, rtt.Round(time.Millisecond), reps, perRep, got, rate, total, per)
	if got < 0.95*rate || got > 1.05*rate {
		t.Errorf("rate with a slow Redis = %.1f/s, want %.0f/s ±5%%", got, rate)
	}
	for i, r := range replicas {
		if n := r.StoreErrors.Load(); n != 0 || r.Transitions.Load() != 0 {
			t.Errorf("replica %d: %d store errors, %d mode transitions; a slow Redis within the timeout must not fall back", i, n, r.Transitions.Load())
		}
	}
}

// TestFaultRedisPartition partitions one replica from Redis with the proxy:
// it falls back within about one timeout, never waits on Redis per message
// meanwhile, and shares the bucket again after the partition heals.
func TestFaultRedisPartition(t *testing.T) {
	t.Parallel()
	const rate = 30.0
	srv := faultStartRedis(t)
	ctx := context.Background()
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	replicas := faultNewReplicas(t, faultBucketSpec{
		Redis:  config.Redis{Addr: p.Addr(), Timeout: faultRedisTimeout},
		Bucket: faultName(t), Rate: rate, Burst: 3, Replicas: 1,
	})
	// The local share comes from a heartbeat seen before the partition: a
	// replica whose first calls timed out (a loaded machine, with the
	// 100 ms timeout) knows no share and would close instead.
	testenv.Eventually(t, 10*time.Second, "the replica shared and counted by its heartbeat", func() bool {
		st, err := replicas[0].Bucket.State(ctx)
		return err == nil && st.Mode == limiter.ModeShared && st.Replicas == 1
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	run := faultDrive(runCtx, replicas, 3, nil)
	faultSleepUntil(ctx, start.Add(time.Second))
	blockAt := time.Now()
	p.Block()
	testenv.Eventually(t, 2*time.Second, "the replica falling back during the partition", func() bool {
		return faultAllModes(replicas, limiter.ModeLocal)
	})
	switchedIn := time.Since(blockAt)
	faultSleepUntil(ctx, blockAt.Add(3*time.Second))
	healAt := time.Now()
	p.Unblock()
	testenv.Eventually(t, 5*time.Second, "the replica back after the partition", func() bool {
		return faultAllModes(replicas, limiter.ModeShared)
	})
	stop()
	total, _ := faultCheckCounts(t, run)
	from := blockAt.Add(time.Second)
	during := faultRate(run.Count(from, healAt), from, healAt)
	t.Logf("partition: fell back in %v, %.1f/s locally (rate %.0f/s), %d grants in all", switchedIn.Round(time.Millisecond), during, rate, total)
	if during < 0.7*rate || during > 1.1*rate {
		t.Errorf("rate during the partition %.1f/s, want about %.0f/s from the local fallback", during, rate)
	}
}

// faultBucketsOnDistinctNodes returns n bucket names whose keys hash to
// slots served by different masters of the cluster (round robin when n
// exceeds the masters).
func faultBucketsOnDistinctNodes(t *testing.T, ctx context.Context, c *faultCluster, base string, n int) ([]string, []string) {
	t.Helper()
	client := c.Nodes[0].Client()
	shards, err := client.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	owner := func(slot int64) string {
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start <= slot && slot <= r.End {
					for _, n := range sh.Nodes {
						if n.Role == "master" {
							return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
						}
					}
				}
			}
		}
		return ""
	}
	var names, nodes []string
	used := map[string]int{}
	for i := 0; len(names) < n && i < 1000; i++ {
		name := fmt.Sprintf("%s-%d", base, i)
		slot, err := client.ClusterKeySlot(ctx, "throttle:{"+name+"}:state").Result()
		if err != nil {
			t.Fatal(err)
		}
		node := owner(slot)
		if used[node] > len(names)/len(c.Nodes) {
			continue
		}
		used[node]++
		names, nodes = append(names, name), append(nodes, node)
	}
	if len(names) < n {
		t.Fatalf("found only %d bucket names spread over the nodes", len(names))
	}
	return names, nodes
}

// TestFaultCluster holds four buckets on a three-master Redis Cluster, each
// shared by two replicas: no store error (such as CROSSSLOT), and every
// bucket keeps its own rate within 3%.
func TestFaultCluster(t *testing.T) {
	t.Parallel()
	cluster := faultStartCluster(t)
	ctx := context.Background()
	rates := []float64{50, 80, 120, 150}
	names, nodes := faultBucketsOnDistinctNodes(t, ctx, cluster, faultName(t), len(rates))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var runs []*faultRun
	var all [][]*faultReplica
	start := time.Now()
	for i, name := range names {
		reps := faultNewReplicas(t, faultBucketSpec{
			Redis:  config.Redis{Addrs: cluster.Addrs(), Timeout: config.Duration(250 * time.Millisecond)},
			Bucket: name, Rate: rates[i], Burst: 10, Replicas: 2,
		})
		all = append(all, reps)
		// Eight waiters per replica keep a reservation pending at all
		// times even when the machine is loaded, so the measured rate is the
		// bucket's, not the harness's.
		runs = append(runs, faultDrive(runCtx, reps, 8, nil))
	}
	from, to := start.Add(time.Second), start.Add(6*time.Second)
	faultSleepUntil(ctx, to)
	stop()
	var report []string
	for i, run := range runs {
		faultCheckCounts(t, run)
		got := faultRate(run.Count(from, to), from, to)
		report = append(report, fmt.Sprintf("%s on %s: %.1f/s of %.0f", names[i], nodes[i], got, rates[i]))
		if got < rates[i]*0.97 || got > rates[i]*1.03 {
			t.Errorf("bucket %s: %.1f/s, want %.0f/s ±3%%", names[i], got, rates[i])
		}
		for j, r := range all[i] {
			if n := r.StoreErrors.Load(); n != 0 {
				t.Errorf("bucket %s replica %d: %d store errors", names[i], j, n)
			}
		}
	}
	// The buckets sit on different masters; listing them scans every one.
	admin, err := redisconn.New(config.Redis{Addrs: cluster.Addrs(), Timeout: config.Duration(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	listed, err := redislimiter.Buckets(ctx, admin, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if !slices.Contains(listed, name) {
			t.Errorf("redislimiter.Buckets on the cluster = %q, lacks %s", listed, name)
		}
	}
	t.Logf("cluster: %s", strings.Join(report, "; "))
}

// TestFaultSentinelFailover forces a Sentinel failover while two replicas
// saturate a bucket: Waits keep being granted, and after the failover the
// replicas share the bucket on the new master.
func TestFaultSentinelFailover(t *testing.T) {
	t.Parallel()
	const rate = 40.0
	set := faultStartSentinelSet(t)
	ctx := context.Background()
	name := faultName(t)
	replicas := faultNewReplicas(t, faultBucketSpec{
		Redis:  config.Redis{MasterName: faultMasterName, Addrs: set.Addrs(), Timeout: config.Duration(250 * time.Millisecond)},
		Bucket: name, Rate: rate, Burst: 4, Replicas: 2,
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	run := faultDrive(runCtx, replicas, 3, nil)
	faultSleepUntil(ctx, start.Add(2*time.Second))
	failAt := time.Now()
	set.Failover(t)
	failedOver := time.Now()
	testenv.Eventually(t, 10*time.Second, "the replicas settled on the new master", func() bool {
		return faultAllModes(replicas, limiter.ModeShared)
	})
	// Let the clients drop the old master's connections, then measure.
	from := time.Now().Add(time.Second)
	to := from.Add(3 * time.Second)
	faultSleepUntil(ctx, to)
	stop()
	total, per := faultCheckCounts(t, run)
	duringN := run.Count(failAt, from)
	after := faultRate(run.Count(from, to), from, to)
	var storeErrs, transitions int64
	for _, r := range replicas {
		storeErrs += r.StoreErrors.Load()
		transitions += r.Transitions.Load()
	}
	t.Logf("sentinel failover took %v; %d grants from the failover until %v later, then %.1f/s of %.0f/s; %d store errors, %d mode transitions; %d grants %v",
		failedOver.Sub(failAt).Round(time.Millisecond), duringN, from.Sub(failAt).Round(time.Millisecond), after, rate, storeErrs, transitions, total, per)
	if after < 0.9*rate || after > 1.1*rate {
		t.Errorf("rate after the failover %.1f/s, want %.0f/s ±10%%", after, rate)
	}
	if duringN == 0 {
		t.Error("no grant at all during the failover")
	}
	// The bucket now lives on the former replica.
	nc := set.Replica.Client()
	role, err := nc.Do(ctx, "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		t.Fatalf("ROLE of the former replica = %v, %v; want master", role, err)
	}
	if n, err := nc.Exists(ctx, replicas[0].Store.Keys()[2]).Result(); err != nil || n != 1 {
		t.Errorf("heartbeat key on the new master: EXISTS = %d, %v; want 1", n, err)
	}
}
