package redislimiter

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// flightRig is a hook that holds every script call, lone or in a
// pipeline, until the test lets it go: each announces itself on started,
// with its commands' names and its own gate, and proceeds when the gate
// is closed.
type flightRig struct {
	started chan heldFlight
	off     atomic.Bool // holds nothing once set
}

type heldFlight struct {
	names []string
	gate  chan struct{}
}

func (r *flightRig) hold(names []string) {
	if r.off.Load() {
		return
	}
	f := heldFlight{names: names, gate: make(chan struct{})}
	r.started <- f
	<-f.gate
}

func (r *flightRig) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *flightRig) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			r.hold([]string{n})
		}
		return next(ctx, cmd)
	}
}

func (r *flightRig) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmds) // a new connection's handshake
		}
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		r.hold(names)
		return next(ctx, cmds)
	}
}

// next returns the next call held, failing the test when none comes.
func (r *flightRig) next(t *testing.T, what string) heldFlight {
	t.Helper()
	select {
	case f := <-r.started:
		return f
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no call sent", what)
		return heldFlight{}
	}
}

// TestLayerFlights: the batcher keeps up to two flights out at once. A
// take that arrives while one is out is sent at once, without waiting
// for it, carrying the releases queued meanwhile ahead of it in its
// pipeline (so that it gets the slot they freed); takes that arrive while
// two are out queue, and go as one call when either returns. With one
// flight (before), the second take waited for the first flight to return:
// about one and a half round trips for a caller that finds a flight out.
func TestLayerFlights(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	layers := []limiter.Layer{{Name: "conc", Keyed: true, Concurrency: 1, Lease: time.Minute}}
	l := newLayered(t, c, 1000, 1000, layers)
	if got := l.batch.maxFlights(); got != 2 {
		t.Fatalf("flights = %d, want 2", got)
	}
	ctx := context.Background()
	type outcome struct {
		res backend.LayerResult
		err error
	}
	take := func(key, holder string) <-chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, Keys: map[string]string{"conc": key}, SkipShared: true, Holder: holder})
			ch <- outcome{res, err}
		}()
		return ch
	}
	granted := func(what string, ch <-chan outcome) {
		t.Helper()
		select {
		case o := <-ch:
			if o.err != nil || !o.res.Granted {
				t.Errorf("%s = %+v, %v; want granted", what, o.res, o.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not return", what)
		}
	}
	// Load the scripts of the take and the release; h1 holds a's slot.
	granted("take(a, h1)", take("a", "h1"))
	if err := l.ReleaseSlots(ctx, backend.Slots(layers, []string{"z"}, "h9")); err != nil {
		t.Fatal(err)
	}
	rig := &flightRig{started: make(chan heldFlight)}
	c.AddHook(rig)

	first := take("b", "h0")
	f1 := rig.next(t, "take(b, h0)")
	if !slices.Equal(f1.names, []string{"evalsha"}) {
		t.Errorf("first flight: %v; want one evalsha, alone", f1.names)
	}
	if err := l.ReleaseSlots(ctx, backend.Slots(layers, []string{"a"}, "h1")); err != nil { // queued: a flight is out
		t.Fatal(err)
	}
	second := take("a", "h2")
	f2 := rig.next(t, "take(a, h2) while one flight is out")
	if !slices.Equal(f2.names, []string{"evalsha", "evalsha"}) {
		t.Errorf("second flight: %v; want the release and the take in one pipeline", f2.names)
	}
	third, fourth := take("c", "h3"), take("d", "h4")
	if !testenv.Within(5*time.Second, func() bool {
		l.batch.mu.Lock()
		defer l.batch.mu.Unlock()
		return len(l.batch.queue) == 2
	}) {
		t.Fatal("the takes sent while two flights are out did not queue")
	}
	close(f2.gate)
	granted("take(a, h2) after h1's release", second)
	f3 := rig.next(t, "the queued takes")
	if !slices.Equal(f3.names, []string{"evalsha"}) {
		t.Errorf("third flight: %v; want one evalsha for both queued takes", f3.names)
	}
	close(f3.gate)
	granted("take(c, h3)", third)
	granted("take(d, h4)", fourth)
	close(f1.gate)
	granted("take(b, h0)", first)
	rig.off.Store(true)
	l.batch.mu.Lock()
	inflight, queued := l.batch.inflight, len(l.batch.queue)
	l.batch.mu.Unlock()
	if inflight != 0 || queued != 0 {
		t.Errorf("after the last flight: %d in flight, %d queued; want none", inflight, queued)
	}
	st, err := l.LayerStatus(ctx, "conc", "a")
	if err != nil || st.Used != 1 {
		t.Errorf("slots of a held: %+v, %v; want 1 (h2's)", st, err)
	}
}
