package limiter

import (
	"testing"
	"time"
)

// TestWindowsOpenSteps: windowsOpen grants only well inside every window,
// on the store's clock; near a boundary, closed, without a key or a number
// it leaves the decision to the store.
func TestWindowsOpenSteps(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	quiet := Layer{Name: "quiet", Keyed: true, Window: &Window{Calendar: Calendar{From: 8 * time.Hour, To: 21 * time.Hour},
		ByNumber: true, DefaultLocation: time.UTC, Exempt: []Priority{PriorityHigh}}}
	office := Layer{Name: "office", Window: &Window{Calendar: Calendar{From: 9 * time.Hour, To: 17 * time.Hour}, Location: ny}}
	nyc := map[string]string{"quiet": "+12125550100"}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, st := range []struct {
		what   string
		layers []Layer
		keys   map[string]string
		p      Priority
		store  string
		skew   time.Duration // the Bucket's clock less the store's
		want   bool
	}{
		{"inside, New York 12:00", []Layer{quiet}, nyc, PriorityNormal, "2026-01-05T17:00:00Z", 0, true},
		{"before it opens (07:59)", []Layer{quiet}, nyc, PriorityNormal, "2026-01-05T12:59:00Z", 0, false},
		{"opened 30 s ago: the store decides", []Layer{quiet}, nyc, PriorityNormal, "2026-01-05T13:00:30Z", 0, false},
		{"opened a minute ago", []Layer{quiet}, nyc, PriorityNormal, "2026-01-05T13:01:00Z", 0, true},
		{"closes in 59 s: the store decides", []Layer{quiet}, nyc, PriorityNormal, "2026-01-06T01:59:01Z", 0, false},
		{"closes in 2 min", []Layer{quiet}, nyc, PriorityNormal, "2026-01-06T01:58:00Z", 0, true},
		{"closes in 2 min on the store's clock, 3 min ahead of the Bucket's", []Layer{quiet}, nyc, PriorityNormal, "2026-01-06T01:58:00Z", -3 * time.Minute, true},
		{"closed on the store's clock, open on the Bucket's", []Layer{quiet}, nyc, PriorityNormal, "2026-01-06T02:05:00Z", 10 * time.Minute, false},
		{"exempt class at night", []Layer{quiet}, nyc, PriorityHigh, "2026-01-06T05:00:00Z", 0, true},
		{"no key", []Layer{quiet}, nil, PriorityNormal, "2026-01-05T17:00:00Z", 0, false},
		{"not a number", []Layer{quiet}, map[string]string{"quiet": "bob"}, PriorityNormal, "2026-01-05T17:00:00Z", 0, false},
		{"both open", []Layer{quiet, office}, nyc, PriorityNormal, "2026-01-05T17:00:00Z", 0, true},
		{"office closed (18:00 in New York)", []Layer{quiet, office}, nyc, PriorityNormal, "2026-01-05T23:00:00Z", 0, false},
	} {
		store := at(st.store)
		if got := windowsOpen(st.layers, st.keys, st.p, store.Add(st.skew), store); got != st.want {
			t.Errorf("%s: windowsOpen = %v, want %v", st.what, got, st.want)
		}
	}
	if !windowsOnly([]Layer{quiet, office}) || windowsOnly([]Layer{quiet, {Name: "r", Rate: 1, Burst: 1}}) || windowsOnly(nil) {
		t.Error("windowsOnly")
	}
	shadow := quiet
	shadow.Shadow = true
	if windowsOnly([]Layer{shadow}) {
		t.Error("windowsOnly takes a shadow window")
	}
}
