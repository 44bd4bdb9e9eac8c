package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/console"
	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

const consoleHelp = `Usage: throttle console --config FILE [NAME...] [--listen ADDR]

Serves a web console: one page that shows, live, every bucket of --config
(limit.bucket, and each NAME on the same Redis) with its rate, override,
tokens, mode and delivered rate, a 5-minute chart, its replicas (mode,
share, waiting calls, last heartbeat), its priority classes, its layers
(limit.extra) and their refusals, the adaptive rate and the warm-up. It
reads only what 'bucket status' and 'bucket watch' read: Redis and the
replicas' heartbeats, once a second.

With console.token set, the page and the JSON API also change a bucket,
as the 'bucket' commands do: set the rate, clear the override, fill,
pause for a while, resume. Each action needs the header
"Authorization: Bearer TOKEN"; without console.token the console is
read-only. Every action is logged with the client's address. The console
listens on loopback only unless console.allow_remote is true.

API (JSON):
  GET    /api/status                 what 'bucket status --json' prints, for every bucket
  POST   /api/buckets/NAME/rate      {"rate": "10/s"}   ('bucket set --rate')
  DELETE /api/buckets/NAME/rate      ('bucket set --clear')
  POST   /api/buckets/NAME/fill      ('bucket fill')
  POST   /api/buckets/NAME/pause     {"for": "30s"}     ('bucket pause --for')
  POST   /api/buckets/NAME/resume    ('bucket resume')
  GET    /api/events, /api/frame     the page's live frames (SSE, polling)
An action answers {"message": ...}, or {"error": ...} with 400 (bad input,
the CLI's message), 401 (no or wrong token), 403 (read-only), 404 (a
bucket the console does not show) or 502 (Redis failed).

Flags:
  --config FILE   the replicas' YAML configuration (Redis, the bucket,
                  console.listen, console.token)
  --listen ADDR   where to listen, instead of console.listen (default
                  ` + config.DefaultConsoleListen + `)
`

func cmdConsole(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("console")
	cfgPath := fs.String("config", "", "")
	listen := fs.String("listen", "", "")
	pos, err := parseArgs(fs, args, consoleHelp, stdout)
	if err != nil {
		return err
	}
	help := fs.Name()
	if *cfgPath == "" {
		return usagef(help, "console needs --config FILE")
	}
	cfg, rc, err := adminRedis(*cfgPath, "", help)
	if err != nil {
		return err
	}
	addr := cfg.Console.Listen
	switch {
	case *listen != "":
		addr = *listen
		c := cfg.Console
		c.Listen = addr
		probe := config.Config{Console: c}
		if err := probe.Validate(); err != nil {
			var ve *config.ValidationError
			if errors.As(err, &ve) {
				for _, p := range ve.Problems {
					if strings.HasPrefix(p.Key, "console.") {
						return usagef(help, "--listen: %s", p.Message)
					}
				}
			}
		}
	case addr == "":
		addr = config.DefaultConsoleListen
	case addr == "off":
		return usagef(help, "console.listen is off in %s; pass --listen ADDR", *cfgPath)
	}
	names := []string{cfg.Limit.Bucket}
	for _, n := range pos {
		if err := redislimiter.ValidateBucketName(n); err != nil {
			return usagef(help, "bucket NAME: %v", err)
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	client, err := redisconn.New(rc)
	if err != nil {
		return &configError{err: err}
	}
	defer client.Close()
	log := newLogger(cfg.Log, stderr)
	return serveConsole(ctx, addr, cfg, *cfgPath, names, client, log)
}

// serveConsole serves the console of buckets names on addr until ctx ends.
// from names the config file, for the page.
func serveConsole(ctx context.Context, addr string, cfg *config.Config, from string, names []string, client redis.UniversalClient, log *slog.Logger) error {
	ln, srv, err := listenConsole(addr, cfg, from, names, client, log)
	if err != nil {
		return err
	}
	return console.Serve(ctx, ln, srv)
}

// listenConsole opens the console's listener on addr and logs where it
// serves.
func listenConsole(addr string, cfg *config.Config, from string, names []string, client redis.UniversalClient, log *slog.Logger) (net.Listener, *console.Server, error) {
	host, _, _ := net.SplitHostPort(addr)
	srv, err := console.New(console.Config{
		Backend:      newConsoleBackend(client, cfg, from, names),
		Token:        cfg.Console.Token,
		Log:          log,
		LoopbackOnly: config.IsLoopbackHost(host),
	})
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("console.listen: %w", err)
	}
	log.Info("serving the console", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String()+"/",
		"buckets", strings.Join(names, ","), "read_only", cfg.Console.Token == "")
	return ln, srv, nil
}

// startReplicaConsole starts the console of a replica's bucket
// (console.listen), on a Redis client of its own with the admin commands'
// timeout, and returns the function that stops it and waits.
func startReplicaConsole(cfg *config.Config, log *slog.Logger) (stop func(), err error) {
	rc := cfg.Redis
	rc.Timeout = max(rc.Timeout, config.Duration(2*time.Second))
	client, err := redisconn.New(rc)
	if err != nil {
		return nil, &configError{err: err}
	}
	ln, srv, err := listenConsole(cfg.Console.Listen, cfg, "the replica's config", []string{cfg.Limit.Bucket}, client, log)
	if err != nil {
		client.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := console.Serve(ctx, ln, srv); err != nil {
			log.Warn("the console stopped", "error", err)
		}
	}()
	return func() {
		cancel()
		<-done
		client.Close()
	}, nil
}

// consoleBackend is the console's console.Backend: the code of the
// 'bucket' commands (bucketTarget, its status and apply, the watch's
// history) on the buckets of one config.
type consoleBackend struct {
	client redis.UniversalClient
	cfg    *config.Config
	from   string
	names  []string
	// views is each bucket's live state, used by Sample only (one
	// goroutine at a time).
	views map[string]*consoleView
}

// consoleView is one bucket's live state: the watch's history, which turns
// the replicas' counters into rates, and its layer reader.
type consoleView struct {
	w    *watcher
	hist *watchHistory
}

func newConsoleBackend(client redis.UniversalClient, cfg *config.Config, from string, names []string) *consoleBackend {
	return &consoleBackend{client: client, cfg: cfg, from: from, names: names, views: map[string]*consoleView{}}
}

// Buckets implements console.Backend.
func (b *consoleBackend) Buckets() []string { return slices.Clone(b.names) }

// target returns the bucket name, with the configured limits it has, as
// 'bucket status' finds them. A name that is not valid, or not one of the
// console's, is a *console.InputError.
func (b *consoleBackend) target(ctx context.Context, name string) (*bucketTarget, error) {
	if err := redislimiter.ValidateBucketName(name); err != nil {
		return nil, &console.InputError{Msg: fmt.Sprintf("bucket NAME: %v", err)}
	}
	if !slices.Contains(b.names, name) {
		return nil, &console.InputError{NotFound: true, Msg: fmt.Sprintf("bucket %s is not one this console shows (%s)", name, strings.Join(b.names, ", "))}
	}
	t, err := newBucketTarget(b.client, b.cfg, b.from, name)
	if err != nil {
		return nil, err
	}
	if err := t.learnConfig(ctx); err != nil {
		return nil, fmt.Errorf("reading bucket %s: %w", name, err)
	}
	return t, nil
}

// Status implements console.Backend: each bucket as 'bucket status
// --config --json' prints it, layers included.
func (b *consoleBackend) Status(ctx context.Context) (any, error) {
	all := make([]*bucketStatus, 0, len(b.names))
	for _, name := range b.names {
		t, err := b.target(ctx, name)
		if err != nil {
			return nil, err
		}
		st, err := t.status(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading bucket %s: %w", name, err)
		}
		ls, known, err := configLayers(t, b.cfg)
		if st.Layers, err = readLayersOf(ctx, t, ls, known, err); err != nil {
			return nil, fmt.Errorf("reading the layers of bucket %s: %w", name, err)
		}
		all = append(all, st)
	}
	return all, nil
}

// Do implements console.Backend with bucketTarget.apply, the code of
// 'bucket set', 'fill', 'pause' and 'resume', after the same parsing.
func (b *consoleBackend) Do(ctx context.Context, a console.Action) (string, error) {
	if err := redislimiter.ValidateBucketName(a.Bucket); err != nil {
		return "", &console.InputError{Msg: fmt.Sprintf("bucket NAME: %v", err)}
	}
	act := bucketAction{op: a.Op}
	var err error
	switch a.Op {
	case "set":
		act.rate, err = parseRate("rate", a.Rate)
	case "pause":
		act.pause, err = parsePause("for", a.For)
	case "clear", "fill", "resume":
	default:
		err = fmt.Errorf("unknown action %q", a.Op)
	}
	if err != nil {
		return "", &console.InputError{Msg: err.Error()}
	}
	t, err := b.target(ctx, a.Bucket)
	if err != nil {
		return "", err
	}
	done, err := t.apply(ctx, act, io.Discard) // the sentence says what stderr would
	if errors.Is(err, redislimiter.ErrLimitsUnknown) {
		return "", &console.InputError{Msg: fmt.Sprintf("%s bucket %s: %v", a.Op, a.Bucket, err)}
	}
	if err != nil {
		return "", fmt.Errorf("%s bucket %s: %w", a.Op, a.Bucket, err)
	}
	return done, nil
}

// Sample implements console.Backend: each bucket read as 'bucket status'
// reads it, its rates computed as 'bucket watch' computes them.
func (b *consoleBackend) Sample(ctx context.Context) ([]console.BucketFrame, error) {
	out := make([]console.BucketFrame, 0, len(b.names))
	for _, name := range b.names {
		f, err := b.sampleBucket(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", name, err)
		}
		out = append(out, f)
	}
	return out, nil
}

func (b *consoleBackend) sampleBucket(ctx context.Context, name string) (console.BucketFrame, error) {
	t, err := b.target(ctx, name)
	if err != nil {
		return console.BucketFrame{}, err
	}
	v := b.views[name]
	if v == nil {
		w := &watcher{name: name, client: b.client, admin: b.client, interval: time.Second}
		if name == b.cfg.Limit.Bucket {
			if w.layers, err = layersOf(b.client, b.cfg); err != nil {
				return console.BucketFrame{}, err
			}
		}
		v = &consoleView{w: w, hist: newWatchHistory(name, time.Second)}
		v.hist.layersKnown = name == b.cfg.Limit.Bucket
		b.views[name] = v
	}
	st, err := t.status(ctx)
	if err != nil {
		return console.BucketFrame{}, err
	}
	s := sample{at: st.raw.At, status: st.raw, replicas: st.reps, configured: t.configured, from: t.from}
	if s.at.IsZero() {
		s.at = time.Now()
	}
	if s.layers, err = v.w.readLayers(ctx); err != nil {
		return console.BucketFrame{}, err
	}
	view := v.hist.add(s, nil, time.Now())
	f := console.BucketFrame{
		Name: name, Status: st, Mode: modeSummary(view.replicas),
		Delivered:     known(view.delivered),
		DeliveredNote: strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(deliveredSource(view)), "("), ")"),
		Replicas:      []console.ReplicaFrame{},
		Layers:        []console.LayerFrame{},
	}
	beats := map[string]time.Time{}
	for _, r := range st.reps {
		beats[r.ID] = r.BeatAt
		// Every replica of a group or queue reads the same backlog:
		// the largest is the latest.
		if bl := r.Backlog; bl != nil && (f.Backlog == nil || bl.Ready+bl.SetAside > f.Backlog.Ready+f.Backlog.SetAside) {
			f.Backlog = &console.BacklogFrame{Ready: bl.Ready, SetAside: bl.SetAside}
		}
	}
	for _, r := range view.replicas {
		rf := console.ReplicaFrame{ID: r.id, Mode: r.mode, Idle: r.idle, Delivered: known(r.delivered)}
		if r.reported {
			w := r.waiting
			rf.Waiting = &w
		}
		if f.Delivered != nil && rf.Delivered != nil && *f.Delivered > 0 {
			share := *rf.Delivered / *f.Delivered
			rf.Share = &share
		}
		if at := beats[r.id]; !at.IsZero() {
			ago := max(0, s.at.Sub(at).Seconds())
			rf.LastBeatSeconds = &ago
		}
		if c := r.configured; c != nil {
			rf.Configured = fmt.Sprintf("%s burst %d", formatRate(c.Rate), c.Burst)
		}
		f.Replicas = append(f.Replicas, rf)
	}
	for _, l := range view.layers {
		lf := console.LayerFrame{Name: l.name, Limit: l.desc, InRedis: l.state}
		if l.exceeded >= 0 {
			n, m := l.exceeded, l.recent
			lf.Refused, lf.PerMinute = &n, &m
		}
		f.Layers = append(f.Layers, lf)
	}
	if !view.layersKnown {
		f.LayersNote = "the layers are in the replicas' limit.extra: this console knows those of " + b.cfg.Limit.Bucket + " only"
	}
	return f, nil
}

// known returns &x, or nil for NaN.
func known(x float64) *float64 {
	if math.IsNaN(x) {
		return nil
	}
	return &x
}

// modeSummary says how the replicas limit: "shared" when every reporting
// replica does, else each mode with its count, such as "local on 1 of 2,
// shared on 1 of 2"; "" when none reports.
func modeSummary(reps []replicaView) string {
	counts := map[string]int{}
	n := 0
	for _, r := range reps {
		if r.reported {
			counts[r.mode]++
			n++
		}
	}
	if n == 0 {
		return ""
	}
	if len(counts) == 1 {
		for m := range counts {
			return m
		}
	}
	modes := make([]string, 0, len(counts))
	for m := range counts {
		modes = append(modes, m)
	}
	sort.Slice(modes, func(i, j int) bool { // the one needing attention first
		rank := func(m string) int {
			return slices.Index([]string{string(limiter.ModeClosed), string(limiter.ModeOpen), string(limiter.ModeLocal), string(limiter.ModeShared)}, m)
		}
		return rank(modes[i]) < rank(modes[j])
	})
	parts := make([]string, len(modes))
	for i, m := range modes {
		parts[i] = fmt.Sprintf("%s on %d of %d", m, counts[m], n)
	}
	return strings.Join(parts, ", ")
}
