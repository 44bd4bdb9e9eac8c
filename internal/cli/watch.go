package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/term"

	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

const watchHelp = `Usage:
  throttle bucket watch [NAME] (--config FILE | --redis ADDR) [--interval D]

A live view of a shared bucket, for an operator during an incident. It reads
only Redis (no Prometheus), and redraws every second until Ctrl-C:

  tokens     the tokens in the bucket now, of its burst
  rate       the effective rate, and where it comes from: the runtime
             override ('bucket set'), else the configured rate; the
             adaptive rate when the bucket has one (none yet)
  paused     a push-back pause, and how long it still holds
  delivered  the rate the replicas were granted tokens at, with a
             sparkline of the last minute
  replicas   each live replica and what its heartbeat reports: its mode
             (shared, local, closed, open; idle when it consumes nothing,
             such as a Kafka group member without partitions), the rate it
             was granted tokens at, the messages waiting for tokens, and
             its configured limits
  layers     the extra layers of --config's limit.extra: each one's limit,
             what Redis holds for it (an unkeyed layer's tokens or quota
             used, a keyed layer's keys in use, counted every 10 s), and
             how many messages it refused (dead_letter, delay): the sum
             over the live replicas since each started, as their
             heartbeats report it, and the increase over the last minute.
             Without --config, only the layers whose refusals the
             replicas report are listed, without their limits. And the
             keys each layer refused most over the last minute (a shadow
             layer: would have), summed over the replicas' reports
  tenants    with fair shares (limit.fair), the tenants granted the most
             tokens over the last minute, with their share of the tokens
             granted to every tenant, and those with the most messages
             waiting now (on a reservation or for their share), from the
             replicas' heartbeats

Each replica reports its mode, the tokens it granted, its waiting calls
and its layers' refusals with its heartbeat (every 3 s), which Redis
stamps with its clock: its delivered rate is the tokens granted between
its heartbeats over the last 10 s, so it shows at its second heartbeat
after the start (within 3 s) and follows a change within a few seconds.
The bucket's delivered rate is the replicas' sum; "?" until each has
beaten twice. Only when the replicas report no counts (older versions) is
it estimated from the bucket's own tokens and refill, and says so: the
estimate undercounts while the bucket is full.

When standard output is not a terminal, it prints one line per interval
instead, for logs and scripts:
  TIME BUCKET tokens=T/B rate=R/s(SOURCE) paused=D replicas=N delivered=R/s waiting=W
where delivered reads R/s(estimated) when it is an estimate, followed,
when a replica is idle, by
  idle=N
and, when a layer is known or refused a message, by
  exceeded=LAYER:N,LAYER:N   (the refusals summed over the live replicas)
and, for each layer that refused keys in the last minute, by
  top_refused[LAYER]=KEY:N,KEY:N
and, with fair shares, by
  tenants_share=TENANT:P%,TENANT:P% tenants_waiting=TENANT:N,TENANT:N
(a key or tenant with white space or one of ,:=" is quoted).

Flags:
  --config FILE   the replicas' YAML configuration (Redis and the configured limits)
  --redis ADDR    Redis host:port, when no config file is at hand
  --interval D    how often to redraw (default 1s)
`

// sparkTicks are the sparkline's levels, lowest first.
var sparkTicks = []rune("▁▂▃▄▅▆▇█")

// watchWindow is how far back the sparkline reaches, in at most
// sparkCells cells.
const (
	watchWindow = time.Minute
	sparkCells  = 60
)

func cmdBucketWatch(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("bucket watch")
	cfgPath := fs.String("config", "", "")
	addr := fs.String("redis", "", "")
	interval := fs.Duration("interval", time.Second, "")
	pos, err := parseArgs(fs, args, watchHelp, stdout)
	if err != nil {
		return err
	}
	help := fs.Name()
	switch {
	case len(pos) > 1:
		return usagef(help, "unexpected argument %q", pos[1])
	case *cfgPath != "" && *addr != "":
		return usagef(help, "use either --config or --redis, not both")
	case *cfgPath == "" && *addr == "":
		return usagef(help, "bucket watch needs --config FILE or --redis ADDR")
	case *addr != "" && len(pos) == 0:
		return usagef(help, "bucket watch needs the bucket NAME with --redis")
	case *interval < 10*time.Millisecond:
		return usagef(help, "--interval must be at least 10ms, got %v", *interval)
	}
	cfg, rc, err := adminRedis(*cfgPath, *addr, help)
	if err != nil {
		return err
	}
	name := cfg.Limit.Bucket
	if len(pos) == 1 {
		name = pos[0]
	}
	if err := redislimiter.ValidateBucketName(name); err != nil {
		return usagef(help, "bucket NAME: %v", err)
	}
	client, err := redisconn.New(rc)
	if err != nil {
		return &configError{err: err}
	}
	defer client.Close()
	w := &watcher{name: name, client: client, admin: client, interval: *interval}
	if *cfgPath != "" && name == cfg.Limit.Bucket {
		w.configured = &limitsJSON{Rate: cfg.Limit.Rate, Burst: cfg.Limit.Burst, Shadow: cfg.Limit.Shadow}
		w.from = *cfgPath
		if w.layers, err = layersOf(client, cfg); err != nil {
			return &configError{err: err}
		}
	}
	return w.run(ctx, stdout, isTerminal(stdout))
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// watcher samples one bucket in Redis and shows it.
type watcher struct {
	name     string
	client   redislimiter.Client
	interval time.Duration
	// configured is set when --config gave the bucket's limits; from
	// names the file.
	configured *limitsJSON
	from       string
	// layers are the extra layers of --config's limit.extra, nil without
	// them; keyCounts caches the keyed ones as last counted with SCAN, at
	// most every layerCountEvery.
	layers    *redislimiter.Layered
	admin     redis.UniversalClient
	keyCounts map[string]layerJSON
	countedAt time.Time
}

// layerCountEvery is how often watch counts the keys in use of a keyed
// layer: the count scans the keyspace, which suits an operator's command
// once in a while, not every second.
const layerCountEvery = 10 * time.Second

// layerView is one extra layer as shown.
type layerView struct {
	name, desc string
	// state is what Redis holds: an unkeyed layer's tokens or quota used,
	// a keyed layer's keys in use.
	state string
	// exceeded is the sum of the live replicas' reported refusals, and
	// recent its increase over the last watchWindow; -1 when no replica
	// reports.
	exceeded, recent int64
	// reportedOnly is set for a layer that only the replicas' reports
	// name: not one of --config's.
	reportedOnly bool
	// top is the keys it refused most over the last minute, summed over
	// the live replicas (topRefused).
	top []keyCountJSON
}

// sample is what one read of Redis found.
type sample struct {
	at       time.Time // Redis's clock, or the local one if Redis gave none
	status   redislimiter.BucketStatus
	replicas []redislimiter.Replica
	// configured and from are the limits used to read the bucket: from
	// --config, or those every live replica reports; nil if unknown.
	configured *limitsJSON
	from       string
	layers     []layerView
}

// read takes one sample: the live replicas, then the bucket's status with
// the configured limits they agree on.
func (w *watcher) read(ctx context.Context) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, max(w.interval, adminTimeout/5))
	defer cancel()
	s := sample{configured: w.configured, from: w.from}
	admin, err := redislimiter.NewAdmin(w.client, redislimiter.AdminConfig{Bucket: w.name})
	if err != nil {
		return s, err
	}
	if s.replicas, err = admin.Replicas(ctx); err != nil {
		return s, err
	}
	if s.configured == nil {
		if c, ok := agreedConfig(s.replicas); ok {
			s.configured, s.from = &c, "reported by "+plural(len(s.replicas), "live replica")
		}
	}
	if s.configured != nil {
		admin, err = redislimiter.NewAdmin(w.client, redislimiter.AdminConfig{Bucket: w.name, Rate: s.configured.Rate, Burst: s.configured.Burst})
		if err != nil {
			return s, err
		}
	}
	if s.status, err = admin.Status(ctx); err != nil {
		return s, err
	}
	s.at = s.status.At
	if s.at.IsZero() {
		s.at = time.Now()
	}
	if s.layers, err = w.readLayers(ctx); err != nil {
		return s, err
	}
	return s, nil
}

// readLayers reads the state of each extra layer with layerStates, as
// 'bucket status' does, recounting a keyed layer's keys in use only every
// layerCountEvery.
func (w *watcher) readLayers(ctx context.Context) ([]layerView, error) {
	if w.layers == nil {
		return nil, nil
	}
	recount := time.Since(w.countedAt) >= layerCountEvery
	layers, err := layerStates(ctx, w.admin, w.layers, recount)
	if err != nil {
		return nil, err
	}
	if recount {
		w.keyCounts, w.countedAt = map[string]layerJSON{}, time.Now()
	}
	out := make([]layerView, 0, len(layers))
	for _, l := range layers {
		if l.Keyed && recount {
			w.keyCounts[l.Layer] = l
		} else if c, ok := w.keyCounts[l.Layer]; ok && l.Keyed {
			l.KeysInUse, l.KeysEstimated = c.KeysInUse, c.KeysEstimated
		}
		out = append(out, layerView{name: l.Layer, desc: describeLayer(l.layer), state: watchLayerState(l)})
	}
	return out, nil
}

// watchLayerState says what Redis holds for a layer, in a few words.
func watchLayerState(l layerJSON) string {
	switch {
	case l.KeysInUse != nil && l.KeysEstimated:
		return fmt.Sprintf("about %d keys in use", *l.KeysInUse)
	case l.KeysInUse != nil:
		return fmt.Sprintf("%d keys in use", *l.KeysInUse)
	case l.Keyed:
		return "keys in use: ?"
	case l.Used != nil:
		return fmt.Sprintf("used %d of %d this %s", *l.Used, l.Quota, l.Per)
	case l.Spent != nil:
		return fmt.Sprintf("spent %s of %s this %s", l.spent, l.layer.Budget, l.Per)
	case l.Kind == "window":
		return "a send window (no state)"
	case l.Tokens != nil:
		return fmt.Sprintf("%s of %d tokens", formatTokens(*l.Tokens), l.Burst)
	}
	return "?"
}

// run samples every interval and draws each sample until ctx ends. A
// failed read is shown and retried at the next interval.
func (w *watcher) run(ctx context.Context, out io.Writer, tty bool) error {
	if tty {
		fmt.Fprint(out, "\x1b[?25l\x1b[2J") // hide the cursor, clear the screen
		defer fmt.Fprint(out, "\x1b[?25h\n")
	}
	hist := newWatchHistory(w.name, w.interval)
	hist.layersKnown = w.from != "" && !strings.HasPrefix(w.from, "reported by")
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		s, err := w.read(ctx)
		if ctx.Err() != nil {
			return nil
		}
		v := hist.add(s, err, time.Now())
		if tty {
			fmt.Fprint(out, "\x1b[H"+strings.ReplaceAll(renderWatch(v), "\n", "\x1b[K\n")+"\x1b[J")
		} else {
			fmt.Fprintln(out, watchLine(v))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// replicaView is one live replica as shown.
type replicaView struct {
	id         string
	configured *limitsJSON
	// reported is set when the heartbeat carries the replica's report;
	// then mode, delivered and waiting are known.
	reported  bool
	mode      string
	delivered float64 // tokens granted per second (grantTrack); NaN until known
	waiting   int
	// idle is set when its report says it consumes nothing.
	idle bool
}

// watchView is everything one frame shows. It is a plain value, built by
// watchHistory.add and drawn by renderWatch and watchLine.
type watchView struct {
	bucket   string
	now      time.Time
	interval time.Duration
	err      error // the last read failed; the rest is from the last good one
	ok       bool  // a read has succeeded at least once

	status     redislimiter.BucketStatus
	configured *limitsJSON
	from       string
	replicas   []replicaView
	// delivered is the replicas' granted rate; NaN when not known yet.
	// estimated says it comes from the bucket's tokens instead, since
	// unreported of the live replicas report no count.
	delivered  float64
	estimated  bool
	unreported int
	// spark are the delivered rates of the last minute, oldest first;
	// NaN where unknown.
	spark []float64
	// layers are the extra layers, known only from --config.
	layers      []layerView
	layersKnown bool
	// tenants is the top tenants of fair shares, nil when none is
	// reported (topTenants).
	tenants *tenantsJSON
}

// watchHistory turns successive samples into views: rates from the
// differences between samples, and the last minute of delivered rates.
type watchHistory struct {
	// layersKnown is set when the layers come from a config file, so that
	// "none" means none.
	layersKnown bool
	// grants follows each live replica's reported granted tokens.
	grants   map[string]*grantTrack
	bucket   string
	interval time.Duration
	last     *sample
	lastView watchView
	spark    []float64
	// exceeded are the sums of the replicas' reported refusals by layer,
	// read over the last watchWindow, oldest first.
	exceeded []exceededSum
}

// exceededSum is the refusals by layer summed over the live replicas that
// reported, as read at at.
type exceededSum struct {
	at   time.Time
	sums map[string]int64
}

func newWatchHistory(bucket string, interval time.Duration) *watchHistory {
	n := max(2, int(math.Ceil(float64(watchWindow)/float64(interval))))
	spark := make([]float64, n)
	for i := range spark {
		spark[i] = math.NaN()
	}
	return &watchHistory{bucket: bucket, interval: interval, spark: spark}
}

// add records a sample (or the error that replaced it) taken at now and
// returns the view to draw.
func (h *watchHistory) add(s sample, err error, now time.Time) watchView {
	if err != nil {
		v := h.lastView
		v.bucket, v.now, v.interval, v.err = h.bucket, now, h.interval, err
		h.push(math.NaN())
		v.spark = h.sparkCopy()
		v.delivered = math.NaN()
		h.lastView = v
		return v
	}
	v := watchView{
		bucket: h.bucket, now: now, interval: h.interval, ok: true,
		status: s.status, configured: s.configured, from: s.from,
		delivered: math.NaN(), layers: s.layers, layersKnown: h.layersKnown,
	}
	if h.grants == nil {
		h.grants = map[string]*grantTrack{}
	}
	live := map[string]bool{}
	sum := 0.0
	for _, r := range s.replicas {
		rv := replicaView{id: r.ID, delivered: math.NaN()}
		if r.Burst > 0 {
			rv.configured = &limitsJSON{Rate: r.Rate, Burst: r.Burst}
		}
		live[r.ID] = true
		if r.Reported {
			g := h.grants[r.ID]
			if g == nil {
				g = &grantTrack{}
				h.grants[r.ID] = g
			}
			g.observe(s.at, r.BeatAt, r.Granted)
			rv.reported, rv.mode, rv.waiting, rv.idle = true, string(r.Mode), r.Waiting, r.Idle
			rv.delivered = g.rate(s.at)
		} else {
			v.unreported++
		}
		sum += rv.delivered // NaN while a replica's rate is not known yet
		v.replicas = append(v.replicas, rv)
	}
	for id := range h.grants {
		if !live[id] {
			delete(h.grants, id)
		}
	}
	v.layers = h.addExceeded(s, v.layers)
	refused := topRefused(s.replicas, topText)
	for i := range v.layers {
		v.layers[i].top = refused[v.layers[i].name]
	}
	v.tenants = topTenants(s.replicas, topText)
	switch {
	case len(s.replicas) > 0 && v.unreported == 0:
		v.delivered = sum
	case h.last != nil:
		if dt := s.at.Sub(h.last.at).Seconds(); dt > 0 {
			v.delivered, v.estimated = estimateDelivered(h.last.status, s.status, dt)
		}
	}
	h.last = &s
	h.push(v.delivered)
	v.spark = h.sparkCopy()
	h.lastView = v
	return v
}

// addExceeded records the refusals the replicas of s report, and returns
// layers with each layer's count and its increase over the last
// watchWindow, plus, after them, the layers that only the replicas name
// (not in layers, which are known only from --config). Without any
// reporting replica the counts are unknown (-1).
func (h *watchHistory) addExceeded(s sample, layers []layerView) []layerView {
	sums, reported := map[string]int64{}, false
	for _, r := range s.replicas {
		if !r.Reported {
			continue
		}
		reported = true
		for layer, n := range r.Exceeded {
			sums[layer] += n
		}
	}
	out := slices.Clone(layers)
	if !reported {
		h.exceeded = nil
		for i := range out {
			out[i].exceeded, out[i].recent = -1, -1
		}
		return out
	}
	h.exceeded = append(h.exceeded, exceededSum{at: s.at, sums: sums})
	for len(h.exceeded) > 1 && s.at.Sub(h.exceeded[0].at) > watchWindow {
		h.exceeded = h.exceeded[1:]
	}
	oldest := h.exceeded[0].sums
	for _, name := range slices.Sorted(maps.Keys(sums)) {
		if !slices.ContainsFunc(out, func(l layerView) bool { return l.name == name }) {
			out = append(out, layerView{name: name, desc: "?", state: "?", reportedOnly: true})
		}
	}
	for i := range out {
		// A replica that left or restarted lowers the sum: no negative
		// increase.
		out[i].exceeded, out[i].recent = sums[out[i].name], max(0, sums[out[i].name]-oldest[out[i].name])
	}
	return out
}

// A replica's report reaches Redis with its heartbeat (every 3 s by
// default), which Redis stamps with its clock (Replica.BeatAt). The rate
// is the count's increase between the heartbeats of the last beatWindow,
// timed by their stamps. For a replica whose heartbeat carries no stamp
// (an older version), it is taken between the reads at which the count
// changed, over up to grantWindow, and is 0 once it has not changed for
// grantIdleAfter: timed by the reads, it is off by up to a read interval.
const (
	beatWindow     = 10 * time.Second
	grantWindow    = 15 * time.Second
	grantIdleAfter = 10 * time.Second
)

// grantTrack turns one replica's reported granted tokens into a rate.
type grantTrack struct {
	seen    bool
	last    int64     // the count last read
	since   time.Time // when last was first read
	changes []grantPoint
	// beats is set when the heartbeats carry their instant: changes
	// then holds one point per heartbeat, at its instant, and since is
	// the last one's.
	beats bool
}

// grantPoint is a count read at the first read that saw it.
type grantPoint struct {
	at      time.Time
	granted int64
}

// observe records the count read at at, which the heartbeat of instant
// beat carried (zero when the heartbeat does not say).
func (g *grantTrack) observe(at, beat time.Time, granted int64) {
	if g.seen && g.beats != !beat.IsZero() { // the replica changed versions
		*g = grantTrack{}
	}
	if !beat.IsZero() {
		g.observeBeat(beat, granted)
		return
	}
	switch {
	case !g.seen:
		// The first read's count may be seconds old: not a change.
		g.seen, g.last, g.since = true, granted, at
		return
	case granted == g.last:
		return
	case granted < g.last: // the replica restarted
		g.changes = nil
	}
	g.last, g.since = granted, at
	g.changes = append(g.changes, grantPoint{at, granted})
	for len(g.changes) > 2 && at.Sub(g.changes[0].at) > grantWindow {
		g.changes = g.changes[1:]
	}
}

// observeBeat records the count the heartbeat of instant beat carried: a
// point of its own, once per heartbeat, whether or not the count moved.
func (g *grantTrack) observeBeat(beat time.Time, granted int64) {
	switch {
	case g.seen && !beat.After(g.since): // the same heartbeat, read again
		return
	case g.seen && granted < g.last: // the replica restarted
		g.changes = nil
	}
	g.seen, g.beats, g.last, g.since = true, true, granted, beat
	g.changes = append(g.changes, grantPoint{beat, granted})
	for len(g.changes) > 2 && beat.Sub(g.changes[0].at) > beatWindow {
		g.changes = g.changes[1:]
	}
}

// rate returns the tokens granted per second between the first and last
// point in the window and NaN when it cannot tell yet; without heartbeat
// instants, 0 when the count has not moved for grantIdleAfter.
func (g *grantTrack) rate(now time.Time) float64 {
	n := len(g.changes)
	switch {
	case g.beats && n < 2:
		return math.NaN()
	case g.beats:
	case g.seen && now.Sub(g.since) >= grantIdleAfter:
		return 0
	case n < 2:
		return math.NaN()
	}
	first, last := g.changes[0], g.changes[n-1]
	return float64(last.granted-first.granted) / last.at.Sub(first.at).Seconds()
}

func (h *watchHistory) push(x float64) {
	copy(h.spark, h.spark[1:])
	h.spark[len(h.spark)-1] = x
}

func (h *watchHistory) sparkCopy() []float64 { return append([]float64(nil), h.spark...) }

// estimateDelivered estimates the tokens granted per second between two
// reads of the bucket, dt seconds apart, from its refill and its tokens:
// granted = before + refill − after. It needs both token counts and the
// same rate, and no pause (which stops the refill); it undercounts while
// the bucket is full, since the refill above the burst is lost. It
// returns NaN when it cannot tell.
func estimateDelivered(before, after redislimiter.BucketStatus, dt float64) (float64, bool) {
	if !before.TokensKnown || !after.TokensKnown || before.Rate != after.Rate || before.PausedFor > 0 || after.PausedFor > 0 {
		return math.NaN(), true
	}
	refill := after.Rate * dt
	if after.Burst > 0 && after.Tokens >= float64(after.Burst) {
		// Full now: the refill above the burst was lost; count only what
		// filled it (0 when it was full before too).
		refill = min(refill, max(0, float64(after.Burst)-before.Tokens))
	}
	granted := before.Tokens + refill - after.Tokens
	return max(0, granted/dt), true
}

// deliveredSource says where the delivered rate of v comes from, to follow
// it on the screen.
func deliveredSource(v watchView) string {
	switch {
	case v.estimated && len(v.replicas) == 0:
		return " (estimated from the bucket's tokens: no live replica)"
	case v.estimated && v.unreported == len(v.replicas):
		return " (estimated from the bucket's tokens: the replicas report no counts; it undercounts while the bucket is full)"
	case v.estimated:
		return fmt.Sprintf(" (estimated from the bucket's tokens: %d of %d replicas report no count; it undercounts while the bucket is full)", v.unreported, len(v.replicas))
	case !math.IsNaN(v.delivered):
		return " (reported by the replicas)"
	case v.ok && len(v.replicas) > 0:
		return " (measuring: each replica's rate shows from its second heartbeat)"
	}
	return ""
}

// idleReplicas counts the replicas of v that report themselves idle.
func idleReplicas(v watchView) int {
	n := 0
	for _, r := range v.replicas {
		if r.idle {
			n++
		}
	}
	return n
}

// rateSource names where the effective rate comes from.
func rateSource(v watchView) string {
	switch {
	case v.status.Override != nil && !v.status.Override.Ignored:
		return "override"
	case v.configured != nil:
		return "configured"
	}
	return "unknown"
}

// renderWatch draws the full-screen view.
func renderWatch(v watchView) string {
	var b strings.Builder
	fmt.Fprintf(&b, "throttle bucket watch: %s   %s   (every %v; Ctrl-C quits)\n\n", v.bucket, v.now.UTC().Format("2006-01-02 15:04:05 UTC"), v.interval)
	if v.err != nil {
		fmt.Fprintf(&b, "  ! reading Redis failed: %v (retrying; figures below are from the last good read)\n\n", v.err)
	}
	if !v.ok {
		return b.String()
	}
	line := func(k, format string, args ...any) { fmt.Fprintf(&b, "  %-11s %s\n", k, fmt.Sprintf(format, args...)) }
	st := v.status
	if st.TokensKnown {
		line("tokens", "%s of %d  %s", formatTokens(st.Tokens), st.Burst, gauge(st.Tokens, float64(st.Burst), 20))
	} else {
		line("tokens", "unknown: the burst is in each replica's config; pass --config FILE")
	}
	switch {
	case st.Rate <= 0:
		line("rate", "each replica's configured rate; pass --config FILE to see it")
	case st.PausedFor > 0:
		line("rate", "0/s while paused, then %s (%s)", formatRate(st.Rate), rateSource(v))
	default:
		line("rate", "%s (%s)", formatRate(st.Rate), rateSource(v))
	}
	if o := st.Override; o != nil {
		exp := "until cleared"
		if o.ExpiresIn > 0 {
			exp = "expires in " + o.ExpiresIn.Round(time.Second).String()
		}
		switch {
		case o.Ignored:
			line("override", "ignored: Redis holds rate %q burst %q, not valid numbers", o.RawRate, o.RawBurst)
		case o.Burst > 0:
			line("override", "%s, burst %d, %s", formatRate(o.Rate), o.Burst, exp)
		default:
			line("override", "%s, each replica's burst, %s", formatRate(o.Rate), exp)
		}
	} else {
		line("override", "none")
	}
	if c := v.configured; c != nil {
		line("configured", "%s, burst %d (%s)%s", formatRate(c.Rate), c.Burst, v.from, shadowNote(c))
	} else {
		line("configured", "unknown: the live replicas do not agree or report none; pass --config FILE")
	}
	line("adaptive", "none")
	if st.PausedFor > 0 {
		line("paused", "for %v more: a sink asked to slow down", roundDuration(st.PausedFor.Seconds()))
	} else {
		line("paused", "no")
	}
	line("delivered", "%s%s", formatMaybeRate(v.delivered), deliveredSource(v))
	cells := downsample(v.spark, sparkCells)
	lo, hi := sparkRange(cells)
	line("", "%s  last %v, %s–%s", sparkline(cells), watchWindow, formatMaybeRate(lo), formatMaybeRate(hi))
	b.WriteString("\n")
	if len(v.replicas) == 0 {
		line("replicas", "none alive")
	} else {
		if idle := idleReplicas(v); idle > 0 {
			line("replicas", "%d alive, %d idle (consuming nothing: no partition or consumer)", len(v.replicas), idle)
		} else {
			line("replicas", "%d alive", len(v.replicas))
		}
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "    ID\tMODE\tDELIVERED\tWAITING\tCONFIGURED")
		for _, r := range v.replicas {
			mode, delivered, waiting := "?", "?", "?"
			if r.reported {
				mode, delivered, waiting = r.mode, formatMaybeRate(r.delivered), strconv.Itoa(r.waiting)
			}
			if r.idle {
				mode += ", idle"
			}
			conf := "not reported"
			if c := r.configured; c != nil {
				conf = fmt.Sprintf("%s burst %d", formatRate(c.Rate), c.Burst)
			}
			fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\n", r.id, mode, delivered, waiting, conf)
		}
		tw.Flush()
	}
	b.WriteString("\n")
	reportedOnly := 0
	for _, l := range v.layers {
		if l.reportedOnly {
			reportedOnly++
		}
	}
	switch {
	case v.layersKnown && reportedOnly > 0:
		line("layers", "%d (limit.extra of %s), and %d more that the replicas report refusals by", len(v.layers)-reportedOnly, v.from, reportedOnly)
	case v.layersKnown && len(v.layers) > 0:
		line("layers", "%d (limit.extra of %s)", len(v.layers), v.from)
	case len(v.layers) > 0:
		line("layers", "unknown: pass --config FILE; the replicas report refusals by these")
	case v.layersKnown:
		line("layers", "none")
	default:
		line("layers", "unknown: they are in the replicas' limit.extra; pass --config FILE")
	}
	if len(v.layers) > 0 {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "    LAYER\tLIMIT\tIN REDIS\tEXCEEDED\tLAST MINUTE\tTOP KEYS REFUSED, LAST MINUTE")
		for _, l := range v.layers {
			exceeded, recent := "?", "?"
			if l.exceeded >= 0 {
				exceeded, recent = strconv.FormatInt(l.exceeded, 10), "+"+strconv.FormatInt(l.recent, 10)
			}
			name := l.name
			if name == "" { // the shared bucket's would-waits (limit.shadow)
				name, l.desc = "(bucket)", "SHADOW (not enforced; exceeded = would have)"
			}
			fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%s\n", name, l.desc, l.state, exceeded, recent, describeRefused(l.top, 3))
		}
		tw.Flush()
	}
	if t := v.tenants; t != nil {
		b.WriteString("\n")
		line("tenants", "by share of the last minute's tokens: %s", describeShares(t.ByShare, topText))
		line("", "by messages waiting now: %s", describeWaiting(t.ByWaiting, topText))
	}
	return b.String()
}

// watchLine is the one-line form, for a standard output that is not a
// terminal.
func watchLine(v watchView) string {
	ts := v.now.UTC().Format(time.RFC3339)
	if !v.ok {
		return fmt.Sprintf("%s %s error=%q", ts, v.bucket, fmt.Sprint(v.err))
	}
	st := v.status
	tokens := "?"
	if st.TokensKnown {
		tokens = formatTokens(st.Tokens) + "/" + strconv.Itoa(st.Burst)
	}
	rate := "?"
	if st.Rate > 0 {
		rate = formatRate(st.Rate) + "(" + rateSource(v) + ")"
	}
	waiting, reported := 0, false
	for _, r := range v.replicas {
		if r.reported {
			waiting += r.waiting
			reported = true
		}
	}
	w := "?"
	if reported {
		w = strconv.Itoa(waiting)
	}
	delivered := formatMaybeRate(v.delivered)
	if v.estimated && !math.IsNaN(v.delivered) {
		delivered += "(estimated)"
	}
	line := fmt.Sprintf("%s %s tokens=%s rate=%s paused=%v replicas=%d delivered=%s waiting=%s",
		ts, v.bucket, tokens, rate, roundDuration(st.PausedFor.Seconds()), len(v.replicas), delivered, w)
	if idle := idleReplicas(v); idle > 0 {
		line += " idle=" + strconv.Itoa(idle)
	}
	if len(v.layers) > 0 {
		counts := make([]string, len(v.layers))
		for i, l := range v.layers {
			n := "?"
			if l.exceeded >= 0 {
				n = strconv.FormatInt(l.exceeded, 10)
			}
			name := l.name
			if name == "" { // the shared bucket's would-waits (limit.shadow)
				name = "bucket"
			}
			counts[i] = name + ":" + n
		}
		line += " exceeded=" + strings.Join(counts, ",")
		for _, l := range v.layers {
			if len(l.top) > 0 {
				line += " top_refused[" + l.name + "]=" + compactTop(l.top)
			}
		}
	}
	if t := v.tenants; t != nil {
		shares := make([]string, len(t.ByShare))
		for i, x := range t.ByShare {
			shares[i] = fmt.Sprintf("%s:%d%%", showKey(x.Tenant), int(math.Round(100*x.Share)))
		}
		waiting := make([]string, len(t.ByWaiting))
		for i, x := range t.ByWaiting {
			waiting[i] = fmt.Sprintf("%s:%d", showKey(x.Tenant), x.Waiting)
		}
		line += " tenants_share=" + strings.Join(shares, ",") + " tenants_waiting=" + strings.Join(waiting, ",")
	}
	if v.err != nil {
		line += fmt.Sprintf(" error=%q", v.err.Error())
	}
	return line
}

// compactTop writes keys refused for watch's one-line form: "KEY:N,KEY:N".
func compactTop(keys []keyCountJSON) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = showKey(k.Key) + ":" + strconv.FormatInt(k.Refused, 10)
	}
	return strings.Join(parts, ",")
}

// formatTokens rounds tokens to one decimal.
func formatTokens(t float64) string {
	return strconv.FormatFloat(math.Round(t*10)/10, 'f', -1, 64)
}

// formatMaybeRate formats a rate rounded to one decimal, or "?" for NaN.
func formatMaybeRate(r float64) string {
	if math.IsNaN(r) {
		return "?"
	}
	return formatRate(math.Round(r*10) / 10)
}

// gauge draws x of full as a bar of width cells.
func gauge(x, full float64, width int) string {
	n := 0
	if full > 0 {
		n = int(math.Round(math.Max(0, math.Min(1, x/full)) * float64(width)))
	}
	return "[" + strings.Repeat("█", n) + strings.Repeat("░", width-n) + "]"
}

// sparkline draws one cell per value, scaled from 0 to the largest value;
// an unknown (NaN) value is a blank.
func sparkline(vals []float64) string {
	_, hi := sparkRange(vals)
	var b strings.Builder
	for _, x := range vals {
		switch {
		case math.IsNaN(x):
			b.WriteRune(' ')
		case hi <= 0:
			b.WriteRune(sparkTicks[0])
		default:
			i := int(x / hi * float64(len(sparkTicks)-1))
			b.WriteRune(sparkTicks[max(0, min(len(sparkTicks)-1, i))])
		}
	}
	return b.String()
}

// downsample averages vals into at most n cells, oldest first, each the
// mean of the known values of consecutive groups; the last cell holds the
// newest values. A cell without a known value is NaN.
func downsample(vals []float64, n int) []float64 {
	if len(vals) <= n {
		return vals
	}
	group := (len(vals) + n - 1) / n
	var out []float64
	// Groups end at the newest value; the oldest group may be partial.
	for end := len(vals); end > 0; end -= group {
		sum, k := 0.0, 0
		for _, x := range vals[max(0, end-group):end] {
			if !math.IsNaN(x) {
				sum, k = sum+x, k+1
			}
		}
		if k == 0 {
			out = append(out, math.NaN())
		} else {
			out = append(out, sum/float64(k))
		}
	}
	slices.Reverse(out)
	return out
}

// sparkRange returns the smallest and largest known value, NaN if none.
func sparkRange(vals []float64) (lo, hi float64) {
	lo, hi = math.NaN(), math.NaN()
	for _, x := range vals {
		if math.IsNaN(x) {
			continue
		}
		if math.IsNaN(lo) || x < lo {
			lo = x
		}
		if math.IsNaN(hi) || x > hi {
			hi = x
		}
	}
	return lo, hi
}
