package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

const bucketHelp = `Usage:
  throttle bucket status [NAME] (--config FILE | --redis ADDR) [--json]
  throttle bucket set    [NAME] (--config FILE | --redis ADDR) --rate R [--burst B] [--for D] [--json]
  throttle bucket set    [NAME] (--config FILE | --redis ADDR) --clear [--json]
  throttle bucket fill   [NAME] (--config FILE | --redis ADDR) [--json]
  throttle bucket pause  [NAME] (--config FILE | --redis ADDR) --for D [--json]
  throttle bucket resume [NAME] (--config FILE | --redis ADDR) [--json]
  throttle bucket reset  [NAME] (--config FILE | --redis ADDR) [--json]
  throttle bucket status [NAME] --config FILE --layer L [--key K] [--json]
  throttle bucket reset  [NAME] --config FILE --layer L [--key K] [--json]
  throttle bucket list          (--config FILE | --redis ADDR) [--json]
  throttle bucket watch  [NAME] (--config FILE | --redis ADDR) [--interval D]
                         a live view; see 'throttle help bucket watch'

Reads or changes a shared bucket in Redis while the replicas run. NAME
defaults to limit.bucket of --config. With --config, Redis is reached as the
replicas reach it (password, TLS, Sentinel, Cluster) and the configured rate
and burst are known; with --redis host:port they are known when every live
replica reports the same ones in its heartbeats.

  status  tokens now, the effective rate and burst, the configured ones,
          the runtime override and its expiry, a push-back pause,
          the live replicas with their configured rate and burst (from their
          heartbeats) and those that are idle (consume nothing: a Kafka
          group member without partitions), each priority class's
          reserved tokens and waiting messages (while a class other than
          normal is in use), and warnings: live replicas configured
          differently (while no override settles it), or differently from
          --config; a name that nothing uses (no state, no override, no
          live replica: a typo?). From the replicas' heartbeats also the
          keys each layer of limit.extra refused most over the last minute
          and, with fair shares (limit.fair), the tenants with the largest
          share of the last minute's tokens and with the most messages
          waiting now: bounded (10 per replica, the 5 largest sums shown,
          10 with --json) and approximate.
  set     writes a runtime override: --rate R (per second, or N/min...), --burst B
          (default: each replica keeps its configured burst), for --for D
          (default: until cleared). --clear removes the override. Without
          a live replica the override is stored all the same, for the
          replicas started while it holds, with a warning on stderr.
  fill    fills the bucket to its burst now, before a known peak. A push-back
          pause stays in force.
  pause   stops the bucket for --for D (> 0, at most 24h): no replica is
          granted a token until it ends, as when a sink pushes back
          (status then says an operator paused it). A longer pause
          already in force is kept. Needs the rate and burst: --config,
          or an override with a burst.
  resume  ends a pause now, an operator's or a sink's push-back: every
          replica grants again at once, from the tokens the bucket had.
  reset   deletes the bucket's state and its override: the bucket is full,
          not paused, and each replica's configured rate applies again.
          With --config it also deletes the keys of every layer of
          limit.extra (SCAN and UNLINK, every master of a Cluster) and says
          how many; with --redis the layers are unknown and are left.
  --layer L [--key K]
          (status, reset) one key of a layer of limit.extra (needs --config):
          its tokens, or its quota used and when it resets; reset makes its
          bucket full or its quota unused. Plain 'status' with --config also
          lists the layers with the keys each has in use (SCAN, estimated
          past 100000 keys per master).
  list    every bucket that has keys in Redis (one that is not full, has an
          override or a pause, or has live replicas), with its status. It
          scans the keyspace, every master of a Cluster.

With --json, every subcommand prints the bucket's status as one JSON object
(list prints an array of them):
  {"bucket", "tokens", "rate", "burst", "configured": {"rate", "burst"},
   "override": {"rate", "burst", "expires_in_seconds"}, "paused_seconds",
   "paused_by" (while paused: a replica's id, or "operator"),
   "replicas": [{"id", "configured": {"rate", "burst"}, "idle"}], "warnings": [...],
   "adaptive": {"rate", "ceiling", "since_decrease_seconds"},
   "warmup": {"ramping", "rate_factor", "seconds_left", "cold"},
   "classes": [{"priority" (high|normal|low), "reserved", "waiting"}],
   "layers": [{"layer", "kind" (bucket|quota), "keyed", "rate", "burst",
     "quota", "per", "timezone", "on_exceed", "keys_in_use",
     "keys_estimated", "tokens", "used"}],
   "top_refused": {"LAYER": [{"key", "refused"}]},
   "tenants": {"by_share": [{"tenant", "tokens", "share"}],
     "by_waiting": [{"tenant", "waiting"}]}}
A value that cannot be known is null: tokens, rate and burst when the
configured values are unknown and no override is set; configured without
--config when the live replicas do not all report the same; a replica's
configured when its heartbeat does not carry it; override when none is set;
an override's burst when it keeps the configured burst; expires_in_seconds
when the override does not expire; adaptive unless limit.adaptive holds the
rate below its ceiling; warmup unless a warm-up ramp is in progress (or,
with --config and limit.warmup, the bucket is cold); a class's reserved
when the tokens are unknown (its waiting sums what the live replicas
reported in their last heartbeats); tenants unless a replica reports
tenants (fair shares); layers without --config
(a layer lists only the keys that apply: rate and burst for a bucket, quota,
per and timezone for a quota, keys_in_use for a keyed layer, tokens or used
for one without keys).

The runtime override and each replica's configured rate:
  Each replica's config file gives limit.rate and limit.burst: its default.
  'bucket set' stores an override in Redis next to the bucket. While the
  override exists it wins for every replica, whatever their config files
  say, even when they differ. Each replica uses it from its next token
  request, with no restart, and the change is announced on the bucket's
  Pub/Sub channel, so messages already holding a slot reserved at the old
  rate take it again at the new one. Deliveries follow within about a
  second. (A replica whose subscription was down when the change was
  announced, in a Redis failover say, takes its reserved slots again as
  soon as it has subscribed again.)
  The override holds until 'bucket set --clear', 'bucket reset', or the end
  of --for; then each replica's configured rate applies again.

  Without an override, every token request carries the requesting replica's
  configured rate, and the bucket refills at the rate of whichever replica
  asked last. During a rolling deploy that changes limit.rate, old and new
  replicas disagree and the rate flips between the two values until the
  deploy is done ('bucket status' warns while they disagree). So change the rate of a running fleet with 'bucket set'
  (at once, one value for all), and keep the config file for the steady
  default. To change the default smoothly: 'bucket set' the new rate, roll
  out the new config, then 'bucket set --clear'.

Flags:
  --config FILE   the replicas' YAML configuration
  --redis ADDR    Redis host:port, when no config file is at hand
  --json          print the bucket's status as JSON
  --rate R        (set) the override rate: tokens per second ("12.5"), or
                  N/s, N/min, N/h, N/d ("300/min"); > 0 and at most 1e9/s
  --burst B       (set) the override burst, >= 1
  --for D         (set) how long the override holds, such as 30m
  --clear         (set) remove the override
  --for D         (pause) how long to pause, such as 30s
  --layer L       (status, reset) a layer of limit.extra, by name
  --key K         (status, reset) the key in that layer, e.g. a recipient
`

// adminTimeout bounds each admin command against Redis.
const adminTimeout = 10 * time.Second

// bucketTarget is the bucket an admin command works on.
type bucketTarget struct {
	name   string
	client redis.UniversalClient
	admin  *redislimiter.Admin
	// configured is set when the configured rate and burst are known.
	configured *limitsJSON
	// warmup is limit.warmup of the config file, when it names this
	// bucket; 0 when unknown.
	warmup time.Duration
	from   string // where they come from, for the text output
}

func cmdBucket(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("bucket", "bucket needs a subcommand: status, set, fill, pause, resume, reset or list")
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "status", "set", "fill", "reset", "list", "pause", "resume":
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, bucketHelp)
		return nil
	default:
		return usagef("bucket", "unknown bucket subcommand %q", sub)
	}
	fs := newFlagSet("bucket " + sub)
	cfgPath := fs.String("config", "", "")
	addr := fs.String("redis", "", "")
	asJSON := fs.Bool("json", false, "")
	var rateArg string
	var burst int
	var ttl time.Duration
	var clear bool
	var layerArg, keyArg string // bucket_layers.go
	if sub == "status" || sub == "reset" {
		fs.StringVar(&layerArg, "layer", "", "")
		fs.StringVar(&keyArg, "key", "", "")
	}
	var pauseArg string
	if sub == "pause" {
		fs.StringVar(&pauseArg, "for", "", "")
	}
	if sub == "set" {
		fs.StringVar(&rateArg, "rate", "", "")
		fs.IntVar(&burst, "burst", 0, "")
		fs.DurationVar(&ttl, "for", 0, "")
		fs.BoolVar(&clear, "clear", false, "")
	}
	pos, err := parseArgs(fs, args, bucketHelp, stdout)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usagef(fs.Name(), "unexpected argument %q", pos[1])
	}
	name := ""
	if len(pos) == 1 {
		name = pos[0]
	}
	if sub == "list" {
		if name != "" {
			return usagef(fs.Name(), "bucket list takes no NAME, got %q", name)
		}
		return listBuckets(ctx, *cfgPath, *addr, *asJSON, stdout, fs.Name())
	}
	if layerArg != "" || keyArg != "" {
		return cmdBucketLayer(ctx, sub, name, *cfgPath, *addr, layerArg, keyArg, *asJSON, stdout, fs.Name())
	}
	var action bucketAction
	switch sub {
	case "set":
		action = bucketAction{op: "set", burst: burst, ttl: ttl}
		if clear {
			action.op = "clear"
		}
		if action.rate, err = checkSetFlags(fs, rateArg, burst, ttl, clear); err != nil {
			return err
		}
	case "fill", "resume":
		action.op = sub
	case "pause":
		action.op = sub
		if pauseArg == "" {
			return usagef(fs.Name(), "bucket pause needs --for D, such as --for 30s")
		}
		if action.pause, err = parsePause("--for", pauseArg); err != nil {
			return usagef(fs.Name(), "%v", err)
		}
	}
	t, err := openBucket(name, *cfgPath, *addr, fs.Name())
	if err != nil {
		return err
	}
	defer t.client.Close()

	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	if err := t.learnConfig(ctx); err != nil {
		return fmt.Errorf("reading bucket %s: %w", t.name, err)
	}
	var done string
	switch sub {
	case "set", "fill", "pause", "resume":
		done, err = t.apply(ctx, action, stderr)
	case "reset":
		err = t.admin.Reset(ctx)
		done = fmt.Sprintf("Reset bucket %s: it is full, and its override and pause are gone.", t.name)
		if err == nil {
			done, err = t.resetLayers(ctx, *cfgPath, done)
		}
	}
	if err != nil {
		return fmt.Errorf("%s bucket %s: %w", sub, t.name, err)
	}
	if sub != "status" && !*asJSON {
		fmt.Fprintln(stdout, done)
		return nil
	}
	st, err := t.status(ctx)
	if err != nil {
		return fmt.Errorf("reading bucket %s: %w", t.name, err)
	}
	if st.Layers, err = readLayers(ctx, t, *cfgPath); err != nil {
		return fmt.Errorf("reading the layers of bucket %s: %w", t.name, err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	writeStatus(stdout, st, t.from)
	writeLayers(stdout, st.Layers)
	return nil
}

// bucketAction is one change of a bucket: what 'bucket set', 'fill',
// 'pause' and 'resume' do, and the console's actions, both through
// bucketTarget.apply.
type bucketAction struct {
	op    string        // "set", "clear", "fill", "pause" or "resume"
	rate  float64       // set: tokens per second
	burst int           // set: 0 keeps each replica's configured burst
	ttl   time.Duration // set: how long the override holds; 0 until cleared
	pause time.Duration // pause: how long
}

// String describes the change for a log line.
func (a bucketAction) String() string {
	switch a.op {
	case "set":
		return fmt.Sprintf("set rate %s, %s, %s", formatRate(a.rate), describeBurst(a.burst), describeTTL(a.ttl))
	case "clear":
		return "clear the override"
	case "pause":
		return "pause for " + a.pause.String()
	}
	return a.op
}

// apply makes the change a on the bucket and says what it did, in a
// sentence for a person. A warning for the operator goes to stderr.
func (t *bucketTarget) apply(ctx context.Context, a bucketAction, stderr io.Writer) (string, error) {
	var err error
	switch a.op {
	case "set":
		if err = t.admin.SetOverride(ctx, a.rate, a.burst, a.ttl); err != nil {
			return "", err
		}
		return t.setDone(ctx, a.rate, a.burst, a.ttl, stderr)
	case "clear":
		err = t.admin.ClearOverride(ctx)
		return fmt.Sprintf("Cleared the override of bucket %s: each replica's configured rate applies again.", t.name), err
	case "fill":
		err = t.admin.Fill(ctx)
		return fmt.Sprintf("Filled bucket %s to its burst.", t.name), err
	case "pause":
		err = t.admin.Pause(ctx, a.pause)
		return fmt.Sprintf("Paused bucket %s for %v: no replica is granted a token until it ends ('bucket resume' ends it now).", t.name, a.pause), err
	case "resume":
		ended, err := t.admin.Resume(ctx)
		if !ended {
			return fmt.Sprintf("Bucket %s was not paused: nothing changed.", t.name), err
		}
		return fmt.Sprintf("Resumed bucket %s: every replica is granted tokens again.", t.name), err
	}
	return "", fmt.Errorf("unknown bucket action %q", a.op)
}

// parseRate parses a rate as 'bucket set --rate' and the console take it
// (limiter.ParseRate); what names the value in the error ("--rate").
func parseRate(what, arg string) (float64, error) {
	rate, err := limiter.ParseRate(arg)
	if err != nil {
		return 0, fmt.Errorf("%s%s", what, paramProblem(err, arg))
	}
	return rate, nil
}

// parsePause parses the length of a pause as 'bucket pause --for' and the
// console take it (redislimiter.ValidatePause); what names the value in
// the error ("--for").
func parsePause(what, arg string) (time.Duration, error) {
	d, err := time.ParseDuration(arg)
	if err != nil {
		return 0, fmt.Errorf("%s must be a duration such as 30s or 5m, got %q", what, arg)
	}
	if err := redislimiter.ValidatePause(d); err != nil {
		return 0, fmt.Errorf("%s%s", what, paramProblem(err, arg))
	}
	return d, nil
}

// setDone says what 'bucket set --rate' did. Without a live replica the
// override is stored all the same, for the replicas started while it holds,
// and a warning on stderr says that no replica uses the bucket now.
func (t *bucketTarget) setDone(ctx context.Context, rate float64, burst int, ttl time.Duration, stderr io.Writer) (string, error) {
	reps, err := t.admin.Replicas(ctx)
	if err != nil {
		return "", err
	}
	set := fmt.Sprintf("Bucket %s now runs at %s, %s, %s", t.name, formatRate(rate), describeBurst(burst), describeTTL(ttl))
	if len(reps) > 0 {
		return set + "; every running replica takes it up with its next token request.", nil
	}
	fmt.Fprintf(stderr, "throttle: warning: no replica is using bucket %s now (no live heartbeat); "+
		"if replicas should be running, check the name ('bucket list' shows the buckets in use).\n", t.name)
	return set + ", but no replica is using it now (no live heartbeat): the override is stored, " +
		"and replicas started while it holds take it up with their first token request.", nil
}

// checkSetFlags checks the flags of bucket set and returns the rate in
// tokens per second, parsed by limiter.ParseRate.
func checkSetFlags(fs *flag.FlagSet, rateArg string, burst int, ttl time.Duration, clear bool) (float64, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	help := fs.Name()
	if clear {
		if set["rate"] || set["burst"] || set["for"] {
			return 0, usagef(help, "--clear cannot be combined with --rate, --burst or --for")
		}
		return 0, nil
	}
	if !set["rate"] {
		return 0, usagef(help, "bucket set needs --rate R, or --clear to remove the override")
	}
	rate, err := parseRate("--rate", rateArg)
	if err != nil {
		return 0, usagef(help, "%v", err)
	}
	switch {
	case set["burst"] && backend.ValidateBurst(burst) != nil:
		return 0, usagef(help, "--burst%s", paramProblem(backend.ValidateBurst(burst), burst))
	case set["for"] && ttl <= 0:
		return 0, usagef(help, "--for must be > 0, got %v; leave it out for an override that holds until cleared", ttl)
	}
	return rate, nil
}

// paramProblem says what is wrong with a flag's value, to follow the flag's
// name: " must be ..., got V" or ": unknown unit ..., got V". It takes the
// message of the library's *limiter.ParamError, which names the Go field
// rather than the flag, and quotes the value as given.
func paramProblem(err error, value any) string {
	var pe *limiter.ParamError
	if !errors.As(err, &pe) {
		return fmt.Sprintf(": %v", err)
	}
	sep := ": "
	if strings.HasPrefix(pe.Msg, "must ") {
		sep = " "
	}
	return fmt.Sprintf("%s%s, got %v", sep, pe.Msg, value)
}

// openBucket connects to the bucket named by the flags.
func openBucket(name, cfgPath, addr, help string) (*bucketTarget, error) {
	switch {
	case cfgPath != "" && addr != "":
		return nil, usagef(help, "use either --config or --redis, not both")
	case cfgPath == "" && addr == "":
		return nil, usagef(help, "%s needs --config FILE or --redis ADDR", help)
	case addr != "" && name == "":
		return nil, usagef(help, "%s needs the bucket NAME with --redis", help)
	}
	cfg, rc, err := adminRedis(cfgPath, addr, help)
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = cfg.Limit.Bucket
	}
	if err := redislimiter.ValidateBucketName(name); err != nil {
		return nil, usagef(help, "bucket NAME: %v", err)
	}
	client, err := redisconn.New(rc)
	if err != nil {
		return nil, &configError{err: err}
	}
	t, err := newBucketTarget(client, cfg, cfgPath, name)
	if err != nil {
		client.Close()
		return nil, usagef(help, "bucket: %v", err)
	}
	return t, nil
}

// adminRedis reads the Redis settings from the config file, or from
// --redis. cfg is empty without a config file.
func adminRedis(cfgPath, addr, help string) (*config.Config, config.Redis, error) {
	cfg := &config.Config{}
	var rc config.Redis
	if cfgPath != "" {
		var err error
		if cfg, err = loadConfig(cfgPath); err != nil {
			return nil, rc, err
		}
		rc = cfg.Redis
	} else {
		if _, _, err := net.SplitHostPort(addr); err != nil || strings.Contains(addr, "@") {
			return nil, rc, usagef(help, "--redis must be host:port (use --config for a password or TLS), got %q", config.RedactURL(addr))
		}
		rc = config.Redis{Addr: addr}
	}
	// Admin commands are rare and a person waits for them: allow more than
	// the replicas' fail-fast timeout.
	rc.Timeout = max(rc.Timeout, config.Duration(2*time.Second))
	return cfg, rc, nil
}

// newBucketTarget returns the target for bucket name on client. The
// configured limits are known when name is the config file's bucket.
func newBucketTarget(client redis.UniversalClient, cfg *config.Config, cfgPath, name string) (*bucketTarget, error) {
	t := &bucketTarget{name: name, client: client}
	ac := redislimiter.AdminConfig{Bucket: name}
	if cfgPath != "" && name == cfg.Limit.Bucket {
		t.configured = &limitsJSON{Rate: cfg.Limit.Rate, Burst: cfg.Limit.Burst, Shadow: cfg.Limit.Shadow}
		t.warmup = time.Duration(cfg.Limit.Warmup)
		t.from = cfgPath
		ac.Rate, ac.Burst = cfg.Limit.Rate, cfg.Limit.Burst
	}
	var err error
	if t.admin, err = redislimiter.NewAdmin(client, ac); err != nil {
		return nil, err
	}
	return t, nil
}

// listBuckets prints the status of every bucket that has keys in Redis.
func listBuckets(ctx context.Context, cfgPath, addr string, asJSON bool, stdout io.Writer, help string) error {
	switch {
	case cfgPath != "" && addr != "":
		return usagef(help, "use either --config or --redis, not both")
	case cfgPath == "" && addr == "":
		return usagef(help, "%s needs --config FILE or --redis ADDR", help)
	}
	cfg, rc, err := adminRedis(cfgPath, addr, help)
	if err != nil {
		return err
	}
	client, err := redisconn.New(rc)
	if err != nil {
		return &configError{err: err}
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	names, err := redislimiter.Buckets(ctx, client, "")
	if err != nil {
		return err
	}
	all := make([]*bucketStatus, 0, len(names))
	for _, name := range names {
		t, err := newBucketTarget(client, cfg, cfgPath, name)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", name, err)
		}
		if err := t.learnConfig(ctx); err != nil {
			return fmt.Errorf("reading bucket %s: %w", name, err)
		}
		st, err := t.status(ctx)
		if err != nil {
			return fmt.Errorf("reading bucket %s: %w", name, err)
		}
		all = append(all, st)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(all)
	}
	writeList(stdout, all)
	return nil
}

// writeList prints one line per bucket for a person.
func writeList(w io.Writer, all []*bucketStatus) {
	if len(all) == 0 {
		fmt.Fprintln(w, "No bucket has keys in Redis: every bucket is full and idle, with no override and no live replica.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BUCKET\tRATE\tTOKENS\tREPLICAS\tOVERRIDE\tWARNINGS")
	for _, st := range all {
		rate, tokens := "?", "?"
		switch {
		case st.PausedSeconds > 0:
			rate = fmt.Sprintf("paused %v", roundDuration(st.PausedSeconds))
		case st.Rate != nil:
			rate = formatRate(*st.Rate)
		}
		if st.Tokens != nil {
			tokens = fmt.Sprintf("%s of %d", strconv.FormatFloat(math.Round(*st.Tokens*10)/10, 'f', -1, 64), *st.Burst)
		}
		override := "none"
		if o := st.Override; o != nil && o.Ignored {
			override = "ignored (out of range)"
		} else if o != nil {
			override = formatRate(o.Rate)
			if o.ExpiresInSeconds != nil {
				override += " for " + roundDuration(*o.ExpiresInSeconds).String()
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\n", st.Bucket, rate, tokens, len(st.Replicas), override, len(st.Warnings))
	}
	tw.Flush()
}

// learnConfig takes the configured rate and burst from the live replicas'
// heartbeats when no config file gave them and every live replica reports
// the same ones.
func (t *bucketTarget) learnConfig(ctx context.Context) error {
	if t.configured != nil {
		return nil
	}
	reps, err := t.admin.Replicas(ctx)
	if err != nil {
		return err
	}
	c, ok := agreedConfig(reps)
	if !ok {
		return nil
	}
	admin, err := redislimiter.NewAdmin(t.client, redislimiter.AdminConfig{Bucket: t.name, Rate: c.Rate, Burst: c.Burst})
	if err != nil {
		return err
	}
	t.admin, t.configured = admin, &c
	t.from = "reported by " + plural(len(reps), "live replica")
	return nil
}

// agreedConfig returns the configured limits every replica reports, if
// there is at least one replica and they all report the same known ones.
func agreedConfig(reps []redislimiter.Replica) (limitsJSON, bool) {
	if len(reps) == 0 || reps[0].Burst == 0 {
		return limitsJSON{}, false
	}
	for _, r := range reps[1:] {
		if r.Rate != reps[0].Rate || r.Burst != reps[0].Burst {
			return limitsJSON{}, false
		}
	}
	return limitsJSON{Rate: reps[0].Rate, Burst: reps[0].Burst}, true
}

// bucketStatus is the status of a bucket as printed, in text or JSON. A nil
// pointer is a value that cannot be known.
type bucketStatus struct {
	Bucket        string        `json:"bucket"`
	Tokens        *float64      `json:"tokens"`
	Rate          *float64      `json:"rate"`
	Burst         *int          `json:"burst"`
	Configured    *limitsJSON   `json:"configured"`
	Override      *overrideJSON `json:"override"`
	PausedSeconds float64       `json:"paused_seconds"`
	// PausedBy is who set the pause in force: a replica's id (a sink's
	// push-back) or "operator" ('bucket pause'); empty when not paused or
	// not recorded.
	PausedBy string        `json:"paused_by,omitempty"`
	Replicas []replicaJSON `json:"replicas"`
	// Warnings are configuration problems an operator should fix, such
	// as replicas whose configured rates differ.
	Warnings []string `json:"warnings"`
	// Adaptive is the adaptive rate (limit.adaptive) while a push-back
	// holds it below its ceiling; nil otherwise.
	Adaptive *adaptiveJSON `json:"adaptive"`
	// Warmup is the warm-up state (limit.warmup) while it matters; nil
	// otherwise.
	Warmup *warmupJSON `json:"warmup"`
	// Classes are the priority classes in the order of service.
	Classes []classJSON `json:"classes"`
	// Layers are the layers of limit.extra with the keys each has in use
	// (bucket status with --config); nil when unknown.
	Layers []layerJSON `json:"layers"`
	// TopRefused is, by layer, the keys it refused most over the last
	// minute (a shadow layer: would have refused), summed over the live
	// replicas' heartbeats: bounded and approximate (tops.go).
	TopRefused map[string][]keyCountJSON `json:"top_refused"`
	// Tenants is the top tenants of fair shares (limit.fair), from the
	// same heartbeats; nil when no replica reports any.
	Tenants *tenantsJSON `json:"tenants"`

	// baseRate is the rate once a pause ends, when known.
	baseRate *float64
	// raw and reps are what Redis answered, for the console's live view.
	raw  redislimiter.BucketStatus
	reps []redislimiter.Replica
}

// classJSON is one priority class (limit.priority) of a bucket.
type classJSON struct {
	Priority string `json:"priority"`
	// Reserved is the tokens the class holds reserved ahead; nil when the
	// tokens are unknown.
	Reserved *float64 `json:"reserved"`
	// Waiting is the class's messages waiting for tokens, summed over the
	// live replicas' last heartbeats.
	Waiting int `json:"waiting"`
}

// classesOf returns the classes of st in the order of service, with the
// waiting messages reps reported.
func classesOf(st redislimiter.BucketStatus, reps []redislimiter.Replica) []classJSON {
	out := make([]classJSON, 0, limiter.NumPriorities)
	for rank := range limiter.NumPriorities {
		p := backend.PriorityOfRank(rank)
		c := classJSON{Priority: p.String()}
		if st.TokensKnown {
			r := st.Reserved[p]
			c.Reserved = &r
		}
		for _, r := range reps {
			c.Waiting += r.WaitingByPriority[p]
		}
		out = append(out, c)
	}
	return out
}

// writeClasses prints the classes line of 'bucket status' while a class
// other than normal holds reservations or has messages waiting: a bucket
// whose replicas all use the default class shows none.
func writeClasses(w io.Writer, cs []classJSON) {
	used := false
	for _, c := range cs {
		if c.Priority != limiter.PriorityNormal.String() && (c.Waiting > 0 || (c.Reserved != nil && *c.Reserved > 0)) {
			used = true
		}
	}
	if !used {
		return
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		reserved := "? reserved"
		if c.Reserved != nil {
			reserved = strconv.FormatFloat(*c.Reserved, 'f', -1, 64) + " reserved"
		}
		parts[i] = fmt.Sprintf("%s %s, %d waiting", c.Priority, reserved, c.Waiting)
	}
	fmt.Fprintf(w, "  %-11s %s\n", "classes", strings.Join(parts, "; "))
}

type limitsJSON struct {
	Rate  float64 `json:"rate"`
	Burst int     `json:"burst"`
	// Shadow is set when the config file makes the bucket a shadow
	// (limit.shadow): decided and counted, never enforced.
	Shadow bool `json:"shadow,omitempty"`
}

// shadowNote marks a shadow shared bucket (limit.shadow) in the
// configured line of 'bucket status' and 'bucket watch'.
func shadowNote(c *limitsJSON) string {
	if c == nil || !c.Shadow {
		return ""
	}
	return ", SHADOW (limit.shadow: not enforced; its would-waits count as layer bucket, shadow=\"true\")"
}

// replicaJSON is a live replica. Configured is nil when its heartbeat did
// not carry its limits.
type replicaJSON struct {
	ID         string      `json:"id"`
	Configured *limitsJSON `json:"configured"`
	// Idle is set when its heartbeat says it consumes nothing, such as a
	// Kafka group member without partitions (limiter.Bucket.SetIdle).
	Idle bool `json:"idle"`
}

type overrideJSON struct {
	Rate float64 `json:"rate"`
	// Burst is nil when the override keeps each replica's configured burst.
	Burst *int `json:"burst"`
	// ExpiresInSeconds is nil when the override holds until cleared.
	ExpiresInSeconds *float64 `json:"expires_in_seconds"`
	// Ignored is true when Redis holds an override that is not a valid
	// rate and burst (written by another program, or an older throttle):
	// the replicas then use their configured limits. RawRate and RawBurst
	// are the values as Redis holds them, present only then.
	Ignored  bool   `json:"ignored,omitempty"`
	RawRate  string `json:"raw_rate,omitempty"`
	RawBurst string `json:"raw_burst,omitempty"`
}

// status reads the bucket, its override and its live replicas, as Redis
// holds them.
func (t *bucketTarget) status(ctx context.Context) (*bucketStatus, error) {
	st, err := t.admin.Status(ctx)
	if err != nil {
		return nil, err
	}
	reps, err := t.admin.Replicas(ctx)
	if err != nil {
		return nil, err
	}
	adaptive, err := readAdaptive(ctx, t.admin)
	if err != nil {
		return nil, err
	}
	warmup, err := readWarmup(ctx, t.admin, t.warmup)
	if err != nil {
		return nil, err
	}
	out := &bucketStatus{
		Adaptive:      adaptive,
		Warmup:        warmup,
		Classes:       classesOf(st, reps),
		TopRefused:    topRefused(reps, topJSON),
		Tenants:       topTenants(reps, topJSON),
		Bucket:        t.name,
		Configured:    t.configured,
		PausedSeconds: st.PausedFor.Seconds(),
		PausedBy:      st.PausedBy,
		Replicas:      make([]replicaJSON, 0, len(reps)),
		Warnings:      []string{},
		raw:           st,
		reps:          reps,
	}
	for _, r := range reps {
		rj := replicaJSON{ID: r.ID, Idle: r.Idle}
		if r.Burst > 0 {
			rj.Configured = &limitsJSON{Rate: r.Rate, Burst: r.Burst}
		}
		out.Replicas = append(out.Replicas, rj)
	}
	if o := st.Override; o != nil {
		oj := &overrideJSON{Rate: o.Rate, Ignored: o.Ignored}
		if o.Burst > 0 {
			b := o.Burst
			oj.Burst = &b
		}
		if o.ExpiresIn > 0 {
			s := o.ExpiresIn.Seconds()
			oj.ExpiresInSeconds = &s
		}
		if o.Ignored {
			oj.RawRate, oj.RawBurst = o.RawRate, o.RawBurst
		}
		out.Override = oj
	}
	// The script answers in thousandths of a token per second; the
	// override and the configured rate are exact.
	rate := st.Rate
	switch o := st.Override; {
	case o != nil && !o.Ignored:
		rate = o.Rate
	case t.configured != nil:
		rate = t.configured.Rate
	}
	if rate > 0 {
		out.Rate, out.baseRate = &rate, &rate
		if st.PausedFor > 0 {
			paused := 0.0
			out.Rate = &paused
		}
	}
	if st.Burst > 0 {
		burst := st.Burst
		out.Burst = &burst
	}
	if st.TokensKnown {
		tokens := st.Tokens
		out.Tokens = &tokens
	}
	out.Warnings = append(out.Warnings, configWarnings(out, t.from)...)
	if len(reps) == 0 && st.Override == nil && st.PausedFor == 0 {
		inUse, err := t.admin.InUse(ctx)
		if err != nil {
			return nil, err
		}
		if !inUse {
			out.Warnings = append(out.Warnings, fmt.Sprintf("nothing uses bucket %s now: Redis holds no state, no override and no live replica of it; "+
				"check the name (a typo?): 'bucket list' shows the buckets in use", t.name))
		}
	}
	if o := out.Override; o != nil && o.Ignored {
		out.Warnings = append(out.Warnings, fmt.Sprintf("Redis holds an override that is out of range (rate %q, burst %q), written by another program: "+
			"the replicas ignore it and use their configured limits; 'bucket set' or 'bucket set --clear' replaces it", o.RawRate, o.RawBurst))
	}
	return out, nil
}

// configWarnings reports live replicas whose configured limits differ from
// each other, where that changes the bucket, and from the config file.
func configWarnings(st *bucketStatus, from string) []string {
	groups := map[limitsJSON][]string{}
	var order []limitsJSON
	for _, r := range st.Replicas {
		if r.Configured == nil {
			continue
		}
		if _, ok := groups[*r.Configured]; !ok {
			order = append(order, *r.Configured)
		}
		groups[*r.Configured] = append(groups[*r.Configured], r.ID)
	}
	rates, bursts := map[float64]bool{}, map[int]bool{}
	for _, c := range order {
		rates[c.Rate], bursts[c.Burst] = true, true
	}
	describe := func(skip *limitsJSON) string {
		var parts []string
		for _, c := range order {
			if skip != nil && c == *skip {
				continue
			}
			parts = append(parts, fmt.Sprintf("%s burst %d on %s", formatRate(c.Rate), c.Burst, strings.Join(groups[c], ", ")))
		}
		return strings.Join(parts, "; ")
	}
	var out []string
	o := st.Override
	if o != nil && o.Ignored {
		o = nil // the replicas ignore it
	}
	if (len(rates) > 1 && o == nil) || (len(bursts) > 1 && (o == nil || o.Burst == nil)) {
		out = append(out, fmt.Sprintf("the live replicas are configured differently (%s): "+
			"without an override the bucket follows whichever replica asked last; "+
			"'bucket set' gives them one rate and burst", describe(nil)))
	}
	// Limits learned from the replicas agree with all of them: no warning.
	if c := st.Configured; c != nil {
		if others := describe(c); others != "" {
			out = append(out, fmt.Sprintf("%s configures %s burst %d, but live replicas run %s; "+
				"without an override the bucket follows whichever replica asked last", from, formatRate(c.Rate), c.Burst, others))
		}
	}
	return out
}

// writeStatus prints st for a person.
func writeStatus(w io.Writer, st *bucketStatus, from string) {
	line := func(k, format string, args ...any) { fmt.Fprintf(w, "  %-11s %s\n", k, fmt.Sprintf(format, args...)) }
	fmt.Fprintf(w, "Bucket %s\n", st.Bucket)
	const noConfig = "pass --config FILE to see it"
	switch {
	case st.Tokens != nil:
		line("tokens", "%s of %d", strconv.FormatFloat(*st.Tokens, 'f', -1, 64), *st.Burst)
	default:
		line("tokens", "unknown: the burst is in each replica's config; %s", noConfig)
	}
	switch {
	case st.baseRate == nil:
		line("rate", "each replica's configured rate; %s", noConfig)
	case st.PausedSeconds > 0:
		line("rate", "0/s while paused, then %s", formatRate(*st.baseRate))
	case st.Override != nil && !st.Override.Ignored:
		line("rate", "%s (the override)", formatRate(*st.Rate))
	default:
		line("rate", "%s (configured)", formatRate(*st.Rate))
	}
	if st.Burst != nil {
		line("burst", "%d", *st.Burst)
	}
	switch o := st.Override; {
	case o != nil && o.Ignored:
		line("override", "ignored: Redis holds rate %q, burst %q, out of range; each replica uses its configured limits", o.RawRate, o.RawBurst)
	case o != nil:
		line("override", "%s, %s, %s", formatRate(o.Rate), describeBurstPtr(o.Burst), describeExpiry(o.ExpiresInSeconds))
	default:
		line("override", "none: each replica uses its configured rate")
	}
	if c := st.Configured; c != nil {
		line("configured", "%s, burst %d (%s)%s", formatRate(c.Rate), c.Burst, from, shadowNote(c))
	} else {
		line("configured", "unknown; %s", noConfig)
	}
	if st.PausedSeconds > 0 {
		line("paused", "for %v more: %s", roundDuration(st.PausedSeconds), pauseCause(st.PausedBy))
	} else {
		line("paused", "no")
	}
	writeAdaptive(w, st.Adaptive)
	writeWarmup(w, st.Warmup)
	writeClasses(w, st.Classes)
	writeTops(w, st.TopRefused, st.Tenants)
	ids := make([]string, len(st.Replicas))
	idle := 0
	for i, r := range st.Replicas {
		ids[i] = r.ID
		if r.Configured == nil {
			ids[i] += " (limits not reported)"
		}
		if r.Idle {
			ids[i] += " (idle: consumes nothing)"
			idle++
		}
	}
	switch {
	case len(ids) == 0:
		line("replicas", "none alive")
	case idle > 0:
		line("replicas", "%d alive, %d idle: %s", len(ids), idle, strings.Join(ids, ", "))
	default:
		line("replicas", "%d alive: %s", len(ids), strings.Join(ids, ", "))
	}
	for _, w := range st.Warnings {
		line("warning", "%s", w)
	}
}

// formatRate formats a rate in tokens per second, such as "12.5/s". A rate
// below 1/s that is a whole number per minute, hour or day is shown so, as
// 'bucket set --rate' accepts it ("5/min"); other long fractions are
// rounded to 4 significant digits.
func formatRate(r float64) string {
	s := strconv.FormatFloat(r, 'f', -1, 64)
	if r >= 1 || len(s) <= 6 {
		return s + "/s"
	}
	for _, u := range []struct {
		name string
		secs float64
	}{{"min", 60}, {"h", 3600}, {"d", 86400}} {
		if n := r * u.secs; n >= 1 && math.Abs(n-math.Round(n)) < 1e-6 {
			return strconv.FormatFloat(math.Round(n), 'f', -1, 64) + "/" + u.name
		}
	}
	return strconv.FormatFloat(r, 'g', 4, 64) + "/s"
}

// pauseCause says who paused a bucket, from its PausedBy.
func pauseCause(by string) string {
	if by == redislimiter.PausedByOperator {
		return "an operator paused it ('bucket resume' ends it)"
	}
	return "a sink asked to slow down"
}

func describeBurst(b int) string {
	if b > 0 {
		return fmt.Sprintf("burst %d", b)
	}
	return "each replica's configured burst"
}

func describeBurstPtr(b *int) string {
	if b == nil {
		return describeBurst(0)
	}
	return describeBurst(*b)
}

func describeTTL(d time.Duration) string {
	if d > 0 {
		return "for " + d.String()
	}
	return "until cleared"
}

func describeExpiry(secs *float64) string {
	if secs == nil {
		return "until cleared"
	}
	return "expires in " + roundDuration(*secs).String()
}

func roundDuration(secs float64) time.Duration {
	d := time.Duration(secs * float64(time.Second))
	if d >= time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}
