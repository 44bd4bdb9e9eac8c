package cli

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A replica watches its own stalls: a timer due every stallTick that fires
// late says the process did not run meanwhile (CPU starvation, a long GC
// pause, the machine swapping). A message granted just before such a
// stall goes out that much later than its slot, so the next message of its
// key, granted to another replica for a spacing after the slot, reaches
// the sink closer than the spacing by up to the stall. The limiter cannot
// see a stall after its grant; the replica reports it, so that an operator
// (and the fleet tests) can tell such a pair from a limiter's fault.

const (
	// stallTick is how often the watch expects to run.
	stallTick = 10 * time.Millisecond
	// stallObserved is the shortest stall the histogram counts.
	stallObserved = 10 * time.Millisecond
	// stallLogged is the shortest stall the replica logs.
	stallLogged = 50 * time.Millisecond
	// stallLogEvery is the most often it logs one: each line reports the
	// stalls since the previous one.
	stallLogEvery = time.Second
)

// stallLog collects the stalls to log, at most one line per stallLogEvery.
// watchStalls' goroutine owns it: not safe for concurrent use.
type stallLog struct {
	count    int           // stalls collected, not yet logged
	longest  time.Duration // the longest of them
	from, to time.Time     // the first one's start, the last one's end
	logged   time.Time     // when the last line was logged
}

// add records that the process did not run from from to to.
func (s *stallLog) add(from, to time.Time) {
	d := to.Sub(from)
	if d < stallLogged {
		return
	}
	if s.count == 0 {
		s.from = from
	}
	s.count++
	s.longest = max(s.longest, d)
	s.to = to
}

// flush returns the line's attributes when stalls were collected and no
// line was logged in the last stallLogEvery before now, and forgets them.
func (s *stallLog) flush(now time.Time) ([]any, bool) {
	if s.count == 0 || !s.logged.IsZero() && now.Sub(s.logged) < stallLogEvery {
		return nil, false
	}
	attrs := []any{"longest", s.longest, "stalls", s.count, "from", s.from, "to", s.to}
	*s = stallLog{logged: now}
	return attrs, true
}

// stallHistogram is throttle_process_stall_seconds, registered on reg.
func stallHistogram(reg prometheus.Registerer) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "throttle_process_stall_seconds",
		Help: fmt.Sprintf("Stalls of the replica process of %v or more: how late a timer due every %v ran. "+
			"A message granted just before a stall goes out that much late, closer to its key's next message than a layer's spacing.", stallObserved, stallTick),
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
	})
	reg.MustRegister(h)
	return h
}

// watchStalls measures the process's stalls until ctx ends, by now (the
// wall clock; tests move it): each into h from stallObserved, and a
// warning from stallLogged, at most one line per stallLogEvery with the
// longest and the count since the last line.
func watchStalls(ctx context.Context, log *slog.Logger, h prometheus.Observer, now func() time.Time) {
	t := time.NewTimer(stallTick)
	defer t.Stop()
	var sl stallLog
	for {
		due := now().Add(stallTick)
		t.Reset(stallTick)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := now()
		if late := now.Sub(due); late >= stallObserved {
			h.Observe(late.Seconds())
			sl.add(due, now)
		}
		if attrs, ok := sl.flush(now); ok {
			log.Warn("the process stalled: messages granted just before went out that late, so a key's next message may reach the sink closer than its layer's spacing by as much (CPU starved, or a long GC pause)", attrs...)
		}
	}
}
