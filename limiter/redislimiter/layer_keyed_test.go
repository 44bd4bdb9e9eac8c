package redislimiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// TestKeyedScriptMatchesLayersScript decides the same random requests
// without the shared bucket, at the same instants, with layersKeyedScript
// (what TakeLayers sends) on one store and with layersScript on another:
// every result and every key's state must be the same. Some requests name
// layers as paid (a delay layer's booked slot), for their key, another key,
// or a layer that does not book.
func TestKeyedScriptMatchesLayersScript(t *testing.T) {
	layers := []limiter.Layer{
		{Name: "per-key", Keyed: true, Rate: 2, Burst: 4},
		{Name: "per-sender", Keyed: true, Rate: 3, Burst: 2, OnExceed: limiter.ActionDelay, MaxWait: 300 * time.Millisecond},
		{Name: "strict", Keyed: true, Rate: 3, Burst: 3, OnExceed: limiter.ActionDeadLetter, MaxWait: 800 * time.Millisecond},
		{Name: "all", Rate: 20, Burst: 10},
	}
	t.Run("buckets", func(t *testing.T) { keyedMatchesLayers(t, layers) })
	// The requests start at 08:00:00 UTC and span a minute or two: a
	// window by recipient that opens at 08:00:40 in New York's zone for
	// the key "+12125550100" and in UTC otherwise, both waiting and
	// delaying, is closed, then open, for some of them.
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	opens := limiter.Calendar{From: 8*time.Hour + 40*time.Second, To: 20 * time.Hour}
	t.Run("windows", func(t *testing.T) {
		keyedMatchesLayers(t, append(slices.Clone(layers[:3]),
			limiter.Layer{Name: "quiet", Keyed: true, Window: &limiter.Window{Calendar: opens, Location: time.UTC}, OnExceed: limiter.ActionWait},
			limiter.Layer{Name: "utc", Window: &limiter.Window{Calendar: opens, Location: time.UTC}, OnExceed: limiter.ActionDelay, MaxWait: 20 * time.Second},
			limiter.Layer{Name: "ny", Keyed: true, Window: &limiter.Window{Calendar: limiter.Calendar{From: 3*time.Hour + 40*time.Second, To: 20 * time.Hour}, ByNumber: true, DefaultLocation: ny}}))
	})
}

// keyedMatchesLayers is TestKeyedScriptMatchesLayersScript on layers.
func keyedMatchesLayers(t *testing.T, layers []limiter.Layer) {
	c := newClient(t)
	ctx := context.Background()
	keyed := newLayered(t, c, 1000, 1000, layers)
	full := newLayered(t, c, 1000, 1000, layers)
	st := step{layers: keyed.allLayers}
	if !keyed.keyedOnly(st) {
		t.Fatal("keyedOnly = false for bucket layers without the shared bucket")
	}
	outcomes := map[string]int{}
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.UnixMicro(1_800_000_000_000_000)
	for i := range 400 {
		now = now.Add(time.Duration(rng.IntN(400_000)) * time.Microsecond)
		req := backend.LayerRequest{
			Cost:       1 + rng.IntN(2),
			Keys:       map[string]string{"per-key": fmt.Sprint("k", rng.IntN(3)), "per-sender": fmt.Sprint("s", rng.IntN(2)), "strict": fmt.Sprint("x", rng.IntN(2)), "quiet": "q", "ny": fmt.Sprintf("+1212555%04d", rng.IntN(2))},
			MaxWait:    time.Duration(rng.IntN(3)) * time.Second,
			SkipShared: true,
		}
		if i%50 == 7 {
			req.Cost = 5 // above per-key's burst
		}
		late := time.Duration(rng.IntN(60_000)) * time.Microsecond // PaidLateness is 33 ms at 3/s
		switch rng.IntN(6) {
		case 0, 1:
			req.Paid = []limiter.PaidSlot{{Layer: "per-sender", Key: req.Keys["per-sender"], Due: now.Add(-late), Booked: now.Add(-late)}}
		case 2:
			req.Paid = []limiter.PaidSlot{{Layer: "per-sender", Key: "s9", Due: now}, {Layer: "per-key", Key: req.Keys["per-key"], Due: now}, {Layer: "gone", Key: "x", Due: now}} // ignored
		}
		// base: when the message goes out, as a Cluster's shared step
		// decided it (0: now, as a lease decides it).
		var base time.Duration
		if rng.IntN(2) == 0 {
			base = time.Duration(rng.IntN(2_000_000)) * time.Microsecond
		}
		keys, err := backend.LayerKeys(layers, req)
		if err != nil {
			t.Fatal(err)
		}
		got, gerr := keyed.takeKeyed(ctx, now, req, keys, st, base)
		rkeys, args, clock := full.takeArgs(now, req, keys, st, base)
		v, verr := layersScript.Run(ctx, c, rkeys, args...).Int64Slice()
		want, werr := full.takeReply(req, v, verr, clock)
		if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
			t.Fatalf("request %d %+v: error %v, layersScript's %v", i, req, gerr, werr)
		}
		if got.Granted != want.Granted || got.Wait != want.Wait || got.Limiting != want.Limiting || got.Tokens != want.Tokens || !got.At.Equal(want.At) ||
			fmt.Sprint(got.Exceeded) != fmt.Sprint(want.Exceeded) {
			t.Fatalf("request %d %+v:\n got %+v\nwant %+v", i, req, got, want)
		}
		if got.Exceeded != nil && (got.Exceeded.Reserved != want.Exceeded.Reserved || got.Exceeded.Key != want.Exceeded.Key ||
			!got.Exceeded.RetryAt.Equal(want.Exceeded.RetryAt)) {
			t.Fatalf("request %d %+v:\n got %+v\nwant %+v", i, req, *got.Exceeded, *want.Exceeded)
		}
		switch {
		case gerr != nil:
			outcomes["error"]++
		case got.Exceeded != nil && got.Exceeded.Reserved:
			outcomes["refused, slot booked"]++
		case got.Exceeded != nil:
			outcomes["refused"]++
		case !got.Granted:
			outcomes["not granted"]++
		case got.Wait > 0:
			outcomes["reserved"]++
		default:
			outcomes["granted"]++
		}
		for _, ly := range layers {
			key := req.Keys[ly.Name]
			a, err := keyed.layerStatus(ctx, now, ly.Name, key)
			if err != nil {
				t.Fatal(err)
			}
			b, err := full.layerStatus(ctx, now, ly.Name, key)
			if err != nil {
				t.Fatal(err)
			}
			if a.Tokens != b.Tokens || a.Full != b.Full {
				t.Fatalf("request %d: layer %s key %q: %+v, layersScript's %+v", i, ly.Name, key, a, b)
			}
		}
	}
	if len(outcomes) != 6 {
		t.Errorf("outcomes %v, want each of granted, reserved, not granted, refused, refused with a slot booked, error", outcomes)
	}
	t.Logf("outcomes: %v", outcomes)
}

// TestKeyedScriptReplies checks the parsing of layersKeyedScript's reply
// for several requests, and a malformed one.
func TestKeyedScriptReplies(t *testing.T) {
	c := newClient(t)
	l := newLayered(t, c, 10, 10, []limiter.Layer{
		{Name: "a", Keyed: true, Rate: 1, Burst: 2},
		{Name: "b", Keyed: true, Rate: 1, Burst: 2, OnExceed: limiter.ActionDeadLetter},
	})
	reqs := []backend.LayerRequest{{Cost: 1}, {Cost: 2}, {Cost: 1}, {Cost: 3}}
	out, errs := make([]backend.LayerResult, 4), make([]error, 4)
	l.keyedReplies(reqs, 0, "1800000000000000 1 0 0 0 250000 1 2 900000 2 -2 0 1", nil, out, errs)
	at := time.UnixMicro(1_800_000_000_000_000)
	if errs[0] != nil || !out[0].Granted || out[0].Tokens != 1 || !out[0].At.Equal(at) {
		t.Errorf("request 0: %+v, %v; want granted at %v", out[0], errs[0], at)
	}
	if errs[1] != nil || out[1].Granted || out[1].Wait != 250*time.Millisecond || out[1].Limiting != "a" {
		t.Errorf("request 1: %+v, %v; want not granted, 250ms for a", out[1], errs[1])
	}
	var le *limiter.LimitError
	if errs[2] != nil || !errors.As(out[2].Exceeded, &le) || le.Layer != "b" {
		t.Errorf("request 2: %+v, %v; want refused by b", out[2], errs[2])
	}
	if !errors.Is(errs[3], limiter.ErrCostExceedsBurst) {
		t.Errorf("request 3: %v; want ErrCostExceedsBurst", errs[3])
	}
	// Status 4: refused, the slot booked on the layer for the request's key.
	booked := []backend.LayerRequest{{Cost: 1, Keys: map[string]string{"a": "k1"}}}
	l.keyedReplies(booked, 0, "1800000000000000 4 500000 1", nil, out, errs)
	if errs[0] != nil || !errors.As(out[0].Exceeded, &le) || !le.Reserved || le.Key != "k1" || !le.RetryAt.Equal(at.Add(500*time.Millisecond)) {
		t.Errorf("a booked refusal: %+v, %v; want Reserved for key k1 at %v", out[0].Exceeded, errs[0], at.Add(500*time.Millisecond))
	}
	l.keyedReplies(booked, 0, "1800000000000000 4 500000 0", nil, out, errs)
	if !errors.Is(errs[0], backend.ErrMalformedReply) {
		t.Errorf("a booked refusal naming no layer: %v; want ErrMalformedReply", errs[0])
	}
	l.keyedReplies(reqs[:2], 0, "1800000000000000 1 0", nil, out, errs)
	if errs[0] == nil || !errors.Is(errs[1], backend.ErrMalformedReply) {
		t.Errorf("a short reply: %v, %v; want ErrMalformedReply", errs[0], errs[1])
	}
	// "m": the script stopped at a key this node does not serve; the
	// requests from there on were not run and keep their zero answers.
	clear(out)
	clear(errs)
	if n := l.keyedReplies(reqs[:3], 0, "1800000000000000 1 0 0 m", nil, out[:3], errs[:3]); n != 1 || !out[0].Granted || errs[0] != nil ||
		out[1].Granted || errs[1] != nil || out[2].Exceeded != nil {
		t.Errorf("a reply stopped after one request: %d set, %+v, %v; want 1, the first granted", n, out[:3], errs[:3])
	}
	if n := l.keyedReplies(reqs[:2], 0, "1800000000000000 m", nil, out[:2], errs[:2]); n != 0 {
		t.Errorf("a reply stopped at the first request: %d set, want 0", n)
	}
	if n := l.keyedReplies(reqs[:2], 0, "", errors.New("ERR boom"), out[:2], errs[:2]); n != 2 || errs[1] == nil {
		t.Errorf("an error: %d set, %v; want 2 with the error", n, errs[1])
	}
}

// TestLayeredBatchedKeyedConcurrent is TestLayeredBatchedConcurrent for
// requests that leave the shared bucket out, as a Bucket sends them while
// its lease pays the shared bucket: batched into calls of
// layersKeyedScript, every grant was charged on its key and nothing else
// was, and the shared bucket was not touched.
func TestLayeredBatchedKeyedConcurrent(t *testing.T) {
	c := newClient(t)
	l := newLayered(t, c, 0.001, 10000, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 0.001, Burst: 5}})
	const keys = 20
	var mu sync.Mutex
	granted := map[string]int{}
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				key := fmt.Sprint("k", (g*10+i)%keys)
				ctx, cancel := context.WithCancel(context.Background())
				if (g+i)%7 == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(i)*100*time.Microsecond)
				}
				res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": key}, SkipShared: true})
				cancel()
				if err == nil && res.Granted {
					mu.Lock()
					granted[key]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	ctx := context.Background()
	st, err := l.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 10000 {
		t.Errorf("shared tokens = %v, want 10000 (untouched)", st.Tokens)
	}
	for k := range keys {
		key := fmt.Sprint("k", k)
		ls, err := l.LayerStatus(ctx, "per-key", key)
		if err != nil {
			t.Fatal(err)
		}
		if granted[key] > 5 || math.Abs(ls.Tokens-float64(5-granted[key])) > 0.5 {
			t.Errorf("key %s: %d grants, %v tokens left; want at most 5 grants and 5 - grants left", key, granted[key], ls.Tokens)
		}
	}
}

// keyedRig is a hook that holds the first lone call until release is
// closed, fails the first pipeline's commands with NOSCRIPT, and records
// the commands of every pipeline.
type keyedRig struct {
	release chan struct{}
	held    atomic.Bool
	faked   atomic.Bool
	mu      sync.Mutex
	sent    [][]string
}

func (r *keyedRig) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *keyedRig) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if r.held.CompareAndSwap(false, true) {
			<-r.release
		}
		return next(ctx, cmd)
	}
}

func (r *keyedRig) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var names []string
		for _, c := range cmds {
			names = append(names, c.Name())
		}
		r.mu.Lock()
		r.sent = append(r.sent, names)
		r.mu.Unlock()
		if r.faked.CompareAndSwap(false, true) {
			for _, c := range cmds {
				c.SetErr(noScript{})
			}
			return noScript{}
		}
		return next(ctx, cmds)
	}
}

// TestKeyedBatchRecoversFromNoScript queues keyed-only takes behind one in
// flight: they go out as one call of layersKeyedScript, and when Redis
// answers that it has lost the script they are sent again (Script.Run,
// which loads it) and granted, charged once each.
func TestKeyedBatchRecoversFromNoScript(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	l := newLayered(t, c, 1000, 1000, []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 0.001, Burst: 5}})
	ctx := context.Background()
	take := func(key string) (backend.LayerResult, error) {
		return l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": key}, SkipShared: true})
	}
	if _, err := take("warm"); err != nil { // loads the script
		t.Fatal(err)
	}
	rig := &keyedRig{release: make(chan struct{})}
	c.AddHook(rig)
	type outcome struct {
		res backend.LayerResult
		err error
	}
	first := make(chan outcome, 1)
	go func() { res, err := take("first"); first <- outcome{res, err} }()
	for !rig.held.Load() {
		time.Sleep(time.Millisecond)
	}
	outs := make([]chan outcome, 4)
	for i := range outs {
		outs[i] = make(chan outcome, 1)
		go func() { res, err := take(fmt.Sprint("k", i)); outs[i] <- outcome{res, err} }()
	}
	for {
		l.batch.mu.Lock()
		n := len(l.batch.queue)
		l.batch.mu.Unlock()
		if n == len(outs) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(rig.release)
	if o := <-first; o.err != nil || !o.res.Granted {
		t.Fatalf("first take: %+v, %v", o.res, o.err)
	}
	for i, ch := range outs {
		if o := <-ch; o.err != nil || !o.res.Granted || o.res.Tokens != 1 {
			t.Errorf("take %d = %+v, %v; want granted 1", i, o.res, o.err)
		}
	}
	rig.mu.Lock()
	sent := rig.sent
	rig.mu.Unlock()
	if len(sent) != 1 || len(sent[0]) != 1 || sent[0][0] != "evalsha" {
		t.Errorf("pipelines sent: %v; want one with one evalsha for the 4 queued takes", sent)
	}
	for i := range outs {
		st, err := l.LayerStatus(ctx, "per-key", fmt.Sprint("k", i))
		if err != nil || math.Abs(st.Tokens-4) > 0.01 {
			t.Errorf("key k%d: %+v, %v; want 4 tokens (charged once)", i, st, err)
		}
	}
}

// TestKeyedPolicyLayers: a budget is not a token bucket, and
// layersKeyedScript does not know it, so a leased request (SkipShared) on
// a budget goes to layersScript; a send window is decided by
// layersKeyedScript. Before this, an always-open window or a budget with
// room refused every leased request with "cost 1 exceeds burst 0":
// `throttle run` with a window or a budget at a rate that leases
// dead-lettered every message.
func TestKeyedPolicyLayers(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	for _, ly := range []limiter.Layer{
		{Name: "quiet", Keyed: true, Window: &limiter.Window{Calendar: limiter.Calendar{From: 0, To: 24 * time.Hour}, Location: time.UTC}},
		{Name: "spend", Budget: 1_000_000, Per: limiter.PerDay},
		{Name: "tenant", Keyed: true, Budget: 1_000_000, Per: limiter.PerDay},
	} {
		t.Run(ly.Name, func(t *testing.T) {
			l := newLayered(t, c, 1000, 1000, []limiter.Layer{ly, {Name: "per-key", Keyed: true, Rate: 10, Burst: 10}})
			if got, want := l.keyedOnly(step{layers: l.allLayers}), ly.Window != nil; got != want {
				t.Errorf("keyedOnly = %v for a %s layer, want %v", got, ly.Name, want)
			}
			req := backend.LayerRequest{Cost: 1, Price: 1000, SkipShared: true,
				Keys: map[string]string{ly.Name: "+12125550100", "per-key": "a"}}
			res, err := l.TakeLayers(ctx, req)
			if err != nil || !res.Granted {
				t.Fatalf("leased take on an open %s layer: %+v, %v; want granted", ly.Name, res, err)
			}
		})
	}
}

// keyedCalls counts the calls of layersKeyedScript and layersScript a
// client sends (alone or in pipelines).
type keyedCalls struct{ keyed, layers atomic.Int64 }

func (h *keyedCalls) count(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") {
		return
	}
	switch fmt.Sprint(args[1]) {
	case layersKeyedScript.Hash(), layersKeyedSrc:
		h.keyed.Add(1)
	case layersScript.Hash():
		h.layers.Add(1)
	}
}

func (h *keyedCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *keyedCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h *keyedCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}

// TestLeasedWindowsAskNothing: a Bucket whose only layer is a send window,
// open all day, leasing its shared tokens, decides its leased requests
// itself, against its estimate of Redis's clock: no call decides them (the
// lease refills still go to layersScript). Before this, every leased
// request went to Redis.
func TestLeasedWindowsAskNothing(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	calls := &keyedCalls{}
	c.AddHook(calls)
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 1e6, Burst: 1e6})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.WithLayers([]limiter.Layer{{Name: "quiet", Keyed: true, Window: &limiter.Window{
		Calendar: limiter.Calendar{From: 0, To: 24 * time.Hour}, ByNumber: true, DefaultLocation: time.UTC}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.New(l, limiter.Options{Lease: limiter.LeaseOptions{MinBatch: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := testenv.Context(t, 30*time.Second)
	// The replica count and Redis's clock known first, as after a
	// replica's start: leasing waits for the one, the window's local
	// decision for the other.
	if err := b.Check(ctx); err != nil {
		t.Fatal(err)
	}
	const n, callers = 4000, 16
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := range n / callers {
				req := limiter.Request{Cost: 1, Keys: map[string]string{"quiet": fmt.Sprintf("+1212555%04d", (g*n/callers+i)%10000)}}
				if err := b.WaitN(ctx, req); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	st := b.Stats()
	t.Logf("%d requests: %d keyed script calls, %d layers script calls; %+v", n, calls.keyed.Load(), calls.layers.Load(), st)
	if k := calls.keyed.Load(); k != 0 {
		t.Errorf("%d keyed script calls, want 0: a leased request in an open window asks nothing", k)
	}
	if lc := calls.layers.Load(); lc > n/4 {
		t.Errorf("%d layers script calls for %d requests: the lease did not serve them", lc, n)
	}
}
