package campaign

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// at returns t0 plus ms milliseconds.
func at(ms ...int) []time.Time {
	var out []time.Time
	for _, m := range ms {
		out = append(out, t0.Add(time.Duration(m)*time.Millisecond))
	}
	return out
}

func TestWindows(t *testing.T) {
	ts := at(0, 10, 20, 500, 990, 1000, 1005, 2500)
	busiest, over := Windows(ts, time.Second, func(time.Time) int { return 4 })
	if busiest.N != 6 || !busiest.At.Equal(t0.Add(10*time.Millisecond)) {
		t.Errorf("busiest = %v, want 6 from 10 ms ([10, 1010) holds 10 20 500 990 1000 1005)", busiest)
	}
	if len(over) != 3 {
		t.Errorf("windows over 4: %v, want those from 0, 10 and 20 ms", over)
	}
	b100, _ := Windows(ts, 100*time.Millisecond, nil)
	if b100.N != 3 {
		t.Errorf("busiest 100 ms = %v, want 3", b100)
	}
}

func TestBound(t *testing.T) {
	s := Spec{Rate: 20, Burst: 5,
		Overrides: []RateChange{
			{From: t0.Add(10 * time.Second), To: t0.Add(10*time.Second + 50*time.Millisecond), Rate: 10},
			{From: t0.Add(20 * time.Second), To: t0.Add(20*time.Second + 50*time.Millisecond), Rate: 0},
			{From: t0.Add(30 * time.Second), To: t0.Add(30*time.Second + 50*time.Millisecond), Rate: 40},
			{From: t0.Add(40 * time.Second), To: t0.Add(40*time.Second + 50*time.Millisecond), Rate: 0},
		},
		Disturbances: []Disturbance{{Kind: RedisKill, From: t0.Add(50 * time.Second), To: t0.Add(55 * time.Second), ExtraBursts: 1, ExtraKeyBursts: 2}},
	}
	steps := []struct {
		from      int // s
		width     time.Duration
		allowance int
		want      int
	}{
		{0, time.Second, 0, 25},                  // configured
		{0, 100 * time.Millisecond, 1, 8},        // 5 + 2 + 1
		{10, time.Second, 0, 25},                 // the cut's first second keeps 20
		{11, time.Second, 0, 25},                 // 1 s after the cut: the old rate still counts
		{12, time.Second, 0, 15},                 // the cut
		{12, 100 * time.Millisecond, 1, 7},       // 5 + 1 + 1
		{19, time.Second, 0, 15},                 // cleared as the window ends
		{20, time.Second, 0, 25},                 // cleared within the window
		{25, time.Second, 0, 25},                 // back to 20
		{31, time.Second, 0, 45},                 // raised
		{41, time.Second, 0, 45},                 // 1 s after the clear: the raised rate still counts
		{42, time.Second, 0, 25},                 // back to 20
		{49, time.Second, 0, 25},                 // the kill starts as the window ends
		{50, time.Second, 0, 30},                 // 20 + 2 × 5: the kill in the window
		{56, time.Second, 0, 25},                 // after it settled
		{54, 100 * time.Millisecond, 1, 13},      // 2 × 5 + 2 + 1
		{29, 1500 * time.Millisecond, 0, 5 + 60}, // raised within: 40 × 1.5
	}
	for _, st := range steps {
		if got := s.Bound(t0.Add(time.Duration(st.from)*time.Second), st.width, st.allowance); got != st.want {
			t.Errorf("Bound(+%ds, %v) = %d, want %d", st.from, st.width, got, st.want)
		}
	}
	s.Stall = 200 * time.Millisecond // 4 intervals at 20/s
	if got := s.Bound(t0, time.Second, 0); got != 29 {
		t.Errorf("Bound with a 200 ms stall = %d, want 29", got)
	}
}

func TestClosestGap(t *testing.T) {
	perKey := map[string][]time.Time{
		"a": at(0, 2000, 3900, 6000),
		"b": at(100, 101, 3000),
	}
	if g := ClosestGap(perKey, 1, nil, nil); g.Key != "b" || g.D != time.Millisecond {
		t.Errorf("lag 1: %v, want b 1ms", g)
	}
	if g := ClosestGap(perKey, 2, nil, nil); g.Key != "b" || g.D != 2900*time.Millisecond {
		t.Errorf("lag 2: %v, want b 2.9s", g)
	}
	skip := func(a, b time.Time) bool { return a.Before(t0.Add(time.Second)) }
	if g := ClosestGap(perKey, 1, skip, nil); g.Key != "a" || g.D != 1900*time.Millisecond {
		t.Errorf("skipping the first second: %v, want a 1.9s", g)
	}
	// With a bound per pair: b's pair at 100 ms may be 1 ms apart (its
	// bound is below that), a's 1.9 s must be 2 s: a comes closest.
	want := func(x, y time.Time) time.Duration {
		if x.Before(t0.Add(time.Second)) {
			return 0
		}
		return 2 * time.Second
	}
	if g := ClosestGap(perKey, 1, nil, want); g.Key != "a" || g.D != 1900*time.Millisecond || g.Want != 2*time.Second {
		t.Errorf("with a bound per pair: %v (want %v), want a 1.9s against 2s", g, g.Want)
	}
}

func TestCheck(t *testing.T) {
	arr := func(id int, to string, ms int) Arrival {
		return Arrival{ID: id, To: to, Acct: "x", At: t0.Add(time.Duration(ms) * time.Millisecond)}
	}
	pub := map[int]Arrival{}
	for id := range 6 {
		pub[id] = Arrival{ID: id, Acct: "x"}
	}
	pub[9] = Arrival{ID: 9, Acct: CappedAccount}
	layer := []KeyedLayer{{Name: "per-recipient", Key: func(a Arrival) string { return a.To }, Rate: 0.5, Burst: 1}}
	steps := []struct {
		name     string
		arrivals []Arrival
		dead     map[int]int
		dups     int
		want     []string // a part of each violation, in order
	}{
		{"clean", []Arrival{arr(0, "a", 0), arr(1, "a", 2000), arr(2, "b", 10), arr(3, "c", 20), arr(4, "d", 30), arr(5, "e", 40)},
			map[int]int{9: 1}, 0, nil},
		{"close pair, lost, bad dead letter, duplicate",
			[]Arrival{arr(0, "a", 0), arr(1, "a", 1500), arr(2, "b", 10), arr(2, "b", 5000), arr(3, "c", 20)},
			map[int]int{4: 1}, 0,
			[]string{"per-recipient: arrivals of key a 1 apart only 1.5s", "2 messages lost: 5 9", "dead-lettered that no limit refuses: 4", "1 duplicate deliveries, want at most 0"}},
		{"a duplicate 1 ms after its first copy counts as a duplicate, not against the key's spacing",
			[]Arrival{arr(0, "a", 0), arr(0, "a", 1), arr(1, "a", 2000), arr(2, "c", 20), arr(3, "d", 30), arr(4, "e", 40), arr(5, "f", 50)},
			map[int]int{9: 1}, 0, []string{"1 duplicate deliveries, want at most 0"}},
		{"duplicate within the bound", []Arrival{arr(0, "a", 0), arr(0, "a", 2000), arr(1, "b", 10), arr(2, "c", 20), arr(3, "d", 30), arr(4, "e", 40), arr(5, "f", 50)},
			map[int]int{9: 1}, 1, nil},
	}
	// An open finding with a hard fraction of 0.5 (1 s at 0.5/s): a pair
	// 1.5 s apart is logged, one 0.9 s apart still fails.
	open := []KeyedLayer{{Name: "per-recipient", Key: func(a Arrival) string { return a.To }, Rate: 0.5, Burst: 1, Open: "known", HardFraction: 0.5}}
	for _, c := range []struct {
		ms   int
		fail bool
	}{{1500, false}, {900, true}} {
		r := Check([]Arrival{arr(0, "a", 0), arr(1, "a", c.ms), arr(2, "b", 10), arr(3, "c", 20), arr(4, "d", 30), arr(5, "e", 40)},
			Spec{Rate: 20, Burst: 5, Keyed: open, Published: pub, DeadLettered: map[int]int{9: 1},
				MayDeadLetter: func(a Arrival) bool { return a.Acct == CappedAccount }})
		if failed := len(r.Violations) > 0; failed != c.fail {
			t.Errorf("open finding, a pair %d ms apart: violations %q, want failing %v", c.ms, r.Violations, c.fail)
		}
	}
	// The report names the replicas that sent the pair.
	a, b := arr(0, "a", 0), arr(1, "a", 900)
	a.Replica, b.Replica = "2", "3"
	r := Check([]Arrival{a, b, arr(2, "b", 10), arr(3, "c", 20), arr(4, "d", 30), arr(5, "e", 40)},
		Spec{Rate: 20, Burst: 5, Keyed: open, Published: pub, DeadLettered: map[int]int{9: 1},
			MayDeadLetter: func(a Arrival) bool { return a.Acct == CappedAccount }})
	if len(r.Violations) != 1 || !strings.Contains(r.Violations[0], "key a (sent by replicas 2 and 3) 1 apart") {
		t.Errorf("violations %q, want one naming replicas 2 and 3", r.Violations)
	}
	for _, st := range steps {
		r := Check(st.arrivals, Spec{Rate: 20, Burst: 5, Keyed: layer, Published: pub, DeadLettered: st.dead,
			MayDeadLetter: func(a Arrival) bool { return a.Acct == CappedAccount }, DupBound: st.dups})
		if len(r.Violations) != len(st.want) {
			t.Errorf("%s: violations %q, want %d", st.name, r.Violations, len(st.want))
			continue
		}
		for i, w := range st.want {
			if !strings.Contains(r.Violations[i], w) {
				t.Errorf("%s: violation %d = %q, want it to contain %q", st.name, i, r.Violations[i], w)
			}
		}
	}
}

func TestCheckWindowsAndQuota(t *testing.T) {
	var as []Arrival
	for i := range 12 { // 12 in 11 ms: over 5 + 2 + 1 in 100 ms
		as = append(as, Arrival{ID: i, Acct: "q", At: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	spec := Spec{Rate: 20, Burst: 5, ArrivalAllowance: 1,
		Quotas: []QuotaLayer{{Name: "per-account", Key: func(a Arrival) string { return a.Acct }, Quota: 10, Per: time.Hour}}}
	r := Check(as, spec)
	if r.Busiest100.N != 12 || r.Busiest100.Bound != 8 {
		t.Errorf("busiest 100 ms = %v, want 12 against 8", r.Busiest100)
	}
	want := []string{"shared bucket: 12 in 100ms", "shared bucket: 11 in 100ms", "shared bucket: 10 in 100ms", "shared bucket: 9 in 100ms", "per-account: key q got 12"}
	if len(r.Violations) != len(want) {
		t.Fatalf("violations %q", r.Violations)
	}
	for i, w := range want {
		if !strings.Contains(r.Violations[i], w) {
			t.Errorf("violation %d = %q, want %q", i, r.Violations[i], w)
		}
	}
	// A Redis kill in the hour allows the quota twice more.
	spec.Disturbances = []Disturbance{{Kind: RedisKill, From: t0.Add(-time.Second), To: t0.Add(time.Minute), ExtraBursts: 1, ExtraKeyBursts: 2}}
	if r := Check(as, spec); !r.OK() {
		t.Errorf("with a Redis kill: %q", r.Violations)
	}
}

func TestPlanIsSeeded(t *testing.T) {
	a, b := Plan(7, time.Minute), Plan(7, time.Minute)
	if !reflect.DeepEqual(a, b) || len(a) < 5 {
		t.Fatalf("Plan(7) twice: %v and %v", a, b)
	}
	if reflect.DeepEqual(a, Plan(8, time.Minute)) {
		t.Error("seeds 7 and 8 gave the same schedule")
	}
	for _, s := range a {
		if s.At+s.Hold > time.Minute {
			t.Errorf("step %v ends after the minute", s)
		}
	}
	w1, w2 := Workload(7, 10*time.Second), Workload(7, 10*time.Second)
	if !reflect.DeepEqual(w1, w2) || len(w1) < 50 {
		t.Errorf("Workload(7) twice differs, or is short (%d)", len(w1))
	}
}

func TestMerged(t *testing.T) {
	s := func(a, b int) [2]time.Time {
		return [2]time.Time{t0.Add(time.Duration(a) * time.Second), t0.Add(time.Duration(b) * time.Second)}
	}
	if got := merged([][2]time.Time{s(5, 8), s(0, 2), s(1, 3), s(7, 10)}); got != 8*time.Second {
		t.Errorf("merged = %v, want 8s ([0,3] and [5,10])", got)
	}
}

func TestStallsMaxIn(t *testing.T) {
	s := &Stalls{events: []stall{
		{Wake: t0.Add(time.Second), Over: 50 * time.Millisecond},
		{Wake: t0.Add(3 * time.Second), Over: 200 * time.Millisecond},
		{Wake: t0.Add(10 * time.Second), Over: 20 * time.Millisecond},
	}}
	steps := []struct {
		from, to int // ms
		want     time.Duration
	}{
		{0, 900, 5 * time.Millisecond},       // nothing overlaps: the least recorded
		{0, 960, 50 * time.Millisecond},      // the first began at 950 ms
		{1001, 2700, 5 * time.Millisecond},   // the first woke at 1000, the second began at 2800
		{2900, 2950, 200 * time.Millisecond}, // within the second
		{0, 20000, 200 * time.Millisecond},   // all
		{3001, 20000, 20 * time.Millisecond}, // the last only
	}
	for _, st := range steps {
		if got := s.MaxIn(t0.Add(time.Duration(st.from)*time.Millisecond), t0.Add(time.Duration(st.to)*time.Millisecond)); got != st.want {
			t.Errorf("MaxIn(%d ms, %d ms) = %v, want %v", st.from, st.to, got, st.want)
		}
	}
}

// TestLoggedStalls reads the stall warnings of replicas' JSON logs: each
// line stands for its longest stall at its end (and at its start, when its
// span is longer), other lines are skipped, and LongestIn takes the
// longest of the checker's and the replicas'.
func TestLoggedStalls(t *testing.T) {
	at := func(ms int) string { return t0.Add(time.Duration(ms) * time.Millisecond).Format(time.RFC3339Nano) }
	r1 := `{"time":"x","level":"INFO","msg":"starting"}
{"time":"x","level":"WARN","msg":"` + StallLine + `: messages granted just before went out that late","longest":"130ms","stalls":1,"from":"` + at(1000) + `","to":"` + at(1130) + `"}
not json ` + StallLine + `
`
	r2 := `{"time":"x","level":"WARN","msg":"` + StallLine + `: x","longest":"60ms","stalls":3,"from":"` + at(5000) + `","to":"` + at(5800) + `"}`
	logged := LoggedStalls(r1, r2)
	if logged.Max() != 130*time.Millisecond {
		t.Fatalf("Max = %v, want 130ms", logged.Max())
	}
	own := &Stalls{events: []stall{{Wake: t0.Add(3 * time.Second), Over: 40 * time.Millisecond}}}
	in := LongestIn(own, logged)
	steps := []struct {
		from, to int // ms
		want     time.Duration
	}{
		{0, 900, 5 * time.Millisecond},       // none: the least recorded
		{1100, 1120, 130 * time.Millisecond}, // within the replica's stall
		{2000, 3000, 40 * time.Millisecond},  // the checker's own
		{4000, 4990, 5 * time.Millisecond},   // r2's first stall began at 5000 at the earliest
		{5050, 5070, 60 * time.Millisecond},  // r2's line, at its start
		{5750, 5790, 60 * time.Millisecond},  // and at its end
		{0, 10000, 130 * time.Millisecond},   // all
	}
	for _, st := range steps {
		if got := in(t0.Add(time.Duration(st.from)*time.Millisecond), t0.Add(time.Duration(st.to)*time.Millisecond)); got != st.want {
			t.Errorf("LongestIn(%d ms, %d ms) = %v, want %v", st.from, st.to, got, st.want)
		}
	}
}
