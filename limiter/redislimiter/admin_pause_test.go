package redislimiter

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// TestAdminPauseAndResume: an operator's pause stops the bucket for every
// replica and says who set it; Resume ends it, and a push-back pause too,
// each change announced on the bucket's channel; Resume of a bucket that
// is not paused changes and announces nothing.
func TestAdminPauseAndResume(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	name := uniqueBucket(t, c)
	s, err := New(c, Config{Bucket: name, Rate: 10, Burst: 5})
	if err != nil {
		t.Fatal(err)
	}
	var heard atomic.Int32
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(wctx, func() { heard.Add(1) }, nil) }()
	defer func() { stop(); <-done }()
	// The subscription is up once an announcement is heard.
	a, err := NewAdmin(c, AdminConfig{Bucket: name, Rate: 10, Burst: 5})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the watch to hear a fill", func() bool { _ = a.Fill(ctx); return heard.Load() > 0 })

	if err := a.Pause(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	st, err := a.Status(ctx)
	if err != nil || st.PausedFor < 59*time.Second || st.PausedBy != PausedByOperator {
		t.Fatalf("after Pause(1m): %+v, %v; want paused a minute by %q", st, err, PausedByOperator)
	}
	before := heard.Load()
	ended, err := a.Resume(ctx)
	if err != nil || !ended {
		t.Fatalf("Resume = %v, %v; want true", ended, err)
	}
	if st, err := a.Status(ctx); err != nil || st.PausedFor != 0 || st.PausedBy != "" {
		t.Fatalf("after Resume: %+v, %v; want not paused", st, err)
	}
	waitFor(t, "the resume announced", func() bool { return heard.Load() > before })
	if ended, err := a.Resume(ctx); err != nil || ended {
		t.Fatalf("Resume of a bucket not paused = %v, %v; want false", ended, err)
	}

	// A sink's push-back pause ends too.
	if err := s.PauseBy(ctx, time.Minute, "r1"); err != nil {
		t.Fatal(err)
	}
	if ended, err := a.Resume(ctx); err != nil || !ended {
		t.Fatalf("Resume of a push-back pause = %v, %v; want true", ended, err)
	}
	if st, err := s.Status(ctx); err != nil || st.PausedFor != 0 {
		t.Fatalf("the store after Resume: %+v, %v; want not paused", st, err)
	}
}

// TestAdminPauseRefusesBadInput: a pause out of range is a ParamError
// naming D, and an Admin that knows no limits (no config, no override with
// a burst) refuses with ErrLimitsUnknown rather than write a bucket it
// cannot compute.
func TestAdminPauseRefusesBadInput(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	name := uniqueBucket(t, c)
	a, err := NewAdmin(c, AdminConfig{Bucket: name, Rate: 10, Burst: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{0, -time.Second, MaxAdminPause + time.Second} {
		var pe *limiter.ParamError
		if err := a.Pause(ctx, d); !errors.As(err, &pe) || pe.Param != "D" {
			t.Errorf("Pause(%v) = %v; want a ParamError naming D", d, err)
		}
	}
	blind, err := NewAdmin(c, AdminConfig{Bucket: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := blind.Pause(ctx, time.Second); !errors.Is(err, ErrLimitsUnknown) {
		t.Errorf("Pause without limits = %v; want ErrLimitsUnknown", err)
	}
	if _, err := blind.Resume(ctx); !errors.Is(err, ErrLimitsUnknown) {
		t.Errorf("Resume without limits = %v; want ErrLimitsUnknown", err)
	}
	// An override with a burst gives the limits.
	if err := blind.SetOverride(ctx, 20, 4, 0); err != nil {
		t.Fatal(err)
	}
	if err := blind.Pause(ctx, time.Minute); err != nil {
		t.Fatalf("Pause with an override's limits: %v", err)
	}
	if st, err := blind.Status(ctx); err != nil || st.PausedFor < 59*time.Second {
		t.Fatalf("after Pause: %+v, %v", st, err)
	}
}
