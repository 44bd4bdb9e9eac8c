package redislimiter

import (
	"context"
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

func (c clockedLayers) ReleaseSlotsAt(now time.Time, slots []backend.SlotRelease) error {
	return c.l.releaseSlots(context.Background(), slots)
}

func TestRedisConcurrencySteps(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	storetest.RunConcurrency(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.SlotClockedStore {
		return clockedLayers{newLayered(t, c, rate, burst, layers)}
	})
}

// TestAcquireWakesOtherReplica: a request waiting on one replica for the
// only slot, held by another, gets it when the other releases it, long
// before the lease ends: the release is announced, not polled for.
func TestAcquireWakesOtherReplica(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	name := uniqueBucket(t, c)
	layers := []limiter.Layer{{Name: "conc", Keyed: true, Concurrency: 1, Lease: time.Minute}}
	replica := func() *limiter.Bucket {
		s, err := New(c, Config{Bucket: name, Rate: 1000, Burst: 1000})
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.WithLayers(layers)
		if err != nil {
			t.Fatal(err)
		}
		b, err := limiter.New(l, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	a, b := replica(), replica()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := limiter.Request{Cost: 1, Keys: map[string]string{"conc": "k"}}
	if err := a.WaitN(ctx, req); err != limiter.ErrNeedsAcquire {
		t.Fatalf("WaitN on a concurrency layer = %v, want ErrNeedsAcquire", err)
	}
	held, err := a.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		h, err := b.Acquire(ctx, req)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		h.Release()
	}()
	// b must be waiting (every slot held) before the release.
	time.Sleep(300 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("the second replica got the only slot while the first held it")
	default:
	}
	released := time.Now()
	held.Release()
	held.Release() // a second Release does nothing
	at, ok := <-got
	if !ok {
		return
	}
	if d := at.Sub(released); d > 2*time.Second {
		t.Fatalf("the waiting replica got the slot %v after the release; want it woken by the release (lease 1m)", d)
	}
	t.Logf("woken %v after the release", at.Sub(released))
}

// TestReleasesRideWithTheNextTakes: a release made while a call is in
// flight returns at once and goes out with the next flight, ahead of its
// takes in the same pipeline, so that a take queued after it gets the slot
// it freed; Redis having lost the scripts (NOSCRIPT) loses neither. A
// release queued when the flight returns without a take behind it is sent
// by that flight's caller before it returns.
func TestReleasesRideWithTheNextTakes(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	layers := []limiter.Layer{{Name: "conc", Keyed: true, Concurrency: 1, Lease: time.Minute}}
	l := newLayered(t, c, 1000, 1000, layers)
	ctx := context.Background()
	take := func(key, holder string) (backend.LayerResult, error) {
		return l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"conc": key}, SkipShared: true, Holder: holder})
	}
	release := func(key, holder string) error {
		return l.ReleaseSlots(ctx, backend.Slots(layers, []string{key}, holder))
	}
	used := func(key string) int {
		st, err := l.LayerStatus(ctx, "conc", key)
		if err != nil {
			t.Fatal(err)
		}
		return st.Used
	}
	if res, err := take("a", "h1"); err != nil || !res.Granted { // loads the script
		t.Fatalf("take(a, h1) = %+v, %v", res, err)
	}
	rig := &keyedRig{release: make(chan struct{})}
	c.AddHook(rig)
	type outcome struct {
		res backend.LayerResult
		err error
	}
	first := make(chan outcome, 1)
	go func() { res, err := take("b", "h0"); first <- outcome{res, err} }()
	for !rig.held.Load() {
		time.Sleep(time.Millisecond)
	}
	if err := release("a", "h1"); err != nil { // queued: returns at once
		t.Fatal(err)
	}
	second := make(chan outcome, 1)
	go func() { res, err := take("a", "h2"); second <- outcome{res, err} }()
	for {
		l.batch.mu.Lock()
		n, r := len(l.batch.queue), len(l.batch.releases)
		l.batch.mu.Unlock()
		if n == 1 && r == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(rig.release)
	if o := <-first; o.err != nil || !o.res.Granted {
		t.Fatalf("take(b, h0) = %+v, %v", o.res, o.err)
	}
	if o := <-second; o.err != nil || !o.res.Granted {
		t.Fatalf("take(a, h2) after h1's release = %+v, %v; want granted: the release goes first", o.res, o.err)
	}
	rig.mu.Lock()
	sent := rig.sent
	rig.mu.Unlock()
	if len(sent) != 1 || len(sent[0]) != 2 {
		t.Errorf("pipelines sent: %v; want one, with the release and the take", sent)
	}
	if u := used("a"); u != 1 {
		t.Errorf("slots of a held: %d, want 1 (h2's)", u)
	}

	// The flight returns with a release queued and no take.
	rig.release, rig.sent = make(chan struct{}), nil
	rig.held.Store(false)
	go func() { res, err := take("c", "h3"); first <- outcome{res, err} }()
	for !rig.held.Load() {
		time.Sleep(time.Millisecond)
	}
	if err := release("a", "h2"); err != nil {
		t.Fatal(err)
	}
	close(rig.release)
	if o := <-first; o.err != nil || !o.res.Granted {
		t.Fatalf("take(c, h3) = %+v, %v", o.res, o.err)
	}
	if u := used("a"); u != 0 {
		t.Errorf("slots of a held after the flight returned: %d, want 0 (h2's release sent by its caller)", u)
	}
}

// TestSlotKeyTTL: a slot taken on a key that holds none sets the key's TTL
// to a second past its lease without reading it first, and a later take
// on the same key in the same script call, whose lease ends earlier,
// leaves the longer TTL in place: the key goes with its last lease, not
// with the latest taken.
func TestSlotKeyTTL(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	l := newLayered(t, c, 1000, 1000, []limiter.Layer{{Name: "conc", Keyed: true, Concurrency: 3, Lease: 10 * time.Second}})
	ctx := context.Background()
	req := func(holder, key string) backend.LayerRequest {
		return backend.LayerRequest{Cost: 1, Holder: holder, SkipShared: true, Keys: map[string]string{"conc": key}}
	}
	// One call: a on k, then b on k, then c on k2. a goes out 20 s
	// after now (its base), so that its lease ends 30 s from now; b and c
	// go out now, their leases ending 10 s from now.
	rkeys, args := l.keyedArgs(time.Time{}, l.allLayers, []backend.LayerRequest{req("a", "k"), req("b", "k"), req("c", "k2")},
		[][]string{{"k"}, {"k"}, {"k2"}}, 0, false)
	const baseArg = 3 + 6 + 2 // now_us, n, mode, the layer's 6, then holder, cost, base_us
	args[baseArg] = (20 * time.Second).Microseconds()
	s, err := layersKeyedScript.Run(ctx, c, rkeys, args...).Text()
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(s); len(f) != 10 || f[1] != "1" || f[4] != "1" || f[7] != "1" {
		t.Fatalf("reply %q, want all three granted", s)
	}
	k, k2 := l.layerKey(0, "k"), l.layerKey(0, "k2")
	if ttl := c.PTTL(ctx, k).Val(); ttl <= 29*time.Second || ttl > 31*time.Second {
		t.Fatalf("TTL of k = %v, want a's lease and a second, 31 s", ttl)
	}
	if n := c.ZCard(ctx, k).Val(); n != 2 {
		t.Fatalf("%d holders of k, want a and b", n)
	}
	if ttl := c.PTTL(ctx, k2).Val(); ttl <= 10*time.Second || ttl > 11*time.Second {
		t.Fatalf("TTL of k2, new to c's take = %v, want 11 s", ttl)
	}
}

// pipeGate holds the first pipeline sent once armed until open is closed.
type pipeGate struct {
	armed, held atomic.Bool
	open        chan struct{}
}

func (g *pipeGate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (g *pipeGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *pipeGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if g.armed.Load() && g.held.CompareAndSwap(false, true) {
			<-g.open
		}
		return next(ctx, cmds)
	}
}

// TestReleaseNeverWaits: a release that finds no call in flight returns
// before its own call is answered (its handler is free at once), and a
// take made right after it goes out behind it and gets the slot it freed.
func TestReleaseNeverWaits(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	layers := []limiter.Layer{{Name: "conc", Keyed: true, Concurrency: 1, Lease: time.Minute}}
	l := newLayered(t, c, 1000, 1000, layers)
	ctx := context.Background()
	take := func(holder string) (backend.LayerResult, error) {
		return l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"conc": "a"}, SkipShared: true, Holder: holder})
	}
	if res, err := take("h1"); err != nil || !res.Granted {
		t.Fatalf("take(h1) = %+v, %v", res, err)
	}
	g := &pipeGate{open: make(chan struct{})}
	c.AddHook(g)
	g.armed.Store(true)
	released := make(chan error, 1)
	go func() { released <- l.ReleaseSlots(ctx, backend.Slots(layers, []string{"a"}, "h1")) }()
	select {
	case err := <-released:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		close(g.open)
		t.Fatal("ReleaseSlots with nothing in flight waited for its call")
	}
	testenv.Eventually(t, 5*time.Second, "the release's call sent", g.held.Load)
	type outcome struct {
		res backend.LayerResult
		err error
	}
	second := make(chan outcome, 1)
	go func() { res, err := take("h2"); second <- outcome{res, err} }()
	testenv.Eventually(t, 5*time.Second, "h2's take queued behind the release", func() bool {
		l.batch.mu.Lock()
		defer l.batch.mu.Unlock()
		return len(l.batch.queue) == 1
	})
	close(g.open)
	if o := <-second; o.err != nil || !o.res.Granted {
		t.Fatalf("take(h2) after h1's release = %+v, %v; want granted", o.res, o.err)
	}
}

// TestBucketCloseWaitsForReleases: a slot released with nothing in flight
// is sent by a goroutine of the store's (TestReleaseNeverWaits); Close
// waits for it to be sent, so that no goroutine outlives the Bucket, and
// the slot is free in Redis when Close returns. Close used to return at
// once, the release still on its way.
func TestBucketCloseWaitsForReleases(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	layers := []limiter.Layer{{Name: "conc", Keyed: true, Concurrency: 1, Lease: time.Minute}}
	l := newLayered(t, c, 1000, 1000, layers)
	b, err := limiter.New(l, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, 10*time.Second)
	req := limiter.Request{Cost: 1, Keys: map[string]string{"conc": "a"}}
	h, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	g := &pipeGate{open: make(chan struct{})}
	c.AddHook(g)
	g.armed.Store(true)
	h.Release() // returns at once; its call is held at the gate
	testenv.Eventually(t, 5*time.Second, "the release's call sent", g.held.Load)
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		close(g.open)
		t.Fatalf("Close returned (%v) while the release was still being sent", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(g.open)
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: req.Keys, SkipShared: true, Holder: "other"})
	if err != nil || !res.Granted {
		t.Errorf("a take of the key's one slot after Close = %+v, %v; want granted: the release was sent", res, err)
	}
}
