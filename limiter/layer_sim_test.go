package limiter_test

import (
	"container/heap"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// simEvent is a worker asking the store at an instant.
type simEvent struct {
	at     time.Duration
	worker int
}

type simQueue []simEvent

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].worker < q[j].worker)
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *simQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type simSend struct {
	at  time.Duration
	key string
}

// simulateLayers runs workers that each take the next message of keys (in
// order) and ask the store for it, as WaitN does with horizon: a grant
// with a wait goes out then, a refusal to wait comes back after the wait.
// It returns the sends, in the order they go out.
func simulateLayers(t *testing.T, m *limiter.LayeredMemory, keys []string, workers int, horizon time.Duration) []simSend {
	t.Helper()
	calls := 0
	defer func() { t.Logf("%d store calls for %d messages", calls, len(keys)) }()
	var (
		q     simQueue
		next  int
		sends []simSend
		cur   = make([]int, workers)
	)
	for w := range workers {
		cur[w] = -1
		heap.Push(&q, simEvent{0, w})
	}
	for q.Len() > 0 && len(sends) < len(keys) {
		e := heap.Pop(&q).(simEvent)
		if cur[e.worker] < 0 {
			if next == len(keys) {
				continue
			}
			cur[e.worker], next = next, next+1
		}
		key := keys[cur[e.worker]]
		calls++
		res, err := m.TakeLayersAt(storetest.Base.Add(e.at), limiter.LayerRequest{Cost: 1, MaxWait: horizon, Keys: map[string]string{"per-key": key}})
		if err != nil || res.Exceeded != nil {
			t.Fatalf("take at +%v: %v %v", e.at, err, res.Exceeded)
		}
		if !res.Granted {
			heap.Push(&q, simEvent{e.at + res.Wait, e.worker})
			continue
		}
		sends = append(sends, simSend{e.at + res.Wait, key})
		cur[e.worker] = -1
		heap.Push(&q, simEvent{e.at + res.Wait, e.worker})
	}
	slices.SortStableFunc(sends, func(a, b simSend) int { return int(a.at - b.at) })
	return sends
}

// busiest returns the most sends in any window of width w.
func busiest(sends []simSend, w time.Duration) int {
	most, j := 0, 0
	for i := range sends {
		for sends[i].at-sends[j].at >= w {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// closestGap returns the shortest time between two sends of one key.
func closestGap(sends []simSend) (time.Duration, string) {
	last := map[string]time.Duration{}
	gap, which := time.Duration(1<<62), ""
	for _, s := range sends {
		if p, ok := last[s.key]; ok && s.at-p < gap {
			gap, which = s.at-p, s.key
		}
		last[s.key] = s.at
	}
	return gap, which
}

// TestLayeredSendsKeepEveryLimit decides, at explicit instants, what many
// consumers ask of a shared bucket with a per-recipient layer, and checks
// the sends as a provider sees them: the busiest 1 s and 100 ms against
// the shared bucket's rate and burst, and the closest two sends to one
// recipient against the layer's spacing.
//
// When the layer's wait was reserved as a whole on every layer, the
// shared bucket's tokens were taken when the wait began while the
// messages went out when it ended: 30 messages within 19 ms about every
// 2 s (busiest 100 ms 30 against 7), and gaps of 1.26 s against 2 s. When
// the shared bucket was the longer wait, the layer was charged when the
// wait began, so a recipient's next message found it refilled: 3 sends
// within 0.4 s against 1/s.
func TestLayeredSendsKeepEveryLimit(t *testing.T) {
	for _, c := range []struct {
		name        string
		rate        float64
		burst       int
		layer       limiter.Layer
		keys        []string
		workers     int
		horizon     time.Duration
		spacing     time.Duration
		wantAtLeast float64 // the sends' rate, against what the limits allow
	}{
		{
			name: "a binding per-recipient layer", rate: 20, burst: 5,
			layer: limiter.Layer{Name: "per-key", Keyed: true, Rate: 0.5, Burst: 1},
			keys:  roundRobin(30, 5), workers: 60, horizon: time.Second, spacing: 2 * time.Second,
		},
		{
			name: "a binding per-recipient layer, a long horizon", rate: 20, burst: 5,
			layer: limiter.Layer{Name: "per-key", Keyed: true, Rate: 0.5, Burst: 1},
			keys:  roundRobin(30, 5), workers: 60, horizon: 10 * time.Second, spacing: 2 * time.Second,
		},
		{
			name: "a binding shared bucket", rate: 20, burst: 5,
			layer: limiter.Layer{Name: "per-key", Keyed: true, Rate: 0.5, Burst: 1},
			keys:  roundRobin(100, 3), workers: 60, horizon: 10 * time.Second, spacing: 2 * time.Second,
		},
		{
			name: "a hot recipient behind a shared backlog", rate: 5, burst: 1,
			layer: limiter.Layer{Name: "per-key", Keyed: true, Rate: 1, Burst: 1},
			keys:  append(append([]string{"H"}, roundRobin(30, 1)...), "H", "H", "H"), workers: 34, horizon: 10 * time.Second, spacing: time.Second,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newLayeredMemory(t, c.rate, c.burst, []limiter.Layer{c.layer})
			sends := simulateLayers(t, m, c.keys, c.workers, c.horizon)
			if len(sends) != len(c.keys) {
				t.Fatalf("%d sends, want %d", len(sends), len(c.keys))
			}
			second, tenth := busiest(sends, time.Second), busiest(sends, 100*time.Millisecond)
			gap, key := closestGap(sends)
			t.Logf("busiest 1 s %d (bound %v), 100 ms %d; closest gap %v (%s); last send at +%v",
				second, c.rate+float64(c.burst), tenth, gap, key, sends[len(sends)-1].at)
			if float64(second) > c.rate+float64(c.burst) {
				t.Errorf("busiest 1 s window: %d sends, bound rate+burst %v", second, c.rate+float64(c.burst))
			}
			if bound := float64(c.burst) + c.rate/10 + 1; float64(tenth) > bound {
				t.Errorf("busiest 100 ms window: %d sends, bound burst+rate/10 (+1) %v", tenth, bound)
			}
			if gap < c.spacing-time.Microsecond {
				t.Errorf("closest two sends to %s: %v apart, the layer's spacing is %v", key, gap, c.spacing)
			}
		})
	}
}

// roundRobin returns keys k0..k(n-1), each rounds times, in turns.
func roundRobin(n, rounds int) []string {
	var out []string
	for range rounds {
		for i := range n {
			out = append(out, fmt.Sprint("k", i))
		}
	}
	return out
}
