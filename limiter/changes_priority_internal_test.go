package limiter

import (
	"testing"
	"time"
)

// TestReservationPushSteps: a low reservation, 10 tokens (1 s at 10/s)
// from its due instant, that has seen the low counter at 5, hears pushes
// and catches up with the counters of a status read, step by step.
func TestReservationPushSteps(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	r := reservation{due: at(1000), pos: 10, rate: 10, base: 10, class: PriorityLow, pushed: 5}
	low := func(tokens, counter float64, ms int) func(reservation) reservation {
		return func(r reservation) reservation {
			return r.push(Push{Class: PriorityLow, Tokens: tokens, Counter: counter, At: at(ms)})
		}
	}
	status := func(counter float64) func(reservation) reservation {
		return func(r reservation) reservation {
			var st State
			st.Pushed[PriorityLow] = counter
			return r.catchUp(st)
		}
	}
	steps := []struct {
		name   string
		step   func(reservation) reservation
		due    int // ms after base
		pos    float64
		pushed float64
	}{
		{"a push before it is due: 2 tokens back", low(2, 7, 500), 1200, 12, 7},
		{"the same push again: nothing", low(2, 7, 500), 1200, 12, 7},
		{"a push of another class: nothing", func(r reservation) reservation {
			return r.push(Push{Class: PriorityNormal, Tokens: 2, Counter: 9, At: at(500)})
		}, 1200, 12, 7},
		{"a push after 2 missed tokens: 1+2 back", low(1, 10, 600), 1500, 15, 10},
		{"a push after it is due, 1 missed: 1 back", low(1, 12, 2000), 1600, 16, 12},
		{"a push at its due instant: nothing", low(1, 13, 1600), 1600, 16, 13},
		{"a status 2 tokens ahead: 2 back", status(15), 1800, 18, 15},
		{"a status counter below its own (reset): nothing", status(3), 1800, 18, 3},
		{"then a push counted from the reset: 1 back", low(1, 4, 1000), 1900, 19, 4},
	}
	for _, s := range steps {
		r = s.step(r)
		if !r.due.Equal(at(s.due)) || r.pos != s.pos || r.pushed != s.pushed {
			t.Fatalf("%s: due +%v, pos %v, counter %v; want +%dms, %v, %v",
				s.name, r.due.Sub(base), r.pos, r.pushed, s.due, s.pos, s.pushed)
		}
	}
}

// TestPushRingKeepsTheRecentPushes: a sleeper that falls behind the ring
// gets the pushes the ring still holds, and the counters move it back by
// the ones it missed too: 40 pushes of one token, 40 tokens in all. A push
// wakes only the sleepers of its class.
func TestPushRingKeepsTheRecentPushes(t *testing.T) {
	var h pushHub
	h.init()
	base := time.Unix(1_700_000_000, 0)
	seen := h.heard()
	_, _, lowWake := h.since(PriorityLow, seen[PriorityLow])
	_, _, normalWake := h.since(PriorityNormal, seen[PriorityNormal])
	for i := 1; i <= 40; i++ {
		h.add(Push{Class: PriorityLow, Tokens: 1, Counter: float64(i), At: base})
	}
	select {
	case <-lowWake:
	default:
		t.Fatal("a low push did not wake the low sleepers")
	}
	select {
	case <-normalWake:
		t.Fatal("a low push woke the normal sleepers")
	default:
	}
	ps, next, _ := h.since(PriorityLow, seen[PriorityLow])
	if len(ps) != pushRing || next != 40 || ps[0].Counter != 40-pushRing+1 {
		t.Fatalf("since: %d pushes from counter %v, next %d; want %d from %d, 40", len(ps), ps[0].Counter, next, pushRing, 40-pushRing+1)
	}
	r := reservation{due: base.Add(time.Second), pos: 10, rate: 10, base: 10, class: PriorityLow}
	for _, p := range ps {
		r = r.push(p)
	}
	if r.pos != 50 || !r.due.Equal(base.Add(5*time.Second)) || r.pushed != 40 {
		t.Fatalf("after the ring: pos %v, due +%v, counter %v; want 50, +5s, 40", r.pos, r.due.Sub(base), r.pushed)
	}
	if ps, next, _ := h.since(PriorityLow, next); len(ps) != 0 || next != 40 {
		t.Fatalf("since the last: %d pushes, next %d; want none, 40", len(ps), next)
	}
}
