package kafka

import (
	"testing"
)

// TestOffsetTracker checks the commit position step by step at fixed
// offsets: out-of-order completion, gaps between offsets, messages that
// never finish because their partition was revoked, and growth of the
// ring.
func TestOffsetTracker(t *testing.T) {
	type step struct {
		add    []int64 // offsets fetched, in order
		finish []int64 // offsets finished
		want   int64   // commit position after the step; -1: nothing to commit yet
		window int     // fetched messages at or after the position
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"nothing fetched", []step{{want: -1}}},
		{"in order", []step{
			{add: []int64{0, 1, 2}, want: -1, window: 3},
			{finish: []int64{0}, want: 1, window: 2},
			{finish: []int64{1, 2}, want: 3, window: 0},
		}},
		{"out of order waits for the oldest", []step{
			{add: []int64{10, 11, 12, 13}, want: -1, window: 4},
			{finish: []int64{13, 11}, want: -1, window: 4},
			{finish: []int64{10}, want: 12, window: 2},
			{finish: []int64{12}, want: 14, window: 0},
		}},
		{"gaps between offsets (compaction, transaction markers)", []step{
			{add: []int64{5, 9, 20}, want: -1, window: 3},
			{finish: []int64{9}, want: -1, window: 3},
			{finish: []int64{5}, want: 20, window: 1},
			{finish: []int64{20}, want: 21, window: 0},
			{add: []int64{40}, want: 40, window: 1},
		}},
		{"finishing twice or an unknown offset changes nothing", []step{
			{add: []int64{0, 1}, finish: []int64{0, 0}, want: 1, window: 1},
		}},
		{"revocation: dropped messages never finish", []step{
			// 0 and 3 in flight finish; 1, 2 and 4 were dropped.
			{add: []int64{0, 1, 2, 3, 4}, finish: []int64{3, 0}, want: 1, window: 4},
		}},
		{"revocation before anything finished commits nothing", []step{
			{add: []int64{7, 8}, finish: []int64{8}, want: -1, window: 2},
		}},
		{"an offset added again keeps its sequence number (the delay topic's read-ahead)", []step{
			{add: []int64{10, 11, 12}, want: -1, window: 3},
			{add: []int64{11}, finish: []int64{11}, want: -1, window: 3},
			{add: []int64{10}, finish: []int64{10}, want: 12, window: 1},
			{add: []int64{12, 13}, finish: []int64{12}, want: 13, window: 1},
		}},
		{"a window larger than the initial ring", []step{
			{add: seq(0, 200), finish: seq(1, 200), want: -1, window: 200},
			{finish: []int64{0}, want: 200, window: 0},
			{add: seq(200, 500), finish: seq(200, 499), want: 499, window: 1},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := newOffsetTracker()
			seqs := map[int64]uint64{}
			for i, s := range tc.steps {
				for _, o := range s.add {
					seqs[o] = tr.add(o)
				}
				for _, o := range s.finish {
					sq, ok := seqs[o]
					if !ok {
						sq = 1 << 40 // never added
					}
					tr.finish(sq)
				}
				got, ok := tr.position()
				if !ok {
					got = -1
				}
				if got != s.want || tr.window() != s.window {
					t.Fatalf("step %d: position %d, window %d; want %d, %d", i, got, tr.window(), s.want, s.window)
				}
			}
		})
	}
}

// seq returns the offsets from lo to hi-1.
func seq(lo, hi int64) []int64 {
	out := make([]int64, 0, hi-lo)
	for o := lo; o < hi; o++ {
		out = append(out, o)
	}
	return out
}

// TestOffsetTrackerAllocations: once the ring fits the in-flight messages,
// tracking allocates nothing per message.
func TestOffsetTrackerAllocations(t *testing.T) {
	tr := newOffsetTracker()
	var next int64
	allocs := testing.AllocsPerRun(1000, func() {
		a := tr.add(next)
		b := tr.add(next + 1)
		tr.finish(b)
		tr.finish(a)
		next += 2
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per add/finish pair, want 0", allocs)
	}
}

// TestFinishedMetadata: the commit metadata lists the messages that
// finished after the commit position, and reads back as the same set.
func TestFinishedMetadata(t *testing.T) {
	tr := newOffsetTracker()
	seqs := map[int64]uint64{}
	for _, o := range []int64{10, 11, 12, 13, 14, 20, 10_000} {
		seqs[o] = tr.add(o)
	}
	for _, o := range []int64{10, 12, 14, 20, 10_000} {
		tr.finish(seqs[o])
	}
	pos, ok := tr.position()
	if !ok || pos != 11 {
		t.Fatalf("position = %d, %v; want 11", pos, ok)
	}
	meta := tr.finishedMetadata(pos)
	f := parseFinished(pos, meta)
	for o, want := range map[int64]bool{10: false, 11: false, 12: true, 13: false, 14: true, 15: false, 20: true,
		10_000: false /* beyond maxFinishedSpan */} {
		if f.has(o) != want {
			t.Errorf("offset %d in the set = %v, want %v (metadata %q)", o, f.has(o), want, meta)
		}
	}
	if f.len() != 3 {
		t.Errorf("len = %d, want 3", f.len())
	}
	if len(meta) > 4096 {
		t.Errorf("metadata of %d bytes, above the brokers' default limit", len(meta))
	}

	if m := newOffsetTracker().finishedMetadata(0); m != "" {
		t.Errorf("metadata of an empty tracker = %q, want empty", m)
	}
	for _, foreign := range []string{"", "some other client", finishedPrefix + "!!"} {
		if f := parseFinished(0, foreign); f.len() != 0 || f.has(0) {
			t.Errorf("metadata %q gave a non-empty set", foreign)
		}
	}
}
