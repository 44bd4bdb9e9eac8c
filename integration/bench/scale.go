package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/throttlehq/throttle/limiter"
)

// The scale mode (-scale) runs N replicas in this process, each with its
// own Redis client and its own limiter.Bucket, on one private redis-server
// per rate and N, and measures the grants as the callers receive them
// (when Wait returns), not as Redis decided them: the busiest one-second
// window against rate + burst, each replica's share, the longest single
// Wait, the utilisation when a few replicas want everything and the rest
// little, the recovery after half the replicas vanish without Close, and
// what each grant cost Redis (INFO commandstats, INFO cpu) and this
// process.

// scaleConfig is the -scale command line.
type scaleConfig struct {
	ns       []int
	rates    []float64
	phases   []string
	duration time.Duration // each saturated and unequal phase
	recovery time.Duration // the recovery phase after the vanish
	callers  int           // callers of each saturated replica
	lease    string        // "auto": off below 1e5/s, on from it; "on"; "off"
	// leaseCalls is limiter.LeaseOptions.Calls of every replica (0: the
	// default), the refills per second the fleet aims at.
	leaseCalls float64
	// burst is the bucket's burst in seconds of its rate (default 0.1).
	burst float64
	out   string
	flags string
	// cpuProfile, when set, is where a CPU profile of the whole run goes.
	cpuProfile string
	// goroutines, when set, is where the goroutines of each saturated
	// phase go, 1.5 s into it (pprof's text form, grouped by stack).
	goroutines string
}

// quietLogger drops go-redis's log lines: the recovery phase closes
// clients under their callers on purpose, and go-redis says so for each
// connection.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// scaleClientOptions are each replica's client options: a pool as large
// as the replica's callers can use at once (each caller's Take, or with
// leasing the refill's leader alone, and a heartbeat), small buffers, and
// RESP2 without maintenance notifications, so that a thousand clients in
// one process cost it what a thousand replicas' limiters would, not a
// thousand default pools (32 KiB buffers per connection, RESP3's push
// check on every reply, two background goroutines per client).
func scaleClientOptions(addr string, callers int) *redis.Options {
	return &redis.Options{
		Addr:                     addr,
		PoolSize:                 callers + 1,
		Protocol:                 2,
		ReadBufferSize:           4096,
		WriteBufferSize:          4096,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// scalePhases are the phases of each rate and N, in order.
var scalePhases = []string{"saturated", "unequal", "recovery"}

// parseInts parses a comma-separated list of positive integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseRates parses a comma-separated list of rates (tokens/s).
func parseRates(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 || math.IsInf(r, 0) {
			return nil, fmt.Errorf("%q is not a rate above 0", f)
		}
		out = append(out, r)
	}
	return out, nil
}

// scaleRun is one rate and N: its phases' figures.
type scaleRun struct {
	rate     float64
	burst    int
	n        int
	leased   bool
	sat      *scaleFigures
	unequal  *scaleFigures
	recovery *recoveryFigures
}

// scaleFigures are what one phase measured.
type scaleFigures struct {
	d            time.Duration
	granted      int64   // in the whole phase
	steadyRate   float64 // grants/s from 1 s to the end
	worstWindow  int64   // most grants in a 1 s window, sliding by 1 ms
	firstSecond  int64   // grants in [0, 1 s)
	secondSecond int64   // grants in [1 s, 2 s)
	shareLo      float64 // least replica's grants / mean, steady part
	shareHi      float64
	worstWait    time.Duration
	// worstSteadyWait is the worst wait begun 1 s or more into the
	// phase, after the start-up wave (every caller's first call at once)
	// has reached the store.
	worstSteadyWait time.Duration
	waitsOver1s     int64
	// fcfs is how far the waits exceeded first come, first served among
	// their replica's callers (fcfsExcess), fcfsTied the same with callers
	// that began within fcfsTie of each other counted as arriving
	// together; of waits in all.
	fcfs, fcfsTied fcfsCount
	waits          int64
	// utilisation parts (unequal phase)
	satPerReplica   float64 // grants/s of each saturated replica
	pacedPerReplica float64 // grants/s of each paced replica
	pacedAsked      float64 // what each paced replica asked, grants/s
	// costs over the steady part
	scripts      int64 // EVAL/EVALSHA run by Redis
	redisCPU     time.Duration
	processCPU   time.Duration
	steadyTokens int64
	steadyFor    time.Duration
	// retimed is the reservations given back and asked again because
	// their callers woke too late past their slots (Stats.Retimed), over
	// the whole phase.
	retimed int64
}

// recoveryFigures are the recovery phase's.
type recoveryFigures struct {
	before float64   // grants/s of all replicas in the second before the vanish
	after  []float64 // grants/s of the survivors in each second after it
	// reached is the first second after the vanish from which every
	// one-second window reaches 0.9 × the rate; -1 if none did.
	reached     int
	worstWindow int64 // most grants in a 1 s window of the survivors, after the vanish
}

// runScale runs every rate and N and writes the report.
func runScale(ctx context.Context, cfg scaleConfig) error {
	load0 := loadAverage()
	redis.SetLogger(quietLogger{})
	stopProfile, err := startCPUProfile(cfg.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	var runs []scaleRun
	for _, rate := range cfg.rates {
		for _, n := range cfg.ns {
			r, err := scaleOne(ctx, cfg, rate, n)
			if err != nil {
				return fmt.Errorf("rate %v, N %d: %w", rate, n, err)
			}
			runs = append(runs, r)
		}
	}
	md := scaleMarkdown(cfg, runs, fmt.Sprintf("%s at the start, %s at the end", load0, loadAverage()))
	fmt.Print(md)
	return os.WriteFile(cfg.out, []byte(md), 0o644)
}

// scaleBurst is the burst of a rate: secs seconds of its tokens.
func scaleBurst(rate, secs float64) int { return max(1, int(rate*secs)) }

// scaleOne runs the phases of one rate and N on a private redis-server.
func scaleOne(ctx context.Context, cfg scaleConfig, rate float64, n int) (scaleRun, error) {
	srv, err := startRedis(ctx)
	if err != nil {
		return scaleRun{}, err
	}
	defer srv.stop()
	admin := redis.NewClient(&redis.Options{Addr: srv.addr})
	defer admin.Close()
	leased := cfg.lease == "on" || (cfg.lease == "auto" && rate >= 1e5)
	run := scaleRun{rate: rate, burst: scaleBurst(rate, cfg.burst), n: n, leased: leased}
	for _, ph := range cfg.phases {
		fmt.Fprintf(os.Stderr, "scale: rate %v N %d %s...\n", rate, n, ph)
		switch ph {
		case "saturated":
			f, err := scalePhase(ctx, srv.addr, admin, cfg, run, ph, func(int) pace { return pace{callers: cfg.callers} }, cfg.duration, 0)
			if err != nil {
				return run, fmt.Errorf("%s: %w", ph, err)
			}
			run.sat = &f.scaleFigures
			fmt.Fprintf(os.Stderr, "  steady %.0f/s, worst window %d (bound %d), shares %.2f–%.2f, worst wait %v (begun after 1 s %v), over FCFS + 100 ms %s, scripts/s %.0f\n",
				f.steadyRate, f.worstWindow, int64(rate)+int64(run.burst), f.shareLo, f.shareHi, f.worstWait.Round(time.Millisecond), f.worstSteadyWait.Round(time.Millisecond),
				f.fcfsText(), float64(f.scripts)/f.steadyFor.Seconds())
		case "unequal":
			sat := max(1, n/10)
			p := func(i int) pace {
				if i < sat {
					return pace{callers: cfg.callers}
				}
				return pace{callers: 1, every: 50 * time.Millisecond}
			}
			f, err := scalePhase(ctx, srv.addr, admin, cfg, run, ph, p, cfg.duration, 0)
			if err != nil {
				return run, fmt.Errorf("%s: %w", ph, err)
			}
			run.unequal = &f.scaleFigures
			fmt.Fprintf(os.Stderr, "  steady %.0f/s (%.2f×), saturated %.1f/s each, paced %.2f/s each (asked 20), over FCFS + 100 ms %s\n",
				f.steadyRate, f.steadyRate/rate, f.satPerReplica, f.pacedPerReplica, f.fcfsText())
		case "recovery":
			f, err := scalePhase(ctx, srv.addr, admin, cfg, run, ph, func(int) pace { return pace{callers: cfg.callers} }, cfg.duration+cfg.recovery, cfg.duration)
			if err != nil {
				return run, fmt.Errorf("%s: %w", ph, err)
			}
			run.recovery = f.recovery
			fmt.Fprintf(os.Stderr, "  before %.0f/s, after %v, reached 0.9× at second %d\n", f.recovery.before, roundAll(f.recovery.after), f.recovery.reached)
		default:
			return run, fmt.Errorf("unknown phase %q", ph)
		}
	}
	return run, nil
}

func roundAll(v []float64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(math.Round(x))
	}
	return out
}

// pace is how one replica's callers ask.
type pace struct {
	callers int
	every   time.Duration // each caller asks once per every; 0 for a tight loop
}

// scaleCaller is what one caller records; merged after the phase.
type scaleCaller struct {
	rep       int
	bins      []uint32 // grants received in each millisecond since the start
	worstWait time.Duration
	// steadyWait is worstWait of the waits begun 1 s or more after start.
	steadyWait time.Duration
	over1s     int64
	// waits are the caller's Waits in order, for fcfsExcess.
	waits []scaleWait
	err   error
}

// scaleWait is one Wait of a caller: when it began and when it returned,
// in µs since the phase's start.
type scaleWait struct{ from, to uint32 }

// fcfsSlack is what the waits target allows beyond a caller's place in its
// replica's queue ÷ the replica's share: 100 ms.
const fcfsSlack = 100 * time.Millisecond

// fcfsTie is how close two callers' starts are for the second measure of
// first come, first served to count them as arriving together. A caller's
// start is taken before it calls Wait; on a machine running thousands of
// replicas' callers on 2 cores, the scheduler may run another caller of
// its replica into the limiter between that instant and its own arrival.
const fcfsTie = time.Millisecond

// fcfsExcess measures the waits of one replica's callers (each caller's
// in order) against first come, first served. A wait that began with
// place of the replica's callers waiting, itself included, ends under
// FCFS with the replica's place-th grant from its start on: every grant
// before it goes to a caller ahead of it. That is the caller's place ÷
// the replica's share, the share being what the replica got meanwhile.
// A wait that ends later was overtaken by a caller that came after it,
// by the time from that grant to its own. fcfsExcess returns the worst
// such excess and how many waits exceeded it by more than slack, of all
// the waits and of those begun at steadyFrom or later. A caller that
// began at most tie after w counts as ahead of it too (0: none does).
func fcfsExcess(callers [][]scaleWait, slack, steadyFrom, tie time.Duration) (all, steady fcfsFigures) {
	tieUS := uint32(tie / time.Microsecond)
	var tos []uint32
	for _, ws := range callers {
		for _, w := range ws {
			tos = append(tos, w.to)
		}
	}
	slices.Sort(tos)
	for c, ws := range callers {
		for _, w := range ws {
			place := 1
			for o, others := range callers {
				if o == c {
					continue
				}
				// The other caller's last wait begun at or before w's
				// (within tie after it).
				j := sort.Search(len(others), func(j int) bool { return others[j].from > w.from+tieUS }) - 1
				if j >= 0 && others[j].to > w.from {
					place++
				}
			}
			// The replica's place-th grant after w began: w's own grant
			// at the latest under FCFS.
			i := sort.Search(len(tos), func(i int) bool { return tos[i] > w.from }) + place - 1
			if i >= len(tos) || tos[i] >= w.to {
				continue
			}
			excess := time.Duration(w.to-tos[i]) * time.Microsecond
			all.add(excess, slack)
			if time.Duration(w.from)*time.Microsecond >= steadyFrom {
				steady.add(excess, slack)
			}
		}
	}
	return all, steady
}

// fcfsFigures are the worst excess of waits over first come, first served
// (fcfsExcess), and how many exceeded it by more than the slack.
type fcfsFigures struct {
	worst time.Duration
	over  int64
}

func (f *fcfsFigures) add(excess, slack time.Duration) {
	f.worst = max(f.worst, excess)
	if excess > slack {
		f.over++
	}
}

func (f *fcfsFigures) merge(g fcfsFigures) {
	f.worst = max(f.worst, g.worst)
	f.over += g.over
}

// fcfsCount is fcfsExcess's figures summed over the replicas: of all the
// waits, and of those begun after the start-up wave.
type fcfsCount struct{ all, steady fcfsFigures }

func (c *fcfsCount) merge(all, steady fcfsFigures) {
	c.all.merge(all)
	c.steady.merge(steady)
}

// fcfsText is f's waits over first come, first served + 100 ms: all of
// them, then those begun after the start-up wave; then the same with
// callers that began within fcfsTie of each other as arriving together.
func (f *scaleFigures) fcfsText() string {
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("%d of %d (%v); %d (%v) · %d (%v); %d (%v)", f.fcfs.all.over, f.waits, ms(f.fcfs.all.worst),
		f.fcfs.steady.over, ms(f.fcfs.steady.worst), f.fcfsTied.all.over, ms(f.fcfsTied.all.worst),
		f.fcfsTied.steady.over, ms(f.fcfsTied.steady.worst))
}

// phaseFigures are a phase's figures with its recovery part, if any.
type phaseFigures struct {
	scaleFigures
	recovery *recoveryFigures
}

// scalePhase builds n replicas on a fresh bucket, drives them for d, each
// replica i as p(i) says, and measures. If vanishAt > 0, the first half
// of the replicas vanish then: their callers stop and their clients are
// closed, with no Close of their Buckets, so that their heartbeats stop and
// whatever they held is lost.
func scalePhase(ctx context.Context, addr string, admin *redis.Client, cfg scaleConfig, run scaleRun, name string, p func(int) pace, d, vanishAt time.Duration) (phaseFigures, error) {
	spec := bucketSpec{name: fmt.Sprintf("scale-%s-%d", name, run.n), rate: run.rate, burst: run.burst}
	spec.opts.Lease.Calls = cfg.leaseCalls
	im := impls[2] // (c) no leasing
	if run.leased {
		im = impls[3]
	}
	reps, err := newReplicasWith(ctx, scaleClientOptions(addr, cfg.callers), run.n, 1, im, spec)
	if err != nil {
		return phaseFigures{}, err
	}
	defer func() {
		for _, r := range reps {
			r.client.Close() // a vanished replica's Close would wait on its dead client
		}
		closeReplicas(reps)
	}()
	// Every replica learns the count before the start, as after its first
	// heartbeat in a fleet that has been running.
	for _, r := range reps {
		if err := r.w.(*throttle).Check(ctx); err != nil {
			return phaseFigures{}, fmt.Errorf("check: %w", err)
		}
	}

	nbins := int(d/time.Millisecond) + 1
	var callers []*scaleCaller
	repCtx := make([]context.CancelFunc, len(reps))
	release := make(chan struct{})
	var start time.Time
	var runCtx context.Context
	var wg sync.WaitGroup
	ctxs := make([]context.Context, len(reps))
	for i, r := range reps {
		pc := p(i)
		for range pc.callers {
			c := &scaleCaller{rep: i, bins: make([]uint32, nbins)}
			callers = append(callers, c)
			wg.Go(func() {
				<-release
				c.loop(ctxs[i], r.w, start, d, pc.every)
			})
		}
	}
	start = time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(d))
	defer cancel()
	for i := range reps {
		ctxs[i], repCtx[i] = context.WithCancel(runCtx)
	}
	defer func() {
		for _, c := range repCtx {
			c()
		}
	}()
	steadyFrom, steadyTo := time.Second, d-100*time.Millisecond
	if vanishAt > 0 {
		steadyTo = vanishAt - 100*time.Millisecond
	}
	var before, after usage
	var serr error
	var obs sync.WaitGroup
	obs.Go(func() {
		if serr = sleep(ctx, time.Until(start.Add(steadyFrom))); serr != nil {
			return
		}
		if before, serr = snapshot(ctx, admin, nil); serr != nil {
			return
		}
		if serr = sleep(ctx, time.Until(start.Add(steadyTo))); serr != nil {
			return
		}
		after, serr = snapshot(ctx, admin, nil)
	})
	if cfg.goroutines != "" && name == "saturated" {
		obs.Go(func() {
			if sleep(ctx, time.Until(start.Add(1500*time.Millisecond))) != nil {
				return
			}
			f, err := os.Create(fmt.Sprintf("%s-%v-%d.txt", cfg.goroutines, run.rate, run.n))
			if err != nil {
				return
			}
			defer f.Close()
			pprof.Lookup("goroutine").WriteTo(f, 1)
		})
	}
	if vanishAt > 0 {
		obs.Go(func() {
			if sleep(ctx, time.Until(start.Add(vanishAt))) != nil {
				return
			}
			for i := range len(reps) / 2 {
				repCtx[i]()
				reps[i].client.Close()
			}
		})
	}
	close(release)
	wg.Wait()
	obs.Wait()
	if serr != nil {
		return phaseFigures{}, serr
	}
	var errs []error
	for _, c := range callers {
		errs = append(errs, c.err)
	}
	if err := errors.Join(errs...); err != nil {
		return phaseFigures{}, err
	}

	f := phaseFigures{}
	f.d = d
	for _, r := range reps {
		if t, ok := r.w.(*throttle); ok {
			f.retimed += t.Stats().Retimed
		}
	}
	bins := make([]int64, nbins)
	perRep := make([]int64, len(reps))
	survivors := make([]int64, nbins)
	from, to := int(steadyFrom/time.Millisecond), int(steadyTo/time.Millisecond)
	for _, c := range callers {
		for i, v := range c.bins {
			bins[i] += int64(v)
			if i >= from && i < to {
				perRep[c.rep] += int64(v)
			}
			if c.rep >= len(reps)/2 {
				survivors[i] += int64(v)
			}
		}
		f.worstWait = max(f.worstWait, c.worstWait)
		f.worstSteadyWait = max(f.worstSteadyWait, c.steadyWait)
		f.waitsOver1s += c.over1s
		f.waits += int64(len(c.waits))
	}
	byRep := make([][][]scaleWait, len(reps))
	for _, c := range callers {
		byRep[c.rep] = append(byRep[c.rep], c.waits)
	}
	for _, ws := range byRep {
		f.fcfs.merge(fcfsExcess(ws, fcfsSlack, steadyFrom, 0))
		f.fcfsTied.merge(fcfsExcess(ws, fcfsSlack, steadyFrom, fcfsTie))
	}
	for _, v := range bins {
		f.granted += v
	}
	for _, v := range bins[from:to] {
		f.steadyTokens += v
	}
	f.steadyFor = steadyTo - steadyFrom
	f.steadyRate = float64(f.steadyTokens) / f.steadyFor.Seconds()
	f.worstWindow = worstWindow(bins)
	f.firstSecond = sumBins(bins, 0, 1000)
	f.secondSecond = sumBins(bins, 1000, 2000)
	u := after.sub(before)
	f.scripts, f.redisCPU, f.processCPU = u.redis.scripts, u.redis.cpu, u.cpu
	// Shares among replicas that asked alike: those of p(0)'s kind.
	var same []int64
	for i, v := range perRep {
		if p(i) == p(0) {
			same = append(same, v)
		}
	}
	f.shareLo, f.shareHi = shareSpread(same)
	secs := f.steadyFor.Seconds()
	var satN, pacedN int
	var satSum, pacedSum int64
	for i, v := range perRep {
		if p(i).every == 0 {
			satN++
			satSum += v
		} else {
			pacedN++
			pacedSum += v
			f.pacedAsked = float64(time.Second) / float64(p(i).every)
		}
	}
	if satN > 0 {
		f.satPerReplica = float64(satSum) / float64(satN) / secs
	}
	if pacedN > 0 {
		f.pacedPerReplica = float64(pacedSum) / float64(pacedN) / secs
	}
	if vanishAt > 0 {
		f.recovery = recovery(bins, survivors, vanishAt, d, run.rate)
	}
	return f, nil
}

// recovery measures the survivors from vanishAt on.
func recovery(all, survivors []int64, vanishAt, d time.Duration, rate float64) *recoveryFigures {
	v := int(vanishAt / time.Millisecond)
	r := &recoveryFigures{before: float64(sumBins(all, v-1000, v)), reached: -1}
	secs := int((d - vanishAt) / time.Second)
	for s := range secs {
		r.after = append(r.after, float64(sumBins(survivors, v+s*1000, v+(s+1)*1000)))
	}
	for s := range secs {
		ok := true
		for _, x := range r.after[s:] {
			ok = ok && x >= 0.9*rate
		}
		if ok {
			r.reached = s
			break
		}
	}
	r.worstWindow = worstWindow(survivors[v:])
	return r
}

func sumBins(bins []int64, from, to int) int64 {
	var n int64
	for i := max(0, from); i < min(to, len(bins)); i++ {
		n += bins[i]
	}
	return n
}

// worstWindow is the most grants in any 1 s window of 1 ms bins.
func worstWindow(bins []int64) int64 {
	const width = 1000
	var sum, best int64
	for i, v := range bins {
		sum += v
		if i >= width {
			sum -= bins[i-width]
		}
		best = max(best, sum)
	}
	return best
}

// shareSpread returns the least and the largest of v over their mean.
func shareSpread(v []int64) (lo, hi float64) {
	if len(v) == 0 {
		return 0, 0
	}
	var sum int64
	for _, x := range v {
		sum += x
	}
	mean := float64(sum) / float64(len(v))
	if mean == 0 {
		return 0, 0
	}
	return float64(slices.Min(v)) / mean, float64(slices.Max(v)) / mean
}

func (c *scaleCaller) loop(ctx context.Context, w waiter, start time.Time, d, every time.Duration) {
	next := start
	for {
		if every > 0 {
			next = next.Add(every)
			if now := time.Now(); next.Before(now.Add(-every)) {
				next = now // a caller far behind asks at once, but does not catch up
			}
			if sleep(ctx, time.Until(next)) != nil {
				return
			}
		}
		t0 := time.Now()
		if err := w.Wait(ctx, 1); err != nil {
			if ctx.Err() == nil && !errors.Is(err, limiter.ErrClosed) {
				c.err = err
			}
			return
		}
		now := time.Now()
		since := now.Sub(start)
		if since >= d {
			return
		}
		c.bins[since/time.Millisecond]++
		c.waits = append(c.waits, scaleWait{from: uint32(t0.Sub(start) / time.Microsecond), to: uint32(since / time.Microsecond)})
		wait := now.Sub(t0)
		c.worstWait = max(c.worstWait, wait)
		if t0.Sub(start) >= time.Second {
			c.steadyWait = max(c.steadyWait, wait)
		}
		if wait > time.Second {
			c.over1s++
		}
	}
}

// scaleMarkdown writes the report.
func scaleMarkdown(cfg scaleConfig, runs []scaleRun, load string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Scale\n\nCommand: `go run .%s` (integration/bench). Load average %s.\n\n", cfg.flags, load)
	fmt.Fprintf(&b, "Each replica: its own go-redis client and limiter.Bucket; burst = rate × %gs; saturated replicas run %d callers in a tight loop. Grants counted when Wait returns.\n\n", cfg.burst, cfg.callers)
	b.WriteString("## Saturated: every replica wants more than its share\n\n")
	b.WriteString("| rate/s | N | lease | steady grants/s | worst 1 s window (bound rate+burst) | 1st s, 2nd s | share min–max of mean | worst wait | worst wait begun after 1 s | waits > 1 s | waits over place ÷ share + 100 ms (worst excess over place ÷ share); begun after 1 s · the same, callers begun within 1 ms counted as arriving together | scripts/s | scripts per 1k grants | Redis CPU µs/grant | process CPU µs/grant | retimed |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		f := r.sat
		if f == nil {
			continue
		}
		tok := float64(max(1, f.steadyTokens))
		fmt.Fprintf(&b, "| %s | %d | %s | %.0f (%.2f×) | %d (%d) | %d, %d | %.2f–%.2f | %v | %v | %d | %s | %.0f | %.2f | %.2f | %.2f | %d |\n",
			fmtRate(r.rate), r.n, onOff(r.leased), f.steadyRate, f.steadyRate/r.rate, f.worstWindow, int64(r.rate)+int64(r.burst),
			f.firstSecond, f.secondSecond, f.shareLo, f.shareHi, f.worstWait.Round(time.Millisecond), f.worstSteadyWait.Round(time.Millisecond), f.waitsOver1s,
			f.fcfsText(),
			float64(f.scripts)/f.steadyFor.Seconds(), float64(f.scripts)/tok*1000,
			float64(f.redisCPU.Microseconds())/tok, float64(f.processCPU.Microseconds())/tok, f.retimed)
	}
	b.WriteString("\n## Unequal demand: 10% of the replicas saturated, the rest asking 20/s each\n\n")
	b.WriteString("| rate/s | N | lease | grants/s (of rate) | each saturated replica /s | each paced replica /s (asked) | worst wait | waits over place ÷ share + 100 ms (worst excess); begun after 1 s · the same, callers begun within 1 ms together | worst 1 s window | scripts/s |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		f := r.unequal
		if f == nil {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %.0f (%.2f×) | %.1f | %.2f (%.0f) | %v | %s | %d | %.0f |\n",
			fmtRate(r.rate), r.n, onOff(r.leased), f.steadyRate, f.steadyRate/r.rate, f.satPerReplica, f.pacedPerReplica, f.pacedAsked,
			f.worstWait.Round(time.Millisecond), f.fcfsText(), f.worstWindow, float64(f.scripts)/f.steadyFor.Seconds())
	}
	b.WriteString("\n## Recovery: half the replicas vanish without Close\n\n")
	fmt.Fprintf(&b, "After %v, half the replicas stop and their clients close (no Close: leases and reservations are lost, heartbeats stop). Grants/s of the survivors in each second after.\n\n", cfg.duration)
	b.WriteString("| rate/s | N | lease | all, second before | survivors, each second after | every second ≥ 0.9× from | worst 1 s window after |\n|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		f := r.recovery
		if f == nil {
			continue
		}
		reached := "never"
		if f.reached >= 0 {
			reached = fmt.Sprintf("second %d", f.reached+1)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %.0f | %v | %s | %d |\n", fmtRate(r.rate), r.n, onOff(r.leased), f.before, roundAll(f.after), reached, f.worstWindow)
	}
	return b.String()
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func fmtRate(r float64) string {
	switch {
	case r >= 1e6 && math.Mod(r, 1e6) == 0:
		return fmt.Sprintf("%gM", r/1e6)
	case r >= 1e3 && math.Mod(r, 1e3) == 0:
		return fmt.Sprintf("%gk", r/1e3)
	}
	return strconv.FormatFloat(r, 'f', -1, 64)
}
