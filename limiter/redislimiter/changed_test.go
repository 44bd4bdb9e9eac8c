package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// TestStatusSaysWhenTheSettingsChanged: every change that the replicas
// hear (an override set or cleared, a pause, a resume, a fill) records the
// instant from which the bucket refills at the new settings, and Status
// reports it, so that replicas reading the change at different instants
// move their reservations from the same instant. Without it, a replica
// that read a rate cut later moved its reservations forward by the time in
// between, into pairs with another replica's.
func TestStatusSaysWhenTheSettingsChanged(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 10, Burst: 5})
	if err != nil {
		t.Fatal(err)
	}
	a := s.Admin()
	steps := []struct {
		name   string
		change func() error
	}{
		{"override set", func() error { return a.SetOverride(ctx, 2, 0, 0) }},
		{"pause", func() error { return a.Pause(ctx, 50*time.Millisecond) }},
		{"resume", func() error { _, err := a.Resume(ctx); return err }},
		{"fill", func() error { return a.Fill(ctx) }},
		{"override cleared", func() error { return a.ClearOverride(ctx) }},
	}
	var last time.Time
	for _, step := range steps {
		// A reservation ahead keeps the state, as in a queue.
		if _, err := s.Take(ctx, backend.TakeRequest{Cost: 5, MaxWait: time.Minute}); err != nil {
			t.Fatal(err)
		}
		before, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := step.change(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		st, err := s.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// An override applies from the last take, which is before it.
		lo := before
		if step.name == "override set" || step.name == "override cleared" {
			lo = before.Add(-time.Second)
		}
		if st.Changed.Before(lo) || st.Changed.After(st.At) || !st.Changed.After(last) {
			t.Fatalf("%s: Changed = %v, want in [%v, %v] and after the previous change %v", step.name, st.Changed, lo, st.At, last)
		}
		last = st.Changed
	}
}
