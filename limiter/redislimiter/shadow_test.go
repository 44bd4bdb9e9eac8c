package redislimiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// TestShadowSharedBucket: a Bucket with Options.Shadow on a Redis bucket of
// 1/s (burst 1) grants 20 waits at once, counts the would-waits of the
// shadow, and leaves the real bucket's state alone (full); the shadow's
// own state key holds the charge. A plain Store, which decides no layers,
// is refused.
func TestShadowSharedBucket(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	name := testenv.Name(t, "shadow")
	s := newStore(t, c, name, 1, 1)
	if _, err := limiter.New(s, limiter.Options{Shadow: true}); !errors.As(err, new(*limiter.ParamError)) {
		t.Fatalf("New(plain Store, Shadow) = %v, want a *ParamError", err)
	}
	ls, err := s.WithLayers(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.New(ls, limiter.Options{Shadow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	for i := range 20 {
		if err := b.Wait(wctx, 1); err != nil {
			t.Fatalf("Wait %d: %v (enforced at 1/s, 20 take 19 s)", i, err)
		}
	}
	took := time.Since(start)
	// A token comes back each second: those taken then are not counted.
	if got, most := b.Stats().Exceeded[""], int64(19); got < most-int64(took/time.Second)-1 || got > most {
		t.Errorf("shadow would-waits = %d over %v, want about %d", got, took, most)
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 1 {
		t.Errorf("real bucket tokens = %v, want 1: never charged", st.Tokens)
	}
	if n, err := c.Exists(ctx, ls.shadowKey).Result(); err != nil || n != 1 {
		t.Errorf("shadow state key %s exists = %d, %v; want 1", ls.shadowKey, n, err)
	}
	if err := s.Admin().Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, ls.shadowKey).Result(); err != nil || n != 0 {
		t.Errorf("after Reset, shadow state key exists = %d, %v; want 0", n, err)
	}
}
