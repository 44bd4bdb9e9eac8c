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

func TestFCFSExcess(t *testing.T) {
	ms := func(v uint32) uint32 { return v * 1000 }
	for _, tc := range []struct {
		name    string
		callers [][]scaleWait
		worst   time.Duration
		over    int64
		// tied: with callers within fcfsTie counted together, no wait
		// exceeds FCFS at all.
		tied bool
	}{
		{
			// Three callers served in turn, each waiting for the two
			// ahead of it: every wait is its place ÷ the share.
			name: "in turn",
			callers: [][]scaleWait{
				{{ms(0), ms(100)}, {ms(100), ms(400)}},
				{{ms(0), ms(200)}, {ms(200), ms(500)}},
				{{ms(0), ms(300)}, {ms(300), ms(600)}},
			},
		},
		{
			// The second caller is served twice while the first waits
			// 1 s with one caller ahead of it: place 2, so FCFS ends its
			// wait with the replica's second grant, at 200 ms.
			name: "overtaken",
			callers: [][]scaleWait{
				{{ms(0), ms(1000)}},
				{{ms(0), ms(100)}, {ms(100), ms(200)}},
			},
			worst: 800 * time.Millisecond,
			over:  1,
		},
		{
			// Grants bunched at the end of a round: the third caller,
			// which asked 1 ms after the first, is granted 1 ms before
			// it. An overtake by 1 ms, within the slack.
			name: "bunched",
			callers: [][]scaleWait{
				{{ms(0), ms(10)}, {ms(10), ms(3002)}},
				{{ms(0), ms(9)}, {ms(9), ms(3000)}},
				{{ms(0), ms(11)}, {ms(11), ms(3001)}},
			},
			worst: time.Millisecond,
		},
		{
			// Callers that began 0.5 ms apart, served in the other
			// order: the first waits 300 ms more than its place ÷ share
			// strictly, and nothing more when callers within 1 ms of
			// each other count as arriving together.
			name: "raced",
			callers: [][]scaleWait{
				{{ms(0), ms(400)}},
				{{500, ms(100)}, {ms(100), ms(500)}},
			},
			worst: 300 * time.Millisecond,
			over:  1,
			tied:  true,
		},
		{
			// A lone caller is never overtaken, however long it waits.
			name:    "alone",
			callers: [][]scaleWait{{{ms(0), ms(5000)}}},
		},
	} {
		all, steady := fcfsExcess(tc.callers, fcfsSlack, time.Millisecond, 0)
		if all.worst != tc.worst || all.over != tc.over {
			t.Errorf("%s: worst %v over %d, want %v and %d", tc.name, all.worst, all.over, tc.worst, tc.over)
		}
		// Every wait above begins at 0 but for the ones of "in turn" and
		// "bunched" that follow a grant, which no caller overtakes by more
		// than 1 ms.
		if steady.worst > time.Millisecond || steady.over != 0 {
			t.Errorf("%s: from 1 ms on, worst %v over %d, want at most 1ms and 0", tc.name, steady.worst, steady.over)
		}
		if tied, _ := fcfsExcess(tc.callers, fcfsSlack, time.Millisecond, fcfsTie); tc.tied && tied != (fcfsFigures{}) {
			t.Errorf("%s: callers within %v together: worst %v over %d, want none", tc.name, fcfsTie, tied.worst, tied.over)
		} else if !tc.tied && tied.over != tc.over {
			t.Errorf("%s: callers within %v together: over %d, want %d as strictly", tc.name, fcfsTie, tied.over, tc.over)
		}
	}
}
