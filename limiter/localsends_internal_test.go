package limiter

import (
	"math"
	"testing"
	"time"
)

// TestLocalSendsOwe: what the local fallback sent on a key is owed at the
// layer's full rate, capped as the key's bucket would be (a key refilled
// between two sends owes only the last), and a key refilled owes nothing;
// a quota's use is owed until its window ends.
func TestLocalSendsOwe(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	layers := []Layer{
		{Name: "per-key", Keyed: true, Rate: 0.5, Burst: 1},
		{Name: "account", Rate: 10, Burst: 20},
		{Name: "daily", Quota: 100, Per: PerDay},
		{Name: "watch", Keyed: true, Rate: 1, Burst: 1, Shadow: true},
	}
	var s localSends
	keys := map[string]string{"per-key": "a", "watch": "a"}
	for _, st := range []struct {
		at   time.Duration
		keys map[string]string
		cost int
	}{
		{0, keys, 1},
		{10 * time.Second, keys, 1}, // a refilled since: owes 1, not 2 - 5
		{11 * time.Second, keys, 2}, // owes 1 - 0.5 + 2
		{11 * time.Second, map[string]string{"per-key": "b"}, 1},
		{11 * time.Second, nil, 1}, // no key: the keyed layers are skipped
	} {
		s.record(t0.Add(st.at), layers, st.keys, st.cost, 0)
	}
	got := map[string]float64{}
	for _, o := range s.take(t0.Add(12 * time.Second)) {
		got[o.key.layer+"/"+o.key.key] = o.debt.tokens
	}
	// account, at 10/s, owed 4 at 11 s and nothing a second later; the
	// quota keeps its count until the day ends.
	want := map[string]float64{
		"per-key/a": 2.5 - 0.5, // 2.5 at 11 s, less 1 s at 0.5/s
		"per-key/b": 1 - 0.5,
		"daily/":    6,
	}
	if len(got) != len(want) {
		t.Fatalf("charges %v, want %v", got, want)
	}
	for k, w := range want {
		if math.Abs(got[k]-w) > 1e-9 {
			t.Errorf("%s owes %v, want %v", k, got[k], w)
		}
	}
	if left := s.take(t0.Add(12 * time.Second)); len(left) != 0 {
		t.Errorf("after take: %v, want nothing left", left)
	}
	s.record(t0, layers, nil, 1, 0)
	if left := s.take(t0.Add(24 * time.Hour)); len(left) != 0 {
		t.Errorf("a day later: %v, want nothing owed (the quota's window ended)", left)
	}
}
