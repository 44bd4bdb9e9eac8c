package redislimiter

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestWatchReportsAChangeAfterResubscribing cuts the subscription's
// connection and changes the bucket while it is down: the announcement is
// lost, so Watch must report a change once it has subscribed again.
func TestWatchReportsAChangeAfterResubscribing(t *testing.T) {
	r := newSplitRig(t, 10)
	watched := newStore(t, r.viaProxy, r.name, 10, 1)

	var changes atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watched.Watch(ctx, func() { changes.Add(1) }, nil)
	}()
	t.Cleanup(func() { cancel(); <-done })

	waitFor(t, "subscribed", func() bool { return r.subscribers(ctx) == 1 })
	if n := changes.Load(); n != 0 {
		t.Fatalf("%d changes reported on the first subscription, want 0", n)
	}
	if err := r.admin.Admin().Fill(ctx); err != nil { // announced while subscribed
		t.Fatal(err)
	}
	waitFor(t, "the announced fill", func() bool { return changes.Load() == 1 })

	r.proxy.Block() // new connections wait, so the override lands while the subscription is down
	r.proxy.Cut()
	waitFor(t, "unsubscribed", func() bool { return r.subscribers(ctx) == 0 })
	if err := r.admin.Admin().SetOverride(ctx, 50, 0, time.Minute); err != nil { // announced to nobody
		t.Fatal(err)
	}
	if n := changes.Load(); n != 1 {
		t.Fatalf("%d changes while the subscription was down, want still 1", n)
	}
	r.proxy.Unblock()
	waitFor(t, "resubscribed", func() bool { return r.subscribers(ctx) == 1 })
	waitFor(t, "a change reported after resubscribing", func() bool { return changes.Load() == 2 })
}
