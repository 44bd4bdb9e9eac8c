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
