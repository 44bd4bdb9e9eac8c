package campaign

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Arrival is one request the recording sink received.
type Arrival struct {
	ID    int
	To    string // the recipient, the key of a per-recipient layer
	From  string // the sender
	Acct  string // the account, the key of a quota layer
	Class string // the priority class the message was published with
	At    time.Time
	// Replica is the replica that sent it (ReplicaHeader), "" when
	// unknown.
	Replica string
}

// Window is a window of arrivals.
type Window struct {
	N     int       // arrivals in [At, At+Width)
	At    time.Time // the first of them
	Width time.Duration
	Bound int // the most it may hold
}

func (w Window) String() string {
	return fmt.Sprintf("%d in %v from %s (bound %d)", w.N, w.Width, w.At.Format("15:04:05.000"), w.Bound)
}

// Times returns the arrival times of as, sorted.
func Times(as []Arrival) []time.Time {
	ts := make([]time.Time, len(as))
	for i, a := range as {
		ts[i] = a.At
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts
}

// Windows scans every window of the given width that starts at an arrival
// of ts (sorted) and returns the busiest one and those holding more than
// bound(start), each with its bound. A nil bound checks nothing.
func Windows(ts []time.Time, width time.Duration, bound func(from time.Time) int) (busiest Window, over []Window) {
	j := 0
	for i, t := range ts {
		if j < i {
			j = i
		}
		end := t.Add(width)
		for j < len(ts) && ts[j].Before(end) {
			j++
		}
		w := Window{N: j - i, At: t, Width: width}
		if bound != nil {
			w.Bound = bound(t)
			if w.N > w.Bound {
				over = append(over, w)
			}
		}
		if w.N > busiest.N || (w.N == busiest.N && w.N-w.Bound > busiest.N-busiest.Bound) {
			busiest = w
		}
	}
	return busiest, over
}

// StallBound widens bound, the most arrivals a window may hold from a
// limiter at rate on a machine that never stalls, by the arrivals due in
// stall: a stall longer than one interval releases the arrivals held up
// during it together (the same rule as internal/testenv.WindowBound).
func StallBound(bound int, rate float64, stall time.Duration) int {
	if rate <= 0 || stall <= time.Duration(float64(time.Second)/rate) {
		return bound
	}
	return bound + int(math.Ceil(rate*stall.Seconds()))
}

// Gap is the closest approach of a key's arrivals: arrival I and arrival
// I+Lag of the key, D apart.
type Gap struct {
	Key  string
	D    time.Duration
	Want time.Duration // the least D allowed for this pair; 0 when not asked
	At   time.Time     // the earlier arrival
	N    int           // the key's arrivals
}

func (g Gap) String() string {
	if g.N < 2 {
		return "no key with two arrivals"
	}
	return fmt.Sprintf("%v (key %s, from %s)", g.D.Round(time.Millisecond), g.Key, g.At.Format("15:04:05.000"))
}

// PerKey groups the arrival times of as by key(a), each sorted. Arrivals
// whose key is empty are left out.
func PerKey(as []Arrival, key func(Arrival) string) map[string][]time.Time {
	out := map[string][]time.Time{}
	for _, a := range as {
		if k := key(a); k != "" {
			out[k] = append(out[k], a.At)
		}
	}
	for _, ts := range out {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	}
	return out
}

// ClosestGap returns, over every key, the pair of arrivals lag apart in
// the key's order (lag is the layer's burst: a full bucket grants burst at
// once, so only arrivals burst apart must be a refill apart) that comes
// closest to its least gap want(earlier, later), or simply the closest
// pair when want is nil, leaving out pairs that skip says to. Its D is an
// hour when no key has a pair.
func ClosestGap(perKey map[string][]time.Time, lag int, skip func(a, b time.Time) bool, want func(a, b time.Time) time.Duration) Gap {
	g := Gap{D: time.Hour}
	keys := make([]string, 0, len(perKey))
	for k := range perKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ts := perKey[k]
		for i := 0; i+lag < len(ts); i++ {
			a, b := ts[i], ts[i+lag]
			if skip != nil && skip(a, b) {
				continue
			}
			var w time.Duration
			if want != nil {
				w = want(a, b)
			}
			if d := b.Sub(a); d-w < g.D-g.Want {
				g = Gap{Key: k, D: d, Want: w, At: a, N: len(ts)}
			}
		}
	}
	return g
}

// Gaps returns the 12 shortest gaps between a key's consecutive
// arrivals, sorted, for reports.
func Gaps(ts []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(ts); i++ {
		out = append(out, ts[i].Sub(ts[i-1]).Round(time.Millisecond))
	}
	slices.Sort(out)
	return out[:min(len(out), 12)]
}

// RateChange is an operator's `bucket set`: the rate in force is Rate
// (0: the configured rate, after --clear) from To on; between From (the
// command started) and To (it returned) either rate may be in force.
type RateChange struct {
	From, To time.Time
	Rate     float64
}

// Disturbance is a stretch during which a fault legitimately allows more
// than the steady bounds, per the documented failure modes
// (docs/operations.md): a Redis outage under the local fallback, or Redis
// restarted empty. It lasts from the fault to a settling time after the
// heal.
type Disturbance struct {
	Kind     string
	From, To time.Time
	// ExtraBursts is how many more bursts of the shared bucket it may
	// grant: one for a Redis outage under the local fallback (the fault
	// tests' documented bound is rate + 2 × burst).
	ExtraBursts int
	// ExtraKeyBursts is how many more bursts of each keyed layer, per
	// key, and whole allowances of each quota it may grant: one for the
	// fallback ("a keyed bucket's burst once per key, and a quota's whole
	// allowance once in the window the outage started in"), one more
	// when Redis restarted empty and forgot what each key had used (the
	// drain on the way back covers the shared bucket only).
	ExtraKeyBursts int
}

// KeyedLayer is a token-bucket layer keyed by a field of the message.
type KeyedLayer struct {
	Name  string
	Key   func(Arrival) string
	Rate  float64 // per second
	Burst int
	// Open, when set, names a known defect of this layer's spacing that
	// is still open (docs/campaign.md): a pair too close is logged as an
	// open finding with this text instead of failing the check. Every
	// other promise about the layer still fails it.
	Open string
	// HardFraction, when set with Open, still fails a pair closer than
	// this fraction of the spacing, less the stall around it: the open
	// finding covers pairs between it and GapFraction only.
	HardFraction float64
}

// QuotaLayer is a calendar quota keyed by a field of the message, with
// on_exceed: dead_letter.
type QuotaLayer struct {
	Name  string
	Key   func(Arrival) string
	Quota int
	Per   time.Duration // time.Hour: UTC calendar hours
}

// Spec is what a run promised, for Check.
type Spec struct {
	Rate  float64 // the configured shared rate
	Burst int
	// ArrivalAllowance is added to the 1 s and 100 ms windows' bounds for
	// the sink's arrival jitter; see Check.
	ArrivalAllowance int
	Overrides        []RateChange
	Disturbances     []Disturbance
	Keyed            []KeyedLayer
	Quotas           []QuotaLayer
	// GapFraction is the share of a layer's spacing that the closest
	// pair of a key must keep, 0.85 when 0.
	GapFraction float64
	// Stall is the longest the checking process stood still; timing
	// bounds are widened by it, and only by it.
	Stall time.Duration
	// StallIn, when set, returns the longest stall from one instant to
	// another, and each bound is widened only by the stalls around the
	// window or pair it judges (Stall is then the longest of the run,
	// for the report).
	StallIn func(from, to time.Time) time.Duration
	// Published is every message published, by id.
	Published map[int]Arrival
	// DeadLettered counts the dead letters by id.
	DeadLettered map[int]int
	// Queued counts the messages still in the queue or set aside in the
	// delay queue at the end, by id: neither lost nor delivered.
	Queued map[int]int
	// MayDeadLetter reports whether a message may legitimately be
	// dead-lettered (refused by a quota with on_exceed: dead_letter).
	MayDeadLetter func(Arrival) bool
	// DupBound is the most duplicate deliveries the faults allow.
	DupBound int
	// Events are the faults as they happened, named in a violation
	// within 5 s before it or 1 s after.
	Events []Event
}

// Event is a fault injected or healed at At.
type Event struct {
	At   time.Time
	What string
}

// near names the events from 5 s before t to 1 s after.
func (s *Spec) near(t time.Time) string {
	var out []string
	for _, e := range s.Events {
		if d := t.Sub(e.At); d <= 5*time.Second && d >= -time.Second {
			out = append(out, fmt.Sprintf("%s at %s", e.What, e.At.Format("15:04:05.000")))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " [near " + strings.Join(out, "; ") + "]"
}

// Report is what Check found: Lines to log, and Violations, each a
// broken promise.
type Report struct {
	Lines      []string
	Violations []string
	Busiest1s  Window
	Busiest100 Window
	Closest    map[string]Gap // by layer
	Duplicates int
	Lost       []int
}

func (r *Report) logf(format string, args ...any) {
	r.Lines = append(r.Lines, fmt.Sprintf(format, args...))
}
func (r *Report) failf(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// OK reports whether no promise was broken.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// rateAt returns the most the shared rate can have been in [from, to):
// the configured rate or an override, taking either side of a change
// while its command ran.
func (s *Spec) rateAt(from, to time.Time) float64 {
	cur := s.Rate
	best := 0.0
	consider := func(r float64) {
		if r == 0 {
			r = s.Rate
		}
		best = max(best, r)
	}
	for _, c := range s.Overrides {
		if !c.From.After(from) && !c.To.After(from) {
			cur = c.Rate // in force before the interval
			continue
		}
		if c.From.Before(to) {
			consider(c.Rate) // changed within the interval
		}
	}
	consider(cur)
	return best
}

// disturbed returns the extra bursts of the shared bucket and of the
// keyed layers of the disturbances overlapping [from, to].
func (s *Spec) disturbed(from, to time.Time) (shared, keyed int) {
	for _, d := range s.Disturbances {
		if d.From.Before(to) && !d.To.Before(from) {
			shared += d.ExtraBursts
			keyed += d.ExtraKeyBursts
		}
	}
	return shared, keyed
}

// Bound returns the most deliveries a window of width from start may
// hold: burst + rate × width, the rate being the highest in force from 1 s
// before the window (a changed rate reaches every replica's sleepers
// within about a second) to its end, with one more burst per overlapping
// disturbance, plus allowance, widened for the stall.
func (s *Spec) Bound(start time.Time, width time.Duration, allowance int) int {
	rate := s.rateAt(start.Add(-time.Second), start.Add(width))
	extra, _ := s.disturbed(start, start.Add(width))
	bursts := 1 + extra
	b := int(math.Floor(float64(bursts*s.Burst)+rate*width.Seconds()+1e-9)) + allowance
	return StallBound(b, rate, s.stallIn(start.Add(-time.Second), start.Add(width+time.Second)))
}

// stallIn returns the longest stall from from to to: StallIn's, or the
// run's when there is none.
func (s *Spec) stallIn(from, to time.Time) time.Duration {
	if s.StallIn != nil {
		return s.StallIn(from, to)
	}
	return s.Stall
}

// Check verifies arrivals against spec:
//
//   - every 1 s window holds at most rate + burst (Bound), every 100 ms
//     window burst + rate/10, each + ArrivalAllowance: a window of
//     arrivals holds grants from a little longer;
//   - for each keyed layer, first arrivals of a key Burst apart in its
//     order (a duplicate counts against DupBound instead) are
//     at least GapFraction of the layer's spacing (1/rate) apart, less the
//     stall around them (a late timestamp shortens the gap after it by at
//     most that);
//     pairs touching a disturbance are left out, and instead the key's
//     arrivals during it are at most (1+ExtraKeyBursts) bursts plus the
//     rate × its length, plus one;
//   - for each quota, a key's arrivals in one calendar window are at most
//     the quota times one plus the ExtraKeyBursts of the disturbances in
//     it;
//   - every published message was delivered, or dead-lettered where
//     MayDeadLetter allows;
//   - deliveries beyond the first of each message (and a message both
//     delivered and dead-lettered) are at most DupBound.
func Check(arrivals []Arrival, spec Spec) *Report {
	r := &Report{Closest: map[string]Gap{}}
	ts := Times(arrivals)
	if len(ts) == 0 {
		r.failf("no message reached the sink")
		return r
	}
	frac := spec.GapFraction
	if frac == 0 {
		frac = 0.85
	}
	r.logf("%d deliveries from %s to %s (%.1f s); longest stall of the checking process %v",
		len(ts), ts[0].Format("15:04:05.000"), ts[len(ts)-1].Format("15:04:05.000"), ts[len(ts)-1].Sub(ts[0]).Seconds(), spec.Stall.Round(time.Millisecond))

	for _, w := range []struct {
		width     time.Duration
		allowance int
		out       *Window
	}{{time.Second, spec.ArrivalAllowance, &r.Busiest1s}, {100 * time.Millisecond, spec.ArrivalAllowance, &r.Busiest100}} {
		busiest, over := Windows(ts, w.width, func(from time.Time) int { return spec.Bound(from, w.width, w.allowance) })
		*w.out = busiest
		r.logf("busiest %v window: %v; %d windows over their bound", w.width, busiest, len(over))
		for i, o := range over {
			if i == 5 {
				r.failf("... %d more %v windows over their bound", len(over)-5, w.width)
				break
			}
			r.failf("shared bucket: %v%s", o, spec.near(o.At))
		}
	}

	inDisturbance := func(t time.Time) bool { _, k := spec.disturbed(t, t); return k > 0 }
	// A duplicate is counted against DupBound, not against its key's
	// spacing: a copy set aside twice by a crash carries the same paid
	// slot, and both copies may go out at once.
	var firsts []Arrival
	seen := map[int]bool{}
	for _, a := range arrivals {
		if !seen[a.ID] {
			seen[a.ID] = true
			firsts = append(firsts, a)
		}
	}
	for _, l := range spec.Keyed {
		perKey := PerKey(firsts, l.Key)
		spacing := time.Duration(float64(time.Second) / l.Rate)
		want := func(a, b time.Time) time.Duration {
			return time.Duration(frac*float64(spacing)) - spec.stallIn(a.Add(-time.Second), b.Add(time.Second))
		}
		g := ClosestGap(perKey, max(l.Burst, 1), func(a, b time.Time) bool { return inDisturbance(a) || inDisturbance(b) }, want)
		r.Closest[l.Name] = g
		if g.N >= 2 {
			r.logf("%s (%v/s burst %d, %d keys): the pair %d apart closest to its bound %v, want >= %v; shortest gaps of that key %v",
				l.Name, l.Rate, l.Burst, len(perKey), max(l.Burst, 1), g, g.Want.Round(time.Millisecond), Gaps(perKey[g.Key]))
		} else {
			r.logf("%s (%d keys): %v", l.Name, len(perKey), g)
		}
		report := r.failf
		if l.Open != "" {
			report = func(format string, args ...any) {
				r.logf("open finding ("+l.Open+"): "+format, args...)
			}
		}
		if g.N >= 2 && g.D < g.Want {
			who := ""
			if by := senders(firsts, l.Key, g); by != "" {
				who = " (" + by + ")"
			}
			if l.Open != "" && l.HardFraction > 0 && g.D < g.Want-time.Duration((frac-l.HardFraction)*float64(spacing)) {
				report = r.failf // beyond what the open finding covers
			}
			report("%s: arrivals of key %s%s %d apart only %v apart from %s, want >= %v (%.0f%% of %v, less the %v stall around them)%s; its shortest gaps %v",
				l.Name, g.Key, who, max(l.Burst, 1), g.D.Round(time.Millisecond), g.At.Format("15:04:05.000"), g.Want.Round(time.Millisecond),
				100*frac, spacing, (time.Duration(frac*float64(spacing)) - g.Want).Round(time.Millisecond), spec.near(g.At), Gaps(perKey[g.Key]))
		}
		for _, d := range spec.Disturbances {
			allowed := (1+d.ExtraKeyBursts)*l.Burst + int(l.Rate*d.To.Sub(d.From).Seconds()) + 1
			for k, kts := range perKey {
				n := 0
				for _, t := range kts {
					if !t.Before(d.From) && !t.After(d.To) {
						n++
					}
				}
				if n > allowed {
					r.failf("%s: key %s got %d during %s (%s to %s), want at most %d", l.Name, k, n, d.Kind,
						d.From.Format("15:04:05.000"), d.To.Format("15:04:05.000"), allowed)
				}
			}
		}
	}

	for _, q := range spec.Quotas {
		type slot struct {
			key   string
			start time.Time
		}
		counts := map[slot]int{}
		for _, a := range arrivals {
			if k := q.Key(a); k != "" {
				counts[slot{k, a.At.UTC().Truncate(q.Per)}]++
			}
		}
		most := 0
		for s, n := range counts {
			most = max(most, n)
			_, extra := spec.disturbed(s.start, s.start.Add(q.Per))
			allowed := q.Quota * (1 + extra)
			if n > allowed {
				r.failf("%s: key %s got %d in the window from %s, want at most %d", q.Name, s.key, n, s.start.Format(time.RFC3339), allowed)
			}
		}
		r.logf("%s (quota %d per %v): the most a key got in one window: %d", q.Name, q.Quota, q.Per, most)
	}

	if spec.Published != nil {
		delivered := map[int]int{}
		for _, a := range arrivals {
			delivered[a.ID]++
		}
		var unknown []int
		for id := range delivered {
			if _, ok := spec.Published[id]; !ok {
				unknown = append(unknown, id)
			}
		}
		dead, badDead := 0, []int{}
		for id, n := range spec.DeadLettered {
			dead += n
			m, ok := spec.Published[id]
			if !ok || spec.MayDeadLetter == nil || !spec.MayDeadLetter(m) {
				badDead = append(badDead, id)
			}
			r.Duplicates += n - 1
			if delivered[id] > 0 {
				r.Duplicates += n
			}
		}
		for _, n := range delivered {
			r.Duplicates += n - 1
		}
		var queued []int
		for id := range spec.Published {
			switch {
			case delivered[id] > 0 || spec.DeadLettered[id] > 0:
			case spec.Queued[id] > 0:
				queued = append(queued, id)
			default:
				r.Lost = append(r.Lost, id)
			}
		}
		slices.Sort(queued)
		slices.Sort(r.Lost)
		slices.Sort(badDead)
		slices.Sort(unknown)
		r.logf("%d published: %d delivered, %d dead-lettered, %d still queued, %d lost, %d duplicates (bound %d)",
			len(spec.Published), len(delivered), dead, len(queued), len(r.Lost), r.Duplicates, spec.DupBound)
		if len(queued) > 0 {
			r.failf("%d messages not delivered by the end, still in the queue or set aside: %s", len(queued), ids(queued))
		}
		if len(r.Lost) > 0 {
			r.failf("%d messages lost: %s", len(r.Lost), ids(r.Lost))
		}
		if len(badDead) > 0 {
			r.failf("%d messages dead-lettered that no limit refuses: %s", len(badDead), ids(badDead))
		}
		if len(unknown) > 0 {
			r.failf("%d deliveries of messages never published: %s", len(unknown), ids(unknown))
		}
		if r.Duplicates > spec.DupBound {
			r.failf("%d duplicate deliveries, want at most %d", r.Duplicates, spec.DupBound)
		}
	}
	return r
}

// ids formats up to 20 ids.
func ids(xs []int) string {
	var parts []string
	for i, x := range xs {
		if i == 20 {
			parts = append(parts, fmt.Sprintf("... (%d more)", len(xs)-20))
			break
		}
		parts = append(parts, fmt.Sprint(x))
	}
	return strings.Join(parts, " ")
}

// senders names the replicas that sent the pair g of layer key's arrivals
// (its first at g.At, its last g.D later), in order: "sent by replicas 2
// and 3", or "" when the arrivals do not say.
func senders(arrivals []Arrival, key func(Arrival) string, g Gap) string {
	var first, last string
	for _, a := range arrivals {
		if key(a) != g.Key || a.Replica == "" {
			continue
		}
		switch {
		case a.At.Equal(g.At) && first == "":
			first = a.Replica
		case a.At.Equal(g.At.Add(g.D)):
			last = a.Replica
		}
	}
	if first == "" || last == "" {
		return ""
	}
	return "sent by replicas " + first + " and " + last
}
