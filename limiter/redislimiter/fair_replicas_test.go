package redislimiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// TestFairRefusalSpacingPerReplica: with two live replicas, a refusal for
// the tenant's share to set aside carries the tenant's pace times two, so
// that the two replicas, each setting aside about half of the tenant's
// messages, bring them back at its pace together, not at twice it.
func TestFairRefusalSpacingPerReplica(t *testing.T) {
	c := newClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := newLayered(t, c, 0.1, 1, nil).WithFair(limiter.Fair{Horizon: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Del(context.Background(), l.fairKeys()...) })
	var bs []*limiter.Bucket
	for _, id := range []string{"r1", "r2"} {
		b, err := limiter.New(l, limiter.Options{ReplicaID: id, Lease: limiter.LeaseOptions{Disabled: true}, MaxReserve: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := b.Check(ctx); err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	b := bs[0]
	if err := b.Check(ctx); err != nil || b.Stats().Replicas != 2 {
		t.Fatalf("replicas = %d (%v), want 2", b.Stats().Replicas, err)
	}
	// a takes the full bucket's token, books its share of the horizon (2
	// at 0.1/s, 10 s apart), then one more waits for its share.
	req := limiter.Request{Cost: 1, Tenant: "a", FairWaiting: 100}
	for range 4 {
		// Each its own copy: req changes below while a goroutine may
		// not have read it yet (the race detector caught one).
		go func(req limiter.Request) { _ = b.WaitN(ctx, req) }(req)
	}
	for deadline := time.Now().Add(5 * time.Second); b.Stats().Waiting < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of a's requests waiting, want 3", b.Stats().Waiting)
		}
		time.Sleep(time.Millisecond)
	}
	// Then a request that may not wait for the share, once the 4th
	// waits for it: refused at once.
	req.FairWaiting = 1
	var le *limiter.LimitError
	for deadline := time.Now().Add(5 * time.Second); ; {
		// No deadline (a wait beyond it fails at once): a cancel
		// ends a request that came before the 4th and waits.
		tctx, cancel := context.WithCancel(ctx)
		stop := time.AfterFunc(300*time.Millisecond, cancel)
		before := b.Stats().Replicas
		err := b.WaitN(tctx, req)
		stop.Stop()
		cancel()
		// A refusal counts when both replicas were live around it: on a
		// loaded machine, r2's heartbeat may come late, and a refusal
		// decided meanwhile spaces by one replica (9.994 s once).
		if errors.As(err, &le) && le.Layer == limiter.FairLayer && before == 2 && b.Stats().Replicas == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a's 5th request: %v, want a refusal by %q", err, limiter.FairLayer)
		}
	}
	// a's reservations come due 10 s apart.
	if le.Spacing < 19*time.Second || le.Spacing > 20*time.Second {
		t.Errorf("Spacing = %v, want a's pace (10 s) times the 2 replicas", le.Spacing)
	}
}
