package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// TestWaitGrantNamesTheLayer: WaitGrant says how long each granted call
// waited and which layer set the wait: the keyed layer for a recipient's
// second message, "" for the shared bucket, and "" when nothing waited.
func TestWaitGrantNamesTheLayer(t *testing.T) {
	ctx := context.Background()
	keyed := func(to string) limiter.Request {
		return limiter.Request{Cost: 1, Keys: map[string]string{"per-recipient": to}}
	}
	cases := []struct {
		name       string
		rate       float64
		burst      int
		layer      limiter.Layer
		reqs       []limiter.Request
		wantLayers []string
		waits      []bool // whether the call must have waited about 50 ms
	}{
		{"the keyed layer", 1000, 100, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 20, Burst: 1},
			[]limiter.Request{keyed("a"), keyed("a"), keyed("b")}, []string{"", "per-recipient", ""}, []bool{false, true, false}},
		{"the shared bucket", 20, 1, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 1000, Burst: 100},
			[]limiter.Request{keyed("a"), keyed("b")}, []string{"", ""}, []bool{false, true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := limiter.NewLocal(c.rate, c.burst, c.layer)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			for i, req := range c.reqs {
				g, err := b.WaitGrant(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if g.Layer != c.wantLayers[i] {
					t.Errorf("call %d: layer %q, want %q", i+1, g.Layer, c.wantLayers[i])
				}
				// A wait of 50 ms (one token at 20/s); no upper bound on a
				// loaded machine beyond the wait itself being reported.
				if c.waits[i] && g.Waited < 30*time.Millisecond {
					t.Errorf("call %d waited %v, want about 50ms", i+1, g.Waited)
				}
				if !c.waits[i] && g.Waited >= 30*time.Millisecond && g.Layer != "" {
					t.Errorf("call %d: %v set by %q, want no wait", i+1, g.Waited, g.Layer)
				}
			}
		})
	}
	b, _ := limiter.NewLocal(10, 1)
	defer b.Close()
	if g, err := b.WaitGrant(ctx, limiter.Request{Cost: 1}); err != nil || g.Layer != "" {
		t.Fatalf("WaitGrant without layers = %+v, %v", g, err)
	}
}
