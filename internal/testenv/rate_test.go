package testenv

import (
	"math"
	"testing"
	"time"
)

func TestRateFloor(t *testing.T) {
	for _, tt := range []struct {
		stall time.Duration
		want  float64
	}{
		{0, 48.5},                      // 3% below 50/s
		{100 * time.Millisecond, 48.5}, // the bucket stores 5 tokens: nothing lost
		{600 * time.Millisecond, 590 / (590/48.5 + 0.5)},
	} {
		if got := RateFloor(50, 5, 590, tt.stall); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("RateFloor(50, 5, 590, %v) = %v, want %v", tt.stall, got, tt.want)
		}
	}
}

func TestWindowBound(t *testing.T) {
	for _, tt := range []struct {
		stall time.Duration
		want  int
	}{
		{0, 30},
		{50 * time.Millisecond, 30}, // within one interval at 20/s
		{120 * time.Millisecond, 33},
	} {
		if got := WindowBound(30, 20, tt.stall); got != tt.want {
			t.Errorf("WindowBound(30, 20, %v) = %d, want %d", tt.stall, got, tt.want)
		}
	}
}

func TestMeasureStalls(t *testing.T) {
	s := MeasureStalls(t)
	// A timer never fires early, so the first probe to end measures some
	// lateness. On a loaded machine the probe may not run for a while:
	// wait for it (not a fixed 50 ms, which a suite's parallel packages
	// on 2 cores once outlasted), then bound what it measured.
	start := time.Now()
	Within(10*time.Second, func() bool { return s.Max() > 0 })
	if s.Max() <= 0 || s.Max() > 10*time.Second {
		t.Errorf("Max = %v after %v, want a positive lateness within 10s", s.Max(), time.Since(start).Round(time.Millisecond))
	}
}
