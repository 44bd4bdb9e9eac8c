package main

import (
	"math"
	"testing"
	"time"
)

func TestE2ERunFigures(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	// A burst of 3 at 0 ms, then one every 100 ms up to 3 s.
	arr := ms(0, 0, 0)
	for at := 100; at <= 3000; at += 100 {
		arr = append(arr, ms(at)...)
	}
	r := e2eRun{arrivals: arr}
	if got := r.elapsed(); got != 3*time.Second {
		t.Errorf("elapsed %v, want 3s", got)
	}
	if got, want := r.perSecond(), float64(len(arr)-1)/3; math.Abs(got-want) > 1e-9 {
		t.Errorf("perSecond %v, want %v", got, want)
	}
	// From 1 s to 3 s: arrivals at 1100 … 3000 after the one at 1000 ms,
	// 20 in 2 s.
	if got := r.steadyRate(); math.Abs(got-10) > 1e-9 {
		t.Errorf("steadyRate %v, want 10/s", got)
	}
	// The burst and the arrivals up to 900 ms: 3 + 9 in [0, 1 s).
	if got := r.maxWindow(); got != 12 {
		t.Errorf("maxWindow %d, want 12", got)
	}
	if got := (e2eRun{}).steadyRate(); got != 0 {
		t.Errorf("steadyRate of no arrivals %v, want 0", got)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
