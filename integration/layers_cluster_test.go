package integration

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// TestLayersCluster decides a shared bucket, a per-recipient bucket and a
// daily quota on a three-master Redis Cluster: the recipients' states spread
// over more than one master, every decision is all-or-nothing, and a refusal
// by the per-recipient step refunds the shared bucket and the quota charged
// by the first step.
func TestLayersCluster(t *testing.T) {
	t.Parallel()
	cluster := faultStartCluster(t)
	ctx := context.Background()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	defer client.Close()
	bucket := faultName(t)
	// The shared bucket barely refills, so its tokens count the charges.
	s, err := redislimiter.New(client, redislimiter.Config{Bucket: bucket, Rate: 0.001, Burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.WithLayers([]limiter.Layer{
		{Name: "per-recipient", Keyed: true, Rate: 0.001, Burst: 2, OnExceed: limiter.ActionDeadLetter},
		{Name: "daily", Quota: 100000, Per: limiter.PerDay},
	})
	if err != nil {
		t.Fatal(err)
	}
	const recipients = 200
	req := func(i int) backend.LayerRequest {
		return backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-recipient": fmt.Sprintf("+1555%07d", i)}}
	}
	for round := range 2 {
		for i := range recipients {
			res, err := l.TakeLayers(ctx, req(i))
			if err != nil || !res.Granted {
				t.Fatalf("round %d recipient %d: %+v %v", round, i, res, err)
			}
		}
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(st.Tokens-(1000-2*recipients)) > 0.5 {
		t.Fatalf("shared tokens after %d grants = %v, want %d", 2*recipients, st.Tokens, 1000-2*recipients)
	}
	// A third message per recipient: the shared step grants, the
	// per-recipient step refuses, and the shared step is refunded.
	for i := range recipients {
		res, err := l.TakeLayers(ctx, req(i))
		if err != nil || res.Granted || res.Exceeded == nil || res.Exceeded.Layer != "per-recipient" {
			t.Fatalf("third message of recipient %d: %+v %v; want refused by per-recipient", i, res, err)
		}
	}
	st2, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(st2.Tokens-st.Tokens) > 0.5 {
		t.Errorf("shared tokens after %d refusals = %v, want %v (refunded)", recipients, st2.Tokens, st.Tokens)
	}
	// A message that asks for a lease of the shared bucket (Extra) gets
	// it on a Cluster as on one node; refused by its per-recipient step,
	// the lease is refunded with its cost.
	res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Extra: 10, Keys: map[string]string{"per-recipient": "+15559999999"}})
	if err != nil || !res.Granted || res.Tokens != 11 {
		t.Fatalf("a message asking for a lease of 10: %+v %v; want granted with 11 tokens", res, err)
	}
	st3, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(st3.Tokens-(st2.Tokens-11)) > 0.5 {
		t.Errorf("shared tokens after a lease of 10 = %v, want %v", st3.Tokens, st2.Tokens-11)
	}
	res, err = l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Extra: 10, Keys: map[string]string{"per-recipient": fmt.Sprintf("+1555%07d", 0)}})
	if err != nil || res.Granted || res.Exceeded == nil {
		t.Fatalf("a message asking for a lease, refused by its recipient: %+v %v", res, err)
	}
	st4, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(st4.Tokens-st3.Tokens) > 0.5 {
		t.Errorf("shared tokens after a refused message asking for a lease = %v, want %v (cost and lease refunded)", st4.Tokens, st3.Tokens)
	}
	daily, err := l.LayerStatus(ctx, "daily", "")
	if err != nil {
		t.Fatal(err)
	}
	if daily.Used != 2*recipients+1 {
		t.Errorf("daily quota used = %d, want %d (the refusals refunded)", daily.Used, 2*recipients+1)
	}
	// The per-recipient keys sit on more than one master.
	var mu sync.Mutex
	perMaster := map[string]int{}
	err = client.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := l.CountLayerKeys(ctx, c, "per-recipient")
		mu.Lock()
		perMaster[c.Options().Addr] = int(n.Keys)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	used, total := 0, 0
	var report []string
	for addr, n := range perMaster {
		total += n
		if n > 0 {
			used++
		}
		report = append(report, fmt.Sprintf("%s: %d", addr, n))
	}
	t.Logf("per-recipient keys per master: %s", strings.Join(report, ", "))
	if total != recipients+1 || used < 2 { // and the one that took a lease
		t.Errorf("per-recipient keys per master = %v; want %d keys over at least 2 masters", perMaster, recipients+1)
	}
}

// TestConcurrencyCluster takes a slot of a concurrency layer for keys
// spread over a three-master Cluster, from concurrent callers, releases
// them from concurrent callers (batched, one call per key in a pipeline
// split by master), and takes them again: every release reached its key's
// master, and a slot taken twice by one holder is one slot.
func TestConcurrencyCluster(t *testing.T) {
	t.Parallel()
	cluster := faultStartCluster(t)
	ctx := context.Background()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	defer client.Close()
	s, err := redislimiter.New(client, redislimiter.Config{Bucket: faultName(t), Rate: 1e6, Burst: 1e6})
	if err != nil {
		t.Fatal(err)
	}
	layers := []limiter.Layer{{Name: "conc", Keyed: true, Concurrency: 1, Lease: time.Hour}}
	l, err := s.WithLayers(layers)
	if err != nil {
		t.Fatal(err)
	}
	const keys = 100
	req := func(i int, holder string) backend.LayerRequest {
		return backend.LayerRequest{Cost: 1, SkipShared: true, Holder: holder, Keys: map[string]string{"conc": fmt.Sprint("k", i)}}
	}
	all := func(what string, do func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, keys)
		for i := range keys {
			wg.Go(func() { errs[i] = do(i) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s, key %d: %v", what, i, err)
			}
		}
	}
	take := func(holder string) func(i int) error {
		return func(i int) error {
			res, err := l.TakeLayers(ctx, req(i, holder))
			if err == nil && !res.Granted {
				err = fmt.Errorf("not granted: %+v", res)
			}
			return err
		}
	}
	all("first take", take("h1"))
	all("first take again, same holder", take("h1"))
	all("release", func(i int) error {
		return l.ReleaseSlots(ctx, backend.Slots(layers, []string{fmt.Sprint("k", i)}, "h1"))
	})
	// A release queued behind a call in flight returns before it is sent:
	// wait until every key is free.
	testenv.Eventually(t, 10*time.Second, "every slot released", func() bool {
		for i := range keys {
			st, err := l.LayerStatus(ctx, "conc", fmt.Sprint("k", i))
			if err != nil || st.Used != 0 {
				return false
			}
		}
		return true
	})
	all("second take", take("h2"))
}
