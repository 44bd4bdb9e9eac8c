package consumer

import (
	"testing"
	"time"
)

// TestLocalDedupeSteps runs the in-process store's decisions at fixed
// instants: a claim, its holder's extension, another token held off with
// the claim's remaining time, the expiry of a dead holder's claim, a mark
// for the window, and a release that only the holder can make.
func TestLocalDedupeSteps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLocalDedupe(func() time.Time { return t0 })
	const ttl, window = 10 * time.Second, time.Minute
	steps := []struct {
		at          time.Duration
		op          string // claim, mark, release
		key, token  string
		want        DedupeState // claim
		wantWait    time.Duration
		wantChanged bool // claim held: a channel to wait on
	}{
		{0, "claim", "k", "a", DedupeClaimed, 0, false},
		{1 * time.Second, "claim", "k", "b", 0, 9 * time.Second, true},  // held by a
		{2 * time.Second, "claim", "k", "a", DedupeClaimed, 0, false},   // a extends to 12 s
		{3 * time.Second, "claim", "k", "b", 0, 9 * time.Second, true},  // still held
		{12 * time.Second, "claim", "k", "b", DedupeClaimed, 0, false},  // a died: expired, b claims
		{13 * time.Second, "release", "k", "a", 0, 0, false},            // not a's: no effect
		{14 * time.Second, "claim", "k", "c", 0, 8 * time.Second, true}, // b holds until 22 s
		{15 * time.Second, "mark", "k", "b", 0, 0, false},               // sent until 75 s
		{16 * time.Second, "claim", "k", "c", DedupeSent, 0, false},
		{74 * time.Second, "claim", "k", "a", DedupeSent, 0, false},
		{75 * time.Second, "claim", "k", "a", DedupeClaimed, 0, false}, // the window is over
		{76 * time.Second, "release", "k", "a", 0, 0, false},
		{76 * time.Second, "claim", "k", "c", DedupeClaimed, 0, false}, // released: at once
		{77 * time.Second, "claim", "other", "a", DedupeClaimed, 0, false},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		switch s.op {
		case "claim":
			st, wait, ch := l.claimAt(now, s.key, s.token, ttl)
			if st != s.want || wait != s.wantWait || (ch != nil) != s.wantChanged {
				t.Fatalf("step %d at %v: claim(%s, %s) = %v, %v, chan %v; want %v, %v, chan %v",
					i, s.at, s.key, s.token, st, wait, ch != nil, s.want, s.wantWait, s.wantChanged)
			}
		case "mark":
			l.markAt(now, s.key, window)
		case "release":
			l.releaseAt(s.key, s.token)
		}
	}
}

// TestLocalDedupeWakes: a claim held off is woken by the holder's mark
// and by its release, through the channel claimAt returns.
func TestLocalDedupeWakes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLocalDedupe(func() time.Time { return t0 })
	l.claimAt(t0, "k", "a", time.Minute)
	_, _, ch := l.claimAt(t0, "k", "b", time.Minute)
	l.releaseAt("k", "a")
	select {
	case <-ch:
	default:
		t.Fatal("the release did not wake the waiter")
	}
	l.claimAt(t0, "k", "b", time.Minute)
	_, _, ch = l.claimAt(t0, "k", "c", time.Minute)
	l.markAt(t0, "k", time.Minute)
	select {
	case <-ch:
	default:
		t.Fatal("the mark did not wake the waiter")
	}
}

// TestLocalDedupeSweep: expired entries are removed, so the memory holds
// the keys of one window at most.
func TestLocalDedupeSweep(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLocalDedupe(func() time.Time { return now })
	for i := range 100 {
		l.markAt(now, string(rune('a'+i%26))+string(rune('a'+i/26)), time.Second)
	}
	l.claimAt(now.Add(2*time.Minute), "z", "t", time.Second)
	if n := len(l.keys); n != 1 {
		t.Fatalf("%d entries after the window, want 1 (the new claim)", n)
	}
}
