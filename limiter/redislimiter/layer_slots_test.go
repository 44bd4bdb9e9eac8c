package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
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
