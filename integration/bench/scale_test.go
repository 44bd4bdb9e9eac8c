package main

import (
	"testing"
	"time"
)

func TestScaleFigures(t *testing.T) {
	// 3 s of 1 ms bins: 1 grant a ms, and 100 more at 1500 ms.
	bins := make([]int64, 3000)
	for i := range bins {
		bins[i] = 1
	}
	bins[1500] += 100
	if got := worstWindow(bins); got != 1100 {
		t.Errorf("worstWindow %d, want 1100", got)
	}
	if got := sumBins(bins, -5, 10); got != 10 {
		t.Errorf("sumBins(-5, 10) %d, want 10 (clipped)", got)
	}
	if lo, hi := shareSpread([]int64{50, 100, 150}); lo != 0.5 || hi != 1.5 {
		t.Errorf("shareSpread %v–%v, want 0.5–1.5", lo, hi)
	}
	// The survivors run at half the rate for a second after the vanish
	// at 1 s, then at the rate: 0.9× holds from the second second on.
	surv := make([]int64, 4000)
	for i := 1000; i < 4000; i++ {
		surv[i] = 1
		if i < 2000 && i%2 == 0 {
			surv[i] = 0
		}
	}
	r := recovery(surv, surv, time.Second, 4*time.Second, 1000)
	if len(r.after) != 3 || r.after[0] != 500 || r.reached != 1 {
		t.Errorf("recovery after %v reached %d, want [500 1000 1000] from second index 1", r.after, r.reached)
	}
}
