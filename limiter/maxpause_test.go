package limiter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// TestBucketMaxPause: MaxPause reports the cap Pause applies, the default
// (60s) or Options.MaxPause, and Pause holds the bucket no longer.
func TestBucketMaxPause(t *testing.T) {
	for _, tc := range []struct {
		set, want time.Duration
	}{{0, time.Minute}, {2 * time.Second, 2 * time.Second}, {5 * time.Minute, 5 * time.Minute}} {
		m, err := limiter.NewMemory(10, 1)
		if err != nil {
			t.Fatal(err)
		}
		b, err := limiter.New(m, limiter.Options{MaxPause: tc.set, Lease: limiter.LeaseOptions{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.MaxPause(); got != tc.want {
			t.Errorf("MaxPause %v: MaxPause() = %v, want %v", tc.set, got, tc.want)
		}
		if err := b.Pause(context.Background(), time.Hour); err != nil {
			t.Fatal(err)
		}
		st, err := b.State(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.PausedFor <= tc.want-time.Second || st.PausedFor > tc.want {
			t.Errorf("MaxPause %v: a pause of 1h holds for %v, want %v", tc.set, st.PausedFor, tc.want)
		}
		b.Close()
	}
}

// TestValidateLayersNeitherBucketNorQuota: a layer with neither a rate nor
// a quota is told to choose one.
func TestValidateLayersNeitherBucketNorQuota(t *testing.T) {
	err := limiter.ValidateLayers([]limiter.Layer{{Name: "a", Keyed: true}})
	if err == nil || !strings.Contains(err.Error(), "Layers[0].Rate: needs a rate (Rate, a token bucket) or a quota (Quota and Per)") {
		t.Errorf("ValidateLayers = %v", err)
	}
}
