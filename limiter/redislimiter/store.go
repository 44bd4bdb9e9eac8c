package redislimiter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/topk"
	"github.com/throttlehq/throttle/limiter"
)

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "throttle:"

// Config names a bucket and gives this replica's default rate and burst.
type Config struct {
	// Bucket is the bucket's name. Every replica with the same name (and
	// prefix) shares one rate. It must not be empty or contain braces.
	Bucket string
	// Rate is this replica's configured refill rate, in tokens per second.
	// An operator's override (SetOverride) wins over it.
	Rate float64
	// Burst is this replica's configured capacity. Default (0): one
	// second of tokens at Rate, at least 1.
	Burst int
	// Prefix is prepended to every key. Default DefaultPrefix.
	Prefix string
	// NoBatching sends every Take as its own script call. By default
	// (false) concurrent Takes are batched: a Take that finds no other in
	// flight is sent at once, alone, so a lone caller waits no longer than
	// without batching; Takes that arrive while one is in flight queue up
	// and are sent together as one pipeline (up to 128 scripts) as soon as
	// it returns. Each script still runs atomically on its own. Under load
	// this roughly halves the client and Redis CPU per Take, which is what
	// bounds a bucket without leasing. The price: a queued caller first
	// waits for the flight ahead of it, and a batch is bounded by the
	// client's read and write timeouts rather than by its callers'
	// context deadlines. Takes that ask for Extra tokens (lease refills)
	// are always sent alone: leasing already makes them rare, and batched
	// they reach Redis together, so that the later ones find the tokens
	// gone and return for more (measured: twice the Redis calls per token
	// on a saturated bucket). Refund, Pause and Status are never batched.
	NoBatching bool
	// Warmup is the bucket's warm-up period: on first use, and after the
	// bucket has gone without a take for longer than Warmup, it holds a
	// third of its burst and its rate ramps from a third of Rate to Rate
	// over Warmup (see the warm-up section of package limiter). Every
	// replica of the bucket should give the same value. 0 means none.
	Warmup time.Duration
}

// Client is what a Store and an Admin need of a Redis client: running
// scripts (the take script as a prepared command, through Process),
// pipelining them, and subscribing to the bucket's change channel.
// Every go-redis client satisfies it: *redis.Client (single node or
// Sentinel failover), *redis.ClusterClient and *redis.Ring.
type Client interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Store is a limiter.Store kept in Redis. It also implements
// backend.ReplicaTracker and backend.Notifier; Admin gives the operator
// commands.
//
// A Store is safe for concurrent use. It holds no connection of its own: it
// uses the client it was given, which may be a single-node, Sentinel
// (failover) or Cluster client. Batched Takes all name one bucket, so on a
// Cluster they go to one node in one pipeline.
type Store struct {
	client Client
	cfg    Config
	batch  *batcher // nil with Config.NoBatching
	admin  *Admin
	// stateKeys is {state, override}; allKeys adds replicas, configs and
	// idle.
	stateKeys []string
	allKeys   []string
	channel   string // Pub/Sub channel announcing changes, see Watch
	// rateArg and burstArg are the scripts' first two ARGV, boxed once
	// so that no call allocates for them.
	rateArg  any
	burstArg any
	// configArg is this replica's "rate burst", sent with each heartbeat.
	configArg string
	// warmArg is Config.Warmup in µs, the take script's ARGV[7].
	warmArg any
	// channelArg is channel, boxed: the take script's ARGV[11].
	channelArg any
	// takeHead is the start of a take's EVALSHA, up to its ARGV.
	takeHead []any
	// lastMaxWait is the last MaxWait argument, boxed.
	lastMaxWait atomic.Pointer[boxedInt]
	// lastShares is the last MinShare argument, boxed.
	lastShares atomic.Pointer[boxedShares]
}

// New returns a Store for one bucket. It makes no Redis call. A Burst of 0
// means backend.DefaultBurst(Rate). Errors in the parameters are
// *limiter.ParamError naming the Config field.
func New(client Client, cfg Config) (*Store, error) {
	if client == nil {
		return nil, &limiter.ParamError{Param: "client", Msg: "must not be nil"}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	k := newKeys(cfg.Prefix, cfg.Bucket)
	s := &Store{
		client:    client,
		cfg:       cfg,
		stateKeys: k.all[:2],
		allKeys:   k.all,
		channel:   k.channel,
		rateArg:   any(strconv.FormatFloat(cfg.Rate, 'g', -1, 64)),
		burstArg:  any(cfg.Burst),
		configArg: strconv.FormatFloat(cfg.Rate, 'g', -1, 64) + " " + strconv.Itoa(cfg.Burst),
		warmArg:   any(cfg.Warmup.Microseconds()),
	}
	s.channelArg = any(s.channel)
	s.admin = &Admin{client: client, name: cfg.Bucket, keys: k, rate: cfg.Rate, burst: cfg.Burst, rateArg: s.rateArg, burstArg: s.burstArg}
	s.takeHead = []any{"evalsha", takeScript.Hash(), len(s.stateKeys), s.stateKeys[0], s.stateKeys[1]}
	if !cfg.NoBatching {
		s.batch = &batcher{s: s}
	}
	return s, nil
}

// Validate returns the *limiter.ParamError of every field out of range,
// joined, each naming the Go field ("Bucket", "Rate", "Burst", "Warmup"),
// or nil: Bucket must pass ValidateBucketName, Rate must be above 0 and at
// most 1e9 tokens per second, Burst 0 (the default) or between 1 and
// 2^31-1, Warmup 0 (none) or between 1ms and 24h. New calls it; a program
// may call it to check its configuration before it has a client.
func (c Config) Validate() error {
	errs := []error{ValidateBucketName(c.Bucket), backend.ValidateRate(c.Rate)}
	if c.Burst != 0 {
		errs = append(errs, backend.ValidateBurst(c.Burst))
	}
	errs = append(errs, backend.ValidateWarmup(c.Warmup))
	return errors.Join(errs...)
}

// WithDefaults returns c with its defaults filled in: a Burst of 0 becomes
// one second of tokens at Rate (at least 1), an empty Prefix DefaultPrefix.
// A Rate that Validate rejects leaves Burst 0.
func (c Config) WithDefaults() Config {
	if c.Burst == 0 && backend.ValidateRate(c.Rate) == nil {
		c.Burst = backend.DefaultBurst(c.Rate)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	return c
}

// keys are the Redis keys and channel of one bucket.
type keys struct {
	all     []string // state, override, replicas, configs
	channel string
	// shadow holds the shadow shared bucket's state
	// (limiter.Options.Shadow, decided by Layered).
	shadow string
	// since holds when the layers' keys of their own were first written
	// after Redis held none of them (Layered.needsSince).
	since string
}

func newKeys(prefix, bucket string) keys {
	base := prefix + "{" + bucket + "}:"
	return keys{all: []string{base + "state", base + "override", base + "replicas", base + "configs", base + "idle"}, channel: base + "changes", shadow: base + "shadow", since: base + "layers-since"}
}

// Admin returns the operator commands for this store's bucket, knowing its
// configured rate and burst.
func (s *Store) Admin() *Admin { return s.admin }

// ValidateBucketName returns an error unless name can name a bucket: not
// empty, and without braces or white space, which would break the key's
// hash tag.
func ValidateBucketName(name string) error {
	if name == "" {
		return &limiter.ParamError{Param: "Bucket", Msg: "must not be empty"}
	}
	if strings.ContainsAny(name, "{} \t\r\n") {
		return &limiter.ParamError{Param: "Bucket", Msg: "must not contain braces or white space", Value: name}
	}
	return nil
}

// Keys returns the Redis keys of the bucket: state, override, replicas and
// configs.
func (s *Store) Keys() []string { return append([]string(nil), s.allKeys...) }

// Limits implements limiter.Store.
func (s *Store) Limits() (float64, int) { return s.cfg.Rate, s.cfg.Burst }

// Take implements limiter.Store with one script call, sent alone or in a
// pipeline with concurrent Takes (see Config.NoBatching). If ctx ends while
// the call waits for its batch, Take returns ctx.Err() at once, and tokens
// the batch granted it are refunded.
func (s *Store) Take(ctx context.Context, req backend.TakeRequest) (backend.TakeResult, error) {
	if req.Cost < 1 {
		return backend.TakeResult{}, fmt.Errorf("cost %d: %w", req.Cost, limiter.ErrInvalidCost)
	}
	if s.batch == nil || req.Extra > 0 { // see Config.NoBatching
		return s.take(ctx, 0, req)
	}
	return s.batch.take(ctx, req)
}

// take runs the take script alone. nowUS is the instant for the script, or
// 0 for Redis TIME.
func (s *Store) take(ctx context.Context, nowUS int64, req backend.TakeRequest) (backend.TakeResult, error) {
	if req.Cost < 1 {
		return backend.TakeResult{}, fmt.Errorf("cost %d: %w", req.Cost, limiter.ErrInvalidCost)
	}
	// The EVALSHA is built from arguments boxed once (see takeEvalSha),
	// and the reply is one string parsed without allocating: a lone Take
	// allocates about half of what Script.Run and Int64Slice would.
	cmd := takeEvalSha(ctx, s, req, nowUS)
	if err := s.client.Process(ctx, cmd); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = takeScript.Eval(ctx, s.client, s.stateKeys, s.takeArgs(req, nowUS)...)
	}
	return s.takeResult(req, cmd)
}

// takeArgs returns the ARGV of takeScript for req.
func (s *Store) takeArgs(req backend.TakeRequest, nowUS int64) []any {
	return s.appendTakeArgs(make([]any, 0, takeArgc), req, nowUS)
}

// takeArgc is the number of takeScript's ARGV.
const takeArgc = 12

// appendTakeArgs appends the ARGV of takeScript for req to args.
func (s *Store) appendTakeArgs(args []any, req backend.TakeRequest, nowUS int64) []any {
	args = append(args, s.rateArg, s.burstArg, req.Cost, max(req.Extra, 0), s.maxWaitArg(req.MaxWait))
	if nowUS == 0 && s.shortTake(req) {
		// The rest are what the script takes when they are absent (Redis
		// TIME, no warm-up, rank 1, no shares, the channel named after
		// the state key): fewer arguments cost Redis less (takeFastLua).
		return args
	}
	sh := s.sharesArg(req.MinShare)
	args = append(args, nowUS, s.warmArg, rankArgs[backend.Rank(req.Priority)], sh.boxed[1], sh.boxed[2], s.channelArg)
	if req.Hold > 0 {
		args = append(args, req.Hold.Microseconds())
	}
	return args
}

// shortTake reports whether a take of req at Redis's clock sends only the
// first five arguments (appendTakeArgs).
func (s *Store) shortTake(req backend.TakeRequest) bool {
	return s.cfg.Warmup == 0 && req.Priority == limiter.PriorityNormal && req.MinShare == (limiter.Shares{}) && req.Hold <= 0
}

// rankArgs are the ranks 0, 1, 2, boxed.
var rankArgs = [limiter.NumPriorities]any{0, 1, 2}

// boxedShares is a MinShare and its shares by rank as script arguments.
type boxedShares struct {
	shares limiter.Shares
	boxed  [limiter.NumPriorities]any
}

// sharesArg returns the shares of ranks 1 and 2 (normal and low) as script
// arguments, reusing those of the last call: a Bucket asks with the same
// shares every time.
func (s *Store) sharesArg(sh limiter.Shares) *boxedShares {
	if p := s.lastShares.Load(); p != nil && p.shares == sh {
		return p
	}
	p := &boxedShares{shares: sh}
	for rank := range p.boxed {
		p.boxed[rank] = strconv.FormatFloat(sh[backend.PriorityOfRank(rank)], 'g', -1, 64)
	}
	s.lastShares.Store(p)
	return p
}

// maxWaitArg returns d in microseconds as a script argument, reusing the
// boxed value of the last call: a Bucket asks with the same horizon almost
// every time.
func (s *Store) maxWaitArg(d time.Duration) any {
	us := d.Microseconds()
	if p := s.lastMaxWait.Load(); p != nil && p.us == us {
		return p.boxed
	}
	p := &boxedInt{us: us, boxed: us}
	s.lastMaxWait.Store(p)
	return p.boxed
}

// boxedInt is an integer and the same integer as an interface value.
type boxedInt struct {
	us    int64
	boxed any
}

// takeResult turns the take script's reply, or its error, into Take's
// answer. The reply is "granted tokens wait_us remaining_milli rate_milli
// burst now_us rank pushed_milli", granted being 1, 0, -1 when the cost
// exceeds the burst, or 2 when a lower class's MinShare refused the take.
func (s *Store) takeResult(req backend.TakeRequest, cmd *redis.Cmd) (backend.TakeResult, error) {
	if err := cmd.Err(); err != nil {
		return backend.TakeResult{}, s.fail("take", err)
	}
	if now, ok := cmd.Val().(int64); ok {
		if res, ok := s.fullAgainResult(req, now); ok {
			return res, nil
		}
		return backend.TakeResult{}, s.fail("take", fmt.Errorf("%w: %d", backend.ErrMalformedReply, now))
	}
	str, _ := cmd.Val().(string)
	if res, ok := s.fastTakeResult(req, str); ok {
		return res, nil
	}
	v, ok := parseInts9(str)
	if ok && (v[7] < 0 || v[7] > 2) {
		ok = false
	}
	if !ok {
		return backend.TakeResult{}, s.fail("take", fmt.Errorf("%w: %q", backend.ErrMalformedReply, cmd.Val()))
	}
	res := backend.TakeResult{
		Granted:   v[0] == 1,
		Tokens:    int(v[1]),
		Wait:      time.Duration(v[2]) * time.Microsecond,
		Remaining: float64(v[3]) / 1000,
		Rate:      float64(v[4]) / 1000,
		Burst:     int(v[5]),
		At:        time.UnixMicro(v[6]),
		Class:     backend.PriorityOfRank(int(v[7])),
		Pushed:    float64(v[8]) / 1000,
		Floor:     v[0] == 2,
	}
	if v[0] == -1 {
		return res, fmt.Errorf("cost %d, burst %d: %w", req.Cost, res.Burst, limiter.ErrCostExceedsBurst)
	}
	return res, nil
}

// parseInts9 parses exactly nine decimal integers separated by single
// spaces, each within ±1e15 as the scripts keep them.
func parseInts9(s string) (v [9]int64, ok bool) {
	return v, parseInts(s, v[:])
}

// parseInts parses exactly len(v) decimal integers separated by single
// spaces, each within ±1e15 as the scripts keep them, into v.
func parseInts(s string, v []int64) bool {
	i := 0
	for k := range v {
		if k > 0 {
			if i >= len(s) || s[i] != ' ' {
				return false
			}
			i++
		}
		neg := i < len(s) && s[i] == '-'
		if neg {
			i++
		}
		start := i
		var n int64
		for i < len(s) && s[i] >= '0' && s[i] <= '9' && i-start < 16 {
			n = n*10 + int64(s[i]-'0')
			i++
		}
		if i == start || (i < len(s) && s[i] >= '0' && s[i] <= '9') {
			return false
		}
		if neg {
			n = -n
		}
		v[k] = n
	}
	return i == len(s)
}

// Refund implements limiter.Store: the tokens of no class repay the
// front of the queue.
func (s *Store) Refund(ctx context.Context, tokens int) error {
	return s.refund(ctx, 0, tokens, limiter.PriorityHigh, false)
}

// RefundPast implements backend.PastRefunder: tokens whose instant has
// passed, such as an unused lease's, go back only while no reservation is
// queued, up to the burst.
func (s *Store) RefundPast(ctx context.Context, tokens int) error {
	return s.refund(ctx, 0, tokens, limiter.PriorityHigh, true)
}

// RefundClass implements backend.ClassRefunder.
func (s *Store) RefundClass(ctx context.Context, tokens int, class limiter.Priority) error {
	return s.refund(ctx, 0, tokens, class, false)
}

// refund runs refundScript; past drops the tokens while a reservation is
// queued (RefundPast).
func (s *Store) refund(ctx context.Context, nowUS int64, tokens int, class limiter.Priority, past bool) error {
	if tokens <= 0 {
		return nil
	}
	pastArg := 0
	if past {
		pastArg = 1
	}
	if err := refundScript.Run(ctx, s.client, s.stateKeys, s.rateArg, s.burstArg, tokens, nowUS, rankArgs[backend.Rank(class)], s.warmArg, pastArg).Err(); err != nil {
		return s.fail("refund", err)
	}
	return nil
}

// Pause implements limiter.Store.
func (s *Store) Pause(ctx context.Context, d time.Duration) error {
	return s.pause(ctx, 0, d, "")
}

// PauseBy implements backend.AttributedPauser: Pause, recording by as the
// replica that paused (Admin's BucketStatus.PausedBy, limiter.State.PausedBy).
func (s *Store) PauseBy(ctx context.Context, d time.Duration, by string) error {
	return s.pause(ctx, 0, d, by)
}

func (s *Store) pause(ctx context.Context, nowUS int64, d time.Duration, by string) error {
	if d <= 0 {
		return nil
	}
	if err := pauseScript.Run(ctx, s.client, s.stateKeys, s.rateArg, s.burstArg, d.Microseconds(), nowUS, s.channel, by).Err(); err != nil {
		return s.fail("pause", err)
	}
	return nil
}

// Drain implements limiter.Store.
func (s *Store) Drain(ctx context.Context, debt int) error {
	return s.drain(ctx, 0, debt)
}

func (s *Store) drain(ctx context.Context, nowUS int64, debt int) error {
	if err := drainScript.Run(ctx, s.client, s.stateKeys, s.rateArg, s.burstArg, max(debt, 0), nowUS, s.channel).Err(); err != nil {
		return s.fail("drain", err)
	}
	return nil
}

// Status implements limiter.Store. It also reports the runtime override and
// the live replica count.
func (s *Store) Status(ctx context.Context) (limiter.State, error) {
	return s.status(ctx, 0)
}

func (s *Store) status(ctx context.Context, nowUS int64) (limiter.State, error) {
	bs, err := s.admin.status(ctx, nowUS)
	if err != nil {
		return limiter.State{}, err
	}
	st := limiter.State{
		Tokens:          bs.Tokens,
		Rate:            bs.Rate,
		BaseRate:        bs.Rate,
		Burst:           bs.Burst,
		PausedFor:       bs.PausedFor,
		PausedBy:        bs.PausedBy,
		ConfiguredRate:  s.cfg.Rate,
		ConfiguredBurst: s.cfg.Burst,
		Replicas:        bs.Replicas,
		Reserved:        bs.Reserved,
		Pushed:          bs.Pushed,
		At:              bs.At,
		Changed:         bs.changed,
	}
	if bs.PausedFor > 0 {
		st.Rate = 0
	}
	if o := bs.Override; o != nil && !o.Ignored {
		st.Override = &backend.Override{Rate: o.Rate, Burst: o.Burst, ExpiresIn: o.ExpiresIn}
	}
	return st, nil
}

// Heartbeat implements backend.ReplicaTracker. With each beat the replica
// also records its configured rate and burst, which Replicas reports, so an
// operator can see replicas that disagree.
func (s *Store) Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, error) {
	return s.heartbeat(ctx, id, ttl, s.configArg, false)
}

// HeartbeatReport implements backend.ReportingTracker: Heartbeat, recording
// r with the configured limits, which Replicas reports.
func (s *Store) HeartbeatReport(ctx context.Context, id string, ttl time.Duration, r backend.ReplicaReport) (int, error) {
	return s.heartbeat(ctx, id, ttl, s.report(r), r.Idle)
}

// HeartbeatConsumers implements backend.ConsumerTracker: HeartbeatReport,
// also counting the live replicas whose last report was not Idle, in the
// same script call: the idle ones are kept in a sorted set of their own,
// so the count costs no more with a thousand replicas than with one.
func (s *Store) HeartbeatConsumers(ctx context.Context, id string, ttl time.Duration, r backend.ReplicaReport) (live, consuming int, err error) {
	v, err := heartbeatScript.Run(ctx, s.client, s.allKeys[2:], id, ttl.Microseconds(), 0, s.report(r), idleArg(r.Idle), "1").Int64Slice()
	if err != nil {
		return 0, 0, s.fail("heartbeat", err)
	}
	if len(v) != 2 {
		return 0, 0, s.malformed("heartbeat", v)
	}
	return int(v[0]), int(v[1]), nil
}

// report is the configs value of a heartbeat that carries r.
func (s *Store) report(r backend.ReplicaReport) string {
	mode := string(r.Mode)
	if mode == "" || strings.ContainsAny(mode, " \t\r\n") {
		mode = "-"
	}
	report := s.configArg + " " + mode + " " + strconv.FormatInt(r.Granted, 10) + " " + strconv.Itoa(r.Waiting)
	// Then one "x:LAYER:N" per layer that refused (a layer's name holds
	// no colon or white space), in name order.
	for _, layer := range slices.Sorted(maps.Keys(r.Exceeded)) {
		report += " x:" + layer + ":" + strconv.FormatInt(r.Exceeded[layer], 10)
	}
	// And "w:HIGH,NORMAL,LOW", the calls waiting in each class, while
	// any waits.
	if w := r.WaitingByPriority; w != ([limiter.NumPriorities]int{}) {
		report += " w:" + strconv.Itoa(w[limiter.PriorityHigh]) + "," + strconv.Itoa(w[limiter.PriorityNormal]) + "," + strconv.Itoa(w[limiter.PriorityLow])
	}
	// And "idle" while the replica consumes nothing.
	if r.Idle {
		report += " idle"
	}
	// And "b:READY,SETASIDE", the source's backlog, while known.
	if bl := r.Backlog; bl != nil {
		report += " b:" + strconv.FormatInt(bl.Ready, 10) + "," + strconv.FormatInt(bl.SetAside, 10)
	}
	// And the bounded top lists (topk.Entry, "KEY=N,KEY=N" with each key
	// query-escaped): "k:LAYER:..." per layer, the keys it refused most;
	// "t:TOTAL:...", the tenants granted the most tokens and the tokens of
	// every tenant; "q:...", the tenants with the most requests waiting.
	for _, layer := range slices.Sorted(maps.Keys(r.RefusedKeys)) {
		if top := r.RefusedKeys[layer]; len(top) > 0 {
			report += " k:" + layer + ":" + formatTop(top)
		}
	}
	if r.TenantTokensTotal > 0 {
		report += " t:" + strconv.FormatInt(r.TenantTokensTotal, 10) + ":" + formatTop(r.TenantTokens)
	}
	if len(r.TenantsWaiting) > 0 {
		report += " q:" + formatTop(r.TenantsWaiting)
	}
	return report
}

// formatTop writes a top list for a report: "KEY=N,KEY=N", each key
// query-escaped (so without white space, ',', '=' or ':').
func formatTop(top []topk.Entry) string {
	parts := make([]string, len(top))
	for i, e := range top {
		parts[i] = url.QueryEscape(e.Key) + "=" + strconv.FormatInt(e.Count, 10)
	}
	return strings.Join(parts, ",")
}

// parseTop parses what formatTop wrote; ok is false when it is malformed.
func parseTop(s string) (map[string]int64, bool) {
	out := map[string]int64{}
	if s == "" {
		return out, true
	}
	for _, part := range strings.Split(s, ",") {
		k, n, found := strings.Cut(part, "=")
		key, kerr := url.QueryUnescape(k)
		c, nerr := strconv.ParseInt(n, 10, 64)
		if !found || kerr != nil || nerr != nil || key == "" || c < 0 {
			return nil, false
		}
		out[key] += c
	}
	return out, true
}

func (s *Store) heartbeat(ctx context.Context, id string, ttl time.Duration, config string, idle bool) (int, error) {
	n, err := heartbeatScript.Run(ctx, s.client, s.allKeys[2:], id, ttl.Microseconds(), 0, config, idleArg(idle)).Int()
	if err != nil {
		return 0, s.fail("heartbeat", err)
	}
	return n, nil
}

// idleArg is the heartbeat script's idle argument.
func idleArg(idle bool) string {
	if idle {
		return "1"
	}
	return "0"
}

// Leave implements backend.ReplicaTracker.
func (s *Store) Leave(ctx context.Context, id string) error {
	if err := leaveScript.Run(ctx, s.client, s.allKeys[2:], id).Err(); err != nil {
		return s.fail("leave", err)
	}
	return nil
}

func (s *Store) fail(op string, err error) error {
	return storeError(op, s.cfg.Bucket, err)
}

func (s *Store) malformed(op string, v []int64) error {
	return s.fail(op, fmt.Errorf("%w: %d values %v", backend.ErrMalformedReply, len(v), v))
}

var _ limiter.Store = (*Store)(nil)
var _ backend.ReplicaTracker = (*Store)(nil)
var _ backend.AttributedPauser = (*Store)(nil)
var _ backend.ReportingTracker = (*Store)(nil)
var _ backend.ConsumerTracker = (*Store)(nil)
var _ backend.ClassRefunder = (*Store)(nil)
var _ backend.PastRefunder = (*Store)(nil)

// Buckets returns the names of the buckets that have keys in Redis under
// prefix (DefaultPrefix when empty), sorted. A bucket has keys while it is
// not full, has an override or a pause, or has live replicas; a full, idle
// bucket that no replica runs has none, and is not listed. Buckets scans the
// keyspace (SCAN, on every master of a Cluster client), so it suits an
// operator's command, not a hot path. It is safe for concurrent use.
func Buckets(ctx context.Context, client redis.UniversalClient, prefix string) ([]string, error) {
	if client == nil {
		return nil, &limiter.ParamError{Param: "client", Msg: "must not be nil"}
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	match := globEscaper.Replace(prefix) + "{*}:*"
	var (
		mu    sync.Mutex
		names = map[string]bool{}
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			rest, ok := strings.CutPrefix(iter.Val(), prefix+"{")
			if !ok || strings.HasSuffix(rest, paidSecretSuffix) { // kept while the bucket is idle too
				continue
			}
			if name, _, ok := strings.Cut(rest, "}:"); ok && ValidateBucketName(name) == nil {
				mu.Lock()
				names[name] = true
				mu.Unlock()
			}
		}
		return iter.Err()
	}
	if err := forEachPrimary(ctx, client, scan); err != nil {
		return nil, fmt.Errorf("listing the buckets under %q: %w: %w", prefix, limiter.ErrStore, err)
	}
	return slices.Sorted(maps.Keys(names)), nil
}

// forEachPrimary runs fn on every master of a Cluster client, concurrently,
// or once on any other client.
func forEachPrimary(ctx context.Context, client redis.UniversalClient, fn func(context.Context, redis.Cmdable) error) error {
	if cc, ok := client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return fn(ctx, c) })
	}
	return fn(ctx, client)
}

// globEscaper escapes the characters that Redis's SCAN MATCH treats as
// pattern syntax.
var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
