package limiter_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

func (m clockedMemory) DecreaseAt(now time.Time, a limiter.Adaptive) (float64, bool, error) {
	if err := a.Validate(); err != nil {
		return 0, false, err
	}
	r, ok := m.Memory.DecreaseAt(now, a)
	return r, ok, nil
}

func TestMemoryAdaptiveSteps(t *testing.T) {
	storetest.RunAdaptive(t, func(t *testing.T, rate float64, burst int) storetest.AdaptiveClockedStore {
		m, err := limiter.NewMemory(rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		return clockedMemory{m}
	})
}

func TestAdaptiveValidate(t *testing.T) {
	for _, c := range []struct {
		a     limiter.Adaptive
		param string
	}{
		{limiter.Adaptive{}, "Adaptive.MinRate"},
		{limiter.Adaptive{MinRate: 1, Decrease: 1}, "Adaptive.Decrease"},
		{limiter.Adaptive{MinRate: 1, Decrease: -0.5}, "Adaptive.Decrease"},
		{limiter.Adaptive{MinRate: 1, Increase: -1}, "Adaptive.Increase"},
		{limiter.Adaptive{MinRate: 1, Interval: -time.Second}, "Adaptive.Interval"},
		{limiter.Adaptive{MinRate: 1, MergeWindow: -time.Second}, "Adaptive.MergeWindow"},
	} {
		err := c.a.Validate()
		var pe *limiter.ParamError
		if !errors.As(err, &pe) || pe.Param != c.param {
			t.Errorf("%+v: Validate = %v, want a ParamError for %s", c.a, err, c.param)
		}
	}
	if err := (limiter.Adaptive{MinRate: 5, Decrease: 0.7, Increase: 1, Interval: time.Second}).Validate(); err != nil {
		t.Errorf("valid: %v", err)
	}
	m, err := limiter.NewMemory(10, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, err = limiter.New(m, limiter.Options{Adaptive: &limiter.Adaptive{}})
	var pe *limiter.ParamError
	if !errors.As(err, &pe) || pe.Param != "Adaptive.MinRate" {
		t.Errorf("New with Adaptive{}: %v, want Adaptive.MinRate", err)
	}
}

// TestAdaptiveValidateFor: a floor above the bucket's configured rate is an
// error of MinRate; at the rate, or with a rate that is itself invalid
// (reported by ValidateRate), only Validate's rules apply.
func TestAdaptiveValidateFor(t *testing.T) {
	for _, c := range []struct {
		a     limiter.Adaptive
		rate  float64
		param string // "" means valid
	}{
		{limiter.Adaptive{MinRate: 20}, 10, "Adaptive.MinRate"},
		{limiter.Adaptive{MinRate: 10.5}, 10, "Adaptive.MinRate"},
		{limiter.Adaptive{MinRate: 10}, 10, ""},
		{limiter.Adaptive{MinRate: 5}, 10, ""},
		{limiter.Adaptive{MinRate: 20}, 0, ""},
		{limiter.Adaptive{MinRate: 5, Decrease: 2}, 10, "Adaptive.Decrease"},
	} {
		err := c.a.ValidateFor(c.rate)
		if c.param == "" {
			if err != nil {
				t.Errorf("%+v at rate %g: %v, want nil", c.a, c.rate, err)
			}
			continue
		}
		var pe *limiter.ParamError
		if !errors.As(err, &pe) || pe.Param != c.param {
			t.Errorf("%+v at rate %g: %v, want a ParamError for %s", c.a, c.rate, err, c.param)
		}
	}
	err := limiter.Adaptive{MinRate: 20}.ValidateFor(10)
	if err == nil || !strings.Contains(err.Error(), "10") {
		t.Errorf("error %v does not name the rate", err)
	}
}

// TestBucketPauseLowersAdaptiveRate: a push-back (Pause) through a Bucket
// with Options.Adaptive lowers the store's rate; without it, it does not.
func TestBucketPauseLowersAdaptiveRate(t *testing.T) {
	for _, adaptive := range []bool{false, true} {
		m, err := limiter.NewMemory(100, 100)
		if err != nil {
			t.Fatal(err)
		}
		opts := limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}}
		if adaptive {
			opts.Adaptive = &limiter.Adaptive{MinRate: 5}
		}
		b, err := limiter.New(m, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Pause(context.Background(), time.Millisecond); err != nil {
			t.Fatal(err)
		}
		want := 100.0
		if adaptive {
			want = 70
		}
		// Read right after the pause ends; the climb is 1/s per second.
		if got := m.AdaptiveRateAt(time.Now()); got < want-0.1 || got > want+0.1 {
			t.Errorf("adaptive %v: rate after a push-back = %v, want %v", adaptive, got, want)
		}
		b.Close()
	}
}
