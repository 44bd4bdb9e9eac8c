package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// TestWaitAndAllowSkipNoLayer: on a store with a keyed layer, Wait and
// Allow cannot name the message's key, so they fail with ErrMissingKey and
// take nothing; they used to decide the shared bucket alone, so a
// per-recipient layer at 1/s let 5 messages of one recipient through
// 0–1 ms apart. On a store whose layers have no keys they decide them.
func TestWaitAndAllowSkipNoLayer(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	keyed := newLayeredClocked(t, clk, 100, 10, 1, limiter.Layer{Name: "per-key", Keyed: true, Rate: 1, Burst: 1})
	b := newLayeredBucket(t, clk, keyed)
	ctx := context.Background()
	if err := b.Wait(ctx, 1); !errors.Is(err, limiter.ErrMissingKey) {
		t.Errorf("Wait on a keyed layer = %v, want ErrMissingKey", err)
	}
	if ok, err := b.Allow(ctx, 1); ok || !errors.Is(err, limiter.ErrMissingKey) {
		t.Errorf("Allow on a keyed layer = %v, %v, want false, ErrMissingKey", ok, err)
	}
	if st := keyed.m.StatusAt(clk.Now()); !nearTokens(st.Tokens, 10) {
		t.Errorf("shared tokens = %v, want 10: nothing taken", st.Tokens)
	}

	shared := newLayeredClocked(t, clk, 100, 10, 1, limiter.Layer{Name: "all", Rate: 1, Burst: 2})
	b = newLayeredBucket(t, clk, shared)
	for i, want := range []bool{true, true, false} {
		ok, err := b.Allow(ctx, 1)
		if err != nil || ok != want {
			t.Errorf("Allow %d on a layer of burst 2 = %v, %v, want %v", i, ok, err, want)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	if err := b.Wait(wctx, 1); err == nil {
		t.Error("Wait on an empty layer returned at once, want it to wait for the layer")
	}
	if st := shared.m.StatusAt(clk.Now()); !nearTokens(st.Tokens, 8) {
		t.Errorf("shared tokens = %v, want 8: the two granted", st.Tokens)
	}
}

// TestClosedBucketTakesNothing: after Close, Allow, Wait and WaitN return
// ErrClosed and take nothing. Allow used to take from the shared bucket
// (5 of 10 calls returned true).
func TestClosedBucketTakesNothing(t *testing.T) {
	clk := clocktest.New(storetest.Base)
	s := newClockedStore(t, clk, 100, 10, 1)
	b := newClockedBucket(t, clk, s, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}}, s.watched)
	b.Close()
	ctx := context.Background()
	for range 10 {
		if ok, err := b.Allow(ctx, 1); ok || !errors.Is(err, limiter.ErrClosed) {
			t.Fatalf("Allow after Close = %v, %v, want false, ErrClosed", ok, err)
		}
	}
	if err := b.Wait(ctx, 1); !errors.Is(err, limiter.ErrClosed) {
		t.Errorf("Wait after Close = %v, want ErrClosed", err)
	}
	if err := b.WaitN(ctx, limiter.Request{Cost: 1}); !errors.Is(err, limiter.ErrClosed) {
		t.Errorf("WaitN after Close = %v, want ErrClosed", err)
	}
	if st := s.mem().StatusAt(clk.Now()); !nearTokens(st.Tokens, 10) {
		t.Errorf("tokens = %v, want 10: nothing taken after Close", st.Tokens)
	}
}

// TestWaitWhileClosedSaysWhy: a Wait that ctx ends while the store-failure
// policy keeps the Bucket closed returns an error that matches ctx's and
// the store error that closed it; it used to be a bare "context deadline
// exceeded".
func TestWaitWhileClosedSaysWhy(t *testing.T) {
	for _, c := range []struct {
		name   string
		opts   limiter.Options
		break_ func(*clockedStore)
		want   error
	}{
		{"an outage under on_store_error closed", limiter.Options{OnStoreError: limiter.ModeClosed}, func(s *clockedStore) { s.down.Store(true) }, limiter.ErrStore},
		{"a refused client", limiter.Options{}, func(s *clockedStore) { s.refuse.Store(true) }, limiter.ErrMisconfigured},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := clocktest.New(storetest.Base)
			s := newClockedStore(t, clk, 100, 10, 1)
			c.opts.Lease.Disabled = true
			b := newClockedBucket(t, clk, s, c.opts, s.watched)
			c.break_(s)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- b.Wait(ctx, 1) }()
			deadline := time.Now().Add(10 * time.Second)
			for b.Mode() != limiter.ModeClosed {
				if time.Now().After(deadline) {
					t.Fatalf("mode %s, want closed", b.Mode())
				}
				time.Sleep(time.Millisecond)
			}
			cancel()
			err := <-done
			if !errors.Is(err, context.Canceled) || !errors.Is(err, c.want) {
				t.Errorf("Wait = %v, want it to match context.Canceled and %v", err, c.want)
			}
		})
	}
}
