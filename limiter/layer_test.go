package limiter_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

func TestValidateLayers(t *testing.T) {
	layers := []limiter.Layer{
		{Name: "ok", Keyed: true, Rate: 2.5},
		{Name: "q", Quota: 10, Per: limiter.PerDay},
	}
	if err := limiter.ValidateLayers(layers); err != nil {
		t.Fatal(err)
	}
	if layers[0].Burst != 3 || layers[0].OnExceed != limiter.ActionWait || layers[1].Location != time.UTC {
		t.Errorf("defaults not filled in: %+v", layers)
	}
	bad := []struct {
		layer limiter.Layer
		param string
	}{
		{limiter.Layer{Name: "", Rate: 1}, "Layers[0].Name"},
		{limiter.Layer{Name: "a:b", Rate: 1}, "Layers[0].Name"},
		{limiter.Layer{Name: "a{b}", Rate: 1}, "Layers[0].Name"},
		{limiter.Layer{Name: "a", Rate: 0}, "Layers[0].Rate"},
		{limiter.Layer{Name: "a", Rate: 1, Burst: -1}, "Layers[0].Burst"},
		{limiter.Layer{Name: "a", Rate: 1, Quota: 5, Per: limiter.PerDay}, "Layers[0].Quota"},
		{limiter.Layer{Name: "a", Quota: 5, Per: "week"}, "Layers[0].Per"},
		{limiter.Layer{Name: "a", Quota: -1, Per: limiter.PerDay}, "Layers[0].Quota"},
		{limiter.Layer{Name: "a", Rate: 1, OnExceed: "drop"}, "Layers[0].OnExceed"},
		{limiter.Layer{Name: "a", Rate: 1, MaxWait: time.Second}, "Layers[0].MaxWait"},
	}
	for _, tc := range bad {
		err := limiter.ValidateLayers([]limiter.Layer{tc.layer})
		var pe *limiter.ParamError
		if !errors.As(err, &pe) || pe.Param != tc.param {
			t.Errorf("ValidateLayers(%+v) = %v, want a ParamError for %s", tc.layer, err, tc.param)
		}
	}
	if err := limiter.ValidateLayers([]limiter.Layer{{Name: "a", Rate: 1}, {Name: "a", Rate: 1}}); err == nil {
		t.Error("two layers named a passed")
	}
}

func TestWindowsAroundDaylightSaving(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 8, 15, 0, 0, 0, time.UTC) // the 23-hour day
	w := limiter.QuotaWindows(limiter.PerDay, at, ny)
	want := []string{"2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", "2026-03-10T04:00:00Z"}
	for i, s := range want {
		if got := w[i].UTC().Format(time.RFC3339); got != s {
			t.Errorf("day boundary %d = %s, want %s", i, got, s)
		}
	}
	// The repeated 1 a.m. hour of 2026-11-01 is two windows.
	h1s, h1e := limiter.QuotaWindow(limiter.PerHour, time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC), ny)
	h2s, h2e := limiter.QuotaWindow(limiter.PerHour, time.Date(2026, 11, 1, 6, 30, 0, 0, time.UTC), ny)
	if !h1e.Equal(h2s) || h1e.Sub(h1s) != time.Hour || h2e.Sub(h2s) != time.Hour || h1s.UTC().Hour() != 5 {
		t.Errorf("fall-back hours: [%v, %v) and [%v, %v)", h1s.UTC(), h1e.UTC(), h2s.UTC(), h2e.UTC())
	}
}

func TestExceededErrorWording(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := limiter.ExceededError(limiter.Layer{Name: "daily", Quota: 200, Per: limiter.PerDay, OnExceed: limiter.ActionDelay}, at, 3*time.Hour+1234567*time.Microsecond)
	if e.Error() != `limit "daily": quota of 200 per day used up; resets in 3h0m1s` || !e.RetryAt.Equal(at.Add(3*time.Hour+1234567*time.Microsecond)) {
		t.Errorf("quota refusal: %q, RetryAt %v", e.Error(), e.RetryAt)
	}
	e = limiter.ExceededError(limiter.Layer{Name: "per-recipient", Rate: 0.5, Burst: 1, OnExceed: limiter.ActionDeadLetter}, at, 1500400*time.Microsecond)
	if e.Reason != "rate 30/min (burst 1) exceeded; room in 1.5s" || !e.RetryAt.IsZero() || !errors.Is(e, limiter.ErrLimitExceeded) {
		t.Errorf("bucket refusal: %q, RetryAt %v", e.Reason, e.RetryAt)
	}
}

func TestExceededErrorNamesTheRateInItsUnit(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		want string
	}{{5.0 / 3600, "5/h"}, {1, "1/s"}, {4, "4/s"}, {200000.0 / 86400, "200000/d"}, {2.5, "150/min"}, {0.3, "18/min"}, {1.0 / 7, "0.1429/s"}} {
		e := limiter.ExceededError(limiter.Layer{Name: "l", Rate: tc.rate, Burst: 1, OnExceed: limiter.ActionDeadLetter}, time.Time{}, time.Second)
		if !strings.HasPrefix(e.Reason, "rate "+tc.want+" ") {
			t.Errorf("rate %v: reason %q, want the rate as %s", tc.rate, e.Reason, tc.want)
		}
	}
}
