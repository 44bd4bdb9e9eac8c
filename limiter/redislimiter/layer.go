package redislimiter

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// Layered is a backend.LayeredStore in Redis: a Store's shared bucket plus
// further layers (keyed buckets and calendar quotas; see limiter.Layer).
//
// On one Redis node, or a Sentinel-managed master, one script decides the
// shared bucket and every layer atomically: one round trip per message, all
// layers charged or none.
//
// On a Redis Cluster (a *redis.ClusterClient), the state of each key of a
// keyed layer lives in the key's own slot, so that a million recipients
// spread over every master. A request then takes one step per slot group,
// in order: first the shared bucket with the layers that have no key (the
// bucket's {NAME} slot), then each keyed layer. Each step is atomic and
// charges only if all its layers grant; when a later step refuses, the
// earlier ones are refunded. Nothing is over-granted: every token a message
// uses was charged on every layer. What Cluster gives up is the single
// atomic instant: between a step and the refund of a refused message, the
// tokens of the earlier steps look taken, so another message may wait or be
// refused that a single script would have granted (under-granting, bounded
// by one round trip), and a refund lost to a failure loses those tokens
// until the bucket refills.
//
// # Keys
//
// Besides the Store's keys, layer L of bucket NAME uses
//
//	PREFIX ID S           hash, a keyed token bucket's shard: per key in use (field: 6
//	                      bytes of HASH), its tokens, ts and last send instant as
//	                      three little-endian doubles (see bucketLoc)
//	PREFIX ID HASH        per key: a keyed quota's "window_end used", a concurrency
//	                      layer's leases
//	PREFIX{NAME}:layer:L  the same, for a layer without keys (in the bucket's slot)
//
// (PREFIX and NAME as in the Store; no space between them). A keyed
// layer's key is PREFIX and 12 bytes: ID, 4 bytes that name the layer, and HASH, 8
// bytes of the SHA-256 of the key's readable name, PREFIX NAME:L:{KEY}
// (see layerKey). A shadow shared bucket (limiter.Options.Shadow) keeps
// its state, a layer bucket's, in PREFIX{NAME}:shadow. A shadow layer
// (limiter.Layer.Shadow) keeps its state under keys of its own (its
// readable names PREFIX NAME:shadow:L:{KEY} and PREFIX{NAME}:shadow:L), so
// that it charges nothing an enforced layer of the same name reads, and
// enforcing it later starts from a full bucket. A keyed
// bucket's state goes when the bucket is full again (its shard's TTL is
// the latest of its buckets', and a bucket added to a shard sweeps it of
// those full again), a quota's one second after its window ends, so only
// keys in use hold memory.
//
// A Layered is safe for concurrent use.
type Layered struct {
	*Store
	layers  []limiter.Layer
	cluster bool
	// keyPrefix[i] is PREFIX and the layer's ID, the first bytes of
	// every key of keyed layer i (layerKey); keyName[i] + key + "}" is what the
	// rest of a key's name is hashed from; unkeyed[i] names the state of
	// layer i without keys.
	keyPrefix []string
	keyName   []string
	unkeyed   []string
	// spec[i] are layer i's constant arguments of layersScript: index,
	// kind, rate or quota, burst, action, max_wait_us.
	spec [][]any
	// windows caches each quota's boundaries around the last instant.
	windows []atomic.Pointer[[4]int64]
	// allLayers lists every layer's index: the one step on a single node.
	allLayers []int
	// hasWindow is set when a layer is a send window.
	hasWindow bool
	// batch pipelines concurrent takes, and the releases of concurrency
	// slots; nil with Config.NoBatching. On a Cluster it takes only the
	// requests of clusterStep.
	batch *layerBatcher
	// clusterStep, on a Cluster, is the one step of a request that leaves
	// the shared bucket out (leased), when that step is keyedOnly: its
	// calls go through batch, one script call per master for the requests
	// whose keys it holds (layerBatcher.sendCluster). nil when there is no
	// such step.
	clusterStep *step
	// noCrossSlot is set once a Cluster's master refused
	// layersKeyedClusterScript for its flags (a Redis before 7): the
	// batch then sends one call per request. Shared by the copies of
	// WithFair.
	noCrossSlot *atomic.Bool
	// fair is nil without fair shares (WithFair); fairShards[fairShard(
	// TENANT)] holds a tenant's state, fairTotals the class totals and
	// the bins.
	fair       *limiter.Fair
	fairShards []string
	fairTotals string
	fairArg    int64
	// slots is set when a layer is a concurrency layer (layer_slots.go).
	slots bool
	// shadow is set when a layer is a shadow layer.
	shadow bool
	// shadowKey holds the state of the shadow shared bucket
	// (limiter.Options.Shadow).
	shadowKey string
	// sinceKey holds when the layers' keys of their own were first
	// written after Redis held none of them (needsSince).
	sinceKey string
}

// WithFair returns a copy of l that also shares the shared bucket among
// tenants by weight while it is saturated (see limiter.Fair): a request
// names its tenant in LayerRequest.Tenant, and the same script call decides
// its share. f is validated and copied. The tenants' state lives in the
// bucket's slot:
//
//	PREFIX{NAME}:fairt:S  hash, S the tenant's shard (0..255): per active tenant "held last span"
//	PREFIX{NAME}:fairw    hash: each class's active tenants and weights, and when they stop counting
//
// each expiring a second after the last reservation it tracks
// (docs/design.md, "Redis keys").
func (l *Layered) WithFair(f limiter.Fair) (*Layered, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	ws := make(map[string]float64, len(f.Weights))
	for k, v := range f.Weights {
		ws[k] = v
	}
	f.Weights = ws
	c := *l
	if l.batch != nil {
		c.batch = &layerBatcher{l: &c, byMaster: l.batch.byMaster}
	}
	c.fair = &f
	base := l.cfg.Prefix + "{" + l.cfg.Bucket + "}:fair"
	c.fairShards = make([]string, fairShards)
	for i := range c.fairShards {
		c.fairShards[i] = base + "t:" + strconv.Itoa(i)
	}
	c.fairTotals = base + "w"
	c.fairArg = f.Horizon.Microseconds()
	return &c, nil
}

// fairShards is the number of hashes the tenants' states are spread over:
// up to about 128 tenants each (some 30,000 in all), a hash stays a
// listpack, where a tenant costs its field and value and little more.
const fairShards = 256

// fairShard returns the shard of tenant's state: FNV-1a (32 bits) modulo
// fairShards.
func fairShard(tenant string) int {
	h := uint32(2166136261)
	for i := 0; i < len(tenant); i++ {
		h ^= uint32(tenant[i])
		h *= 16777619
	}
	return int(h % fairShards)
}

// Fair implements backend.FairStore.
func (l *Layered) Fair() *limiter.Fair { return l.fair }

// WithLayers returns a layered store on s's bucket. The layers are
// validated (see backend.ValidateLayers) and copied. It makes no Redis
// call. A Cluster client (*redis.ClusterClient) makes the store spread keyed
// state over the masters, deciding in steps (see Layered).
func (s *Store) WithLayers(layers []limiter.Layer) (*Layered, error) {
	layers = append([]limiter.Layer(nil), layers...)
	if err := backend.ValidateLayers(layers); err != nil {
		return nil, err
	}
	_, cluster := s.client.(*redis.ClusterClient)
	l := &Layered{
		Store:       s,
		layers:      layers,
		cluster:     cluster,
		keyPrefix:   make([]string, len(layers)),
		keyName:     make([]string, len(layers)),
		unkeyed:     make([]string, len(layers)),
		spec:        make([][]any, len(layers)),
		windows:     make([]atomic.Pointer[[4]int64], len(layers)),
		shadowKey:   newKeys(s.cfg.Prefix, s.cfg.Bucket).shadow,
		sinceKey:    newKeys(s.cfg.Prefix, s.cfg.Bucket).since,
		noCrossSlot: new(atomic.Bool),
	}
	if !s.cfg.NoBatching {
		l.batch = &layerBatcher{l: l, byMaster: layersKeyedClusterScript}
	}
	l.slots = backend.HasConcurrency(layers)
	for i, ly := range layers {
		l.allLayers = append(l.allLayers, i)
		l.shadow = l.shadow || ly.Shadow
		l.hasWindow = l.hasWindow || ly.IsWindow()
		l.keyName[i] = s.cfg.Prefix + s.cfg.Bucket + ":" + ly.Name + ":{"
		l.unkeyed[i] = s.cfg.Prefix + "{" + s.cfg.Bucket + "}:layer:" + ly.Name
		if ly.Shadow {
			l.keyName[i] = s.cfg.Prefix + s.cfg.Bucket + ":shadow:" + ly.Name + ":{"
			l.unkeyed[i] = s.cfg.Prefix + "{" + s.cfg.Bucket + "}:shadow:" + ly.Name
		}
		id := sha256.Sum256([]byte(l.keyName[i]))
		l.keyPrefix[i] = s.cfg.Prefix + string(id[:layerIDLen])
		kind, a, b := "b", strconv.FormatFloat(ly.Rate, 'g', -1, 64), int64(ly.Burst)
		switch {
		case ly.IsQuota():
			kind, a, b = "q", strconv.Itoa(ly.Quota), 0
		case ly.IsConcurrency():
			kind, a, b = "c", strconv.Itoa(ly.Concurrency), ly.Lease.Microseconds()
		case ly.IsBudget(): // the request's price goes in the burst's place
			kind, a, b = "m", strconv.FormatInt(int64(ly.Budget), 10), 0
		case ly.IsWindow(): // no state: the open intervals come per request
			kind, a, b = "o", "0", 0
		}
		action := map[limiter.Action]string{limiter.ActionWait: "w", limiter.ActionDeadLetter: "d", limiter.ActionDelay: "y"}[ly.OnExceed]
		if ly.Shadow {
			action = strings.ToUpper(action) // lua/layers.lua
		}
		l.spec[i] = []any{i + 1, kind, a, b, action, ly.MaxWait.Microseconds()}
	}
	if st := l.steps(true, false); cluster && len(st) == 1 && l.keyedOnly(st[0]) {
		l.clusterStep = &st[0]
	}
	return l, nil
}

// Layers implements backend.LayeredStore.
func (l *Layered) Layers() []limiter.Layer { return append([]limiter.Layer(nil), l.layers...) }

// layerIDLen and layerHashLen are the lengths in bytes of a keyed layer
// key's two parts (layerKey).
const layerIDLen, layerHashLen = 4, 8

// layerKey returns the Redis key that holds the state of key in layer i:
// for a keyed layer, PREFIX then 12 bytes, the layer's ID (the first 4
// bytes of the SHA-256 of "PREFIX NAME:LAYER:{") then the first 8 bytes
// of the SHA-256 of "PREFIX NAME:LAYER:{KEY}" (no space between PREFIX and
// NAME; a shadow layer has "shadow:" before LAYER). The prefix keeps every
// key of the bucket under Config.Prefix, for Redis ACL key patterns and
// SCAN; the hash costs Redis 16 bytes where a recipient's readable name
// cost 64 to 96, and on a Cluster the key's slot is the hash's: the keys
// spread over the masters. Two keys of a layer share a state only if 64
// bits of their hashes collide (about 3 in a million for 10 million keys
// in use at once); they then share one bucket, each granted less, never
// more.
func (l *Layered) layerKey(i int, key string) string {
	if !l.layers[i].Keyed || l.layers[i].IsWindow() { // a window keeps no state
		return l.unkeyed[i]
	}
	sum := l.keyHash(i, key)
	var buf [64]byte
	return string(append(append(buf[:0], l.keyPrefix[i]...), sum[:layerHashLen]...))
}

// keyHash returns the SHA-256 of key's readable name in layer i (see
// layerKey), hashed from a buffer on the stack for a name of up to 128
// bytes: no allocation.
func (l *Layered) keyHash(i int, key string) [sha256.Size]byte {
	var buf [128]byte
	b := append(append(append(buf[:0], l.keyName[i]...), key...), '}')
	return sha256.Sum256(b)
}

// layerShardBits is how many bits of a keyed token bucket's hash name its
// shard: 2^15 hashes per layer. With Redis's default
// hash-max-listpack-entries (512) they stay listpacks up to some 10
// million buckets in use (about 305 each, far from 512), where a bucket
// costs its field and value and little more; from 100,000 buckets in use
// up, the shards' own keys cost less than the buckets (docs/layers.md,
// "Memory").
const layerShardBits = 15

// sharded reports whether layer i keeps its keys' states in shards
// (bucketLoc): a keyed token bucket.
func (l *Layered) sharded(i int) bool {
	ly := l.layers[i]
	return ly.Keyed && ly.IsBucket()
}

// bucketLoc returns where the state of key in layer i lives: for a keyed
// token bucket, its shard, a hash whose name is PREFIX, the layer's ID and
// 2 bytes holding layerShardBits of the key's hash (layerKey's HASH), and
// its field, the last 6 bytes of that hash; for any other layer, its key
// (layerKey) and "". The shard's name is shorter than a key of its own
// (PREFIX, ID and 8 bytes) and so never the name of one: a state written
// by an older binary is not read (docs/operations.md, "Upgrades"). Two
// keys of a layer share a state only if 63 bits of their hashes collide.
func (l *Layered) bucketLoc(i int, key string) (string, string) {
	if !l.sharded(i) {
		return l.layerKey(i, key), ""
	}
	h := l.keyHash(i, key)
	var buf [64]byte
	b := append(append(buf[:0], l.keyPrefix[i]...), h[0]&(1<<(layerShardBits-8)-1), h[1])
	return string(b), string(h[2:layerHashLen])
}

// layerKeys are the KEYS of a layer script and, in fields, the field of
// each in the scripts' format (lua/layer_prelude.lua, key_fields): its
// length in one byte, then its bytes; 0 for a key of its own.
type layerKeys struct {
	keys   []string
	fields []byte
}

// add appends a key of its own.
func (k *layerKeys) add(keys ...string) {
	for _, key := range keys {
		k.keys = append(k.keys, key)
		k.fields = append(k.fields, 0)
	}
}

// addLayer appends where the state of key in layer i lives (bucketLoc).
func (k *layerKeys) addLayer(l *Layered, i int, key string) {
	rk, f := l.bucketLoc(i, key)
	k.keys = append(k.keys, rk)
	k.fields = append(k.fields, byte(len(f)))
	k.fields = append(k.fields, f...)
}

// window returns the boundaries of layer i's quota windows around now, in
// µs, from a cache while now stays in the same window.
func (l *Layered) window(i int, now time.Time) [4]int64 {
	us := now.UnixMicro()
	if w := l.windows[i].Load(); w != nil && us >= w[1] && us < w[2] {
		return *w
	}
	ly := l.layers[i]
	b := backend.QuotaWindows(ly.Per, now, ly.Location)
	w := [4]int64{b[0].UnixMicro(), b[1].UnixMicro(), b[2].UnixMicro(), b[3].UnixMicro()}
	l.windows[i].Store(&w)
	return w
}

// step is one atomic script call: the shared bucket or not (or its shadow,
// LayerRequest.ShadowShared), and some layers.
type step struct {
	shared bool
	shadow bool
	layers []int
}

// firstStep returns the step of req that holds the shared bucket on a
// single node: every layer.
func (l *Layered) firstStep(req backend.LayerRequest) step {
	return step{shared: !req.SkipShared, shadow: req.SkipShared && req.ShadowShared, layers: l.allLayers}
}

// steps returns the script calls for one request: one on a single node, one
// per slot group on a Cluster. shadow decides the shadow shared bucket in
// the first step (a take's; a refund or a move leaves it as charged).
func (l *Layered) steps(skipShared, shadow bool) []step {
	if !l.cluster {
		return []step{{shared: !skipShared, shadow: skipShared && shadow, layers: l.allLayers}}
	}
	out := []step{{shared: !skipShared, shadow: skipShared && shadow}}
	for i, ly := range l.layers {
		if ly.Keyed && !ly.IsWindow() { // a window has no state to spread
			out = append(out, step{layers: []int{i}})
		} else {
			out[0].layers = append(out[0].layers, i)
		}
	}
	if !out[0].shared && !out[0].shadow && len(out[0].layers) == 0 {
		out = out[1:]
	}
	return out
}

// TakeLayers implements backend.LayeredStore with one script call on a
// single node or Sentinel master, batched with concurrent calls into one
// pipeline as Store.Take is (see Config.NoBatching); see Layered for a
// Cluster.
func (l *Layered) TakeLayers(ctx context.Context, req backend.LayerRequest) (backend.LayerResult, error) {
	return l.takeLayers(ctx, time.Time{}, req)
}

// takeLayers runs the take at the instant at, or at Redis TIME when at is
// zero.
func (l *Layered) takeLayers(ctx context.Context, at time.Time, req backend.LayerRequest) (backend.LayerResult, error) {
	if req.Cost < 1 {
		return backend.LayerResult{}, fmt.Errorf("cost %d: %w", req.Cost, limiter.ErrInvalidCost)
	}
	keys, err := backend.LayerKeys(l.layers, req)
	if err != nil {
		return backend.LayerResult{}, err
	}
	if req.Holder == "" && l.slots {
		return backend.LayerResult{}, limiter.ErrMissingHolder
	}
	if err := l.checkWindows(at, req, keys); err != nil {
		return backend.LayerResult{}, err
	}
	if at.IsZero() && l.batch != nil && (!l.cluster || (req.SkipShared && !req.ShadowShared && l.clusterStep != nil)) {
		return l.batch.take(ctx, req, keys)
	}
	steps := l.steps(req.SkipShared, req.ShadowShared)
	var (
		out  backend.LayerResult
		done []step
	)
	for _, st := range steps {
		// A step after the shared bucket's decides its layers for the
		// instant the shared bucket's reservation is due.
		res, err := l.takeStep(ctx, at, req, keys, st, out.Wait)
		if err == nil && res.Granted {
			if len(done) == 0 || st.shared {
				wait := out.Wait
				out.TakeResult = res.TakeResult
				out.Wait = wait
				out.FairActive = res.FairActive
			}
			if res.Wait > out.Wait || (len(done) == 0 && res.Limiting != "") {
				out.Wait, out.Limiting = res.Wait, res.Limiting
			}
			out.LayersDue = max(out.LayersDue, res.LayersDue)
			out.Shadow = append(out.Shadow, res.Shadow...)
			done = append(done, st)
			continue
		}
		// A later step refused: give back what the earlier ones charged,
		// the shared tokens leased with the message included.
		for _, d := range done {
			if rerr := l.refundStep(context.WithoutCancel(ctx), at, req, keys, d, out.At.Add(out.Wait), out.Class, out.Tokens-req.Cost); rerr != nil && err == nil {
				err = rerr
			}
		}
		if st.shared || len(done) == 0 {
			return res, err
		}
		res.TakeResult.Remaining, res.TakeResult.Rate, res.TakeResult.Burst = out.Remaining, out.Rate, out.Burst
		return res, err
	}
	out.Granted = true
	if out.Tokens < req.Cost { // the first step granted had no shared bucket
		out.Tokens = req.Cost
	}
	return out, nil
}

// takeStep runs layersScript, or layersKeyedScript, for one step. A step
// without the shared bucket decides its layers for the instant base after
// the store's clock: when the message goes out, as the shared bucket's
// step or the lease decided it.
func (l *Layered) takeStep(ctx context.Context, at time.Time, req backend.LayerRequest, keys []string, st step, base time.Duration) (backend.LayerResult, error) {
	if l.keyedOnly(st) { // the cheaper script (layer_keyed.go)
		return l.takeKeyed(ctx, at, req, keys, st, base)
	}
	rkeys, args, clock := l.takeArgs(at, req, keys, st, base)
	v, err := layersScript.Run(ctx, l.client, rkeys, args...).Int64Slice()
	return l.takeReply(req, v, err, clock)
}

// takeArgs returns the KEYS and ARGV of layersScript for one step, and the
// local clock the quota windows were computed around.
func (l *Layered) takeArgs(at time.Time, req backend.LayerRequest, keys []string, st step, base time.Duration) ([]string, []any, time.Time) {
	nowUS := int64(0)
	clock := at
	if at.IsZero() {
		clock = time.Now()
	} else {
		nowUS = at.UnixMicro()
	}
	var rk layerKeys
	args := make([]any, 0, 19+10*len(st.layers))
	shared := "0"
	if st.shared {
		shared = "1"
		rk.add(l.stateKeys...)
	} else if st.shadow {
		shared = "2" // its own state, the bucket's override
		rk.add(l.shadowKey, l.stateKeys[1])
	}
	extra := 0
	if st.shared { // on a Cluster, a refused later step refunds the extra too
		extra = max(req.Extra, 0)
	}
	sh := l.sharesArg(req.MinShare)
	horizon := max(req.MaxWait, 0) // without the shared bucket: base
	if !st.shared {
		horizon = max(base, 0)
	}
	args = append(args, nowUS, req.Cost, horizon.Microseconds(), shared, l.rateArg, l.burstArg, len(st.layers), extra,
		rankArgs[backend.Rank(req.Priority)], sh.boxed[1], sh.boxed[2], l.channelArg)
	for _, i := range st.layers {
		rk.addLayer(l, i, keys[i])
		ly := l.layers[i]
		switch {
		case ly.IsBudget(): // the price in the burst's place
			args = append(args, l.spec[i][:3]...)
			args = append(args, int64(req.Price))
			args = append(args, l.spec[i][4:]...)
		default:
			args = append(args, l.spec[i]...)
		}
		switch {
		case ly.IsQuota() || ly.IsBudget():
			w := l.window(i, clock)
			args = append(args, w[0], w[1], w[2], w[3])
		case ly.IsConcurrency():
			args = append(args, req.Holder, 0, 0, 0)
		case ly.IsWindow():
			// checkWindows made sure the key is a number; the spans
			// are cached.
			spans, _ := backend.WindowSpans(ly, keys[i], req.Priority, clock)
			args = append(args, backend.FormatSpans(spans), 0, 0, 0)
		default:
			args = append(args, 0, 0, 0, 0)
		}
	}
	args = append(args, l.warmArg) // the shared bucket's warm-up (lua/warmup.lua)
	args = append(args, l.paidArg(st.layers, keys, req.Paid))
	rkeys := rk.keys
	if st.shared && l.fair != nil && req.Tenant != "" {
		rkeys = append(rkeys, l.fairShards[fairShard(req.Tenant)], l.fairTotals)
		args = append(args, l.fair.Weight(req.Tenant), l.fairArg, strconv.Itoa(backend.Rank(req.Priority))+req.Tenant)
	} else {
		args = append(args, "", "", "")
	}
	args = append(args, string(rk.fields)) // the layers' fields, after the fair share's
	if l.needsSince(st.layers) {
		rkeys = append(rkeys, l.sinceKey)
	}
	return rkeys, args, clock
}

// needsSince reports whether any of layers is a token bucket with
// ActionDelay in a key of its own (no keys): layersScript then gets the
// bucket's since key (lua/layer_prelude.lua, SINCE_KEY), which tells a
// slot booked on such a key before Redis lost the key from one booked
// after.
func (l *Layered) needsSince(layers []int) bool {
	for _, i := range layers {
		if ly := l.layers[i]; !l.sharded(i) && ly.IsBucket() && ly.OnExceed == limiter.ActionDelay && !ly.Shadow {
			return true
		}
	}
	return false
}

// checkWindows returns the error of a window layer's key that is not a
// telephone number when the window needs one (a *limiter.LimitError with
// ActionDeadLetter).
func (l *Layered) checkWindows(at time.Time, req backend.LayerRequest, keys []string) error {
	if at.IsZero() {
		at = time.Now()
	}
	for i, ly := range l.layers {
		if ly.IsWindow() && !ly.Shadow { // a shadow window never refuses: open
			if _, err := backend.WindowSpans(ly, keys[i], req.Priority, at); err != nil {
				return err
			}
		}
	}
	return nil
}

// paidArg returns the paid layers' argument of the layer scripts for the
// layers of one step: for each layer, separated by spaces, the last
// instant in µs on Redis's clock at which the request passes it on a slot
// it paid for (backend.PaidUntil) and, after colons, the slot's Due and
// the instant it was booked (0 for a slot without it), which the layer's
// state must still hold (backend.PaidHeld); or 0; "" when no layer has
// one. The script compares them with its own time, as it does every
// decision: the slot's instants are on Redis's clock, and a replica's
// clock may be off by more than the lateness a slot is allowed.
func (l *Layered) paidArg(layers []int, keys []string, paid []limiter.PaidSlot) string {
	slots := backend.PaidSlots(l.layers, keys, paid)
	if slots == nil {
		return ""
	}
	b := make([]byte, 0, 52*len(layers))
	for j, i := range layers {
		if j > 0 {
			b = append(b, ' ')
		}
		s := slots[i]
		until := backend.PaidSlotUntil(l.layers[i], s)
		if until.IsZero() {
			b = append(b, '0')
			continue
		}
		b = strconv.AppendInt(b, until.UnixMicro(), 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, s.Due.UnixMicro(), 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, backend.PaidBookedMicro(s), 10)
	}
	return string(b)
}

// layerKeyOf returns the request's key in layer ly: "" for a layer without
// keys.
func layerKeyOf(ly limiter.Layer, req backend.LayerRequest) string {
	if !ly.Keyed {
		return ""
	}
	return req.Keys[ly.Name]
}

// takeReply turns layersScript's reply, or its error, into a LayerResult.
func (l *Layered) takeReply(req backend.LayerRequest, v []int64, err error, clock time.Time) (backend.LayerResult, error) {
	if err != nil {
		return backend.LayerResult{}, l.fail("take layers", err)
	}
	if len(v) < 12 || (len(v)-12)%3 != 0 || v[8] < 0 || v[8] > 2 {
		return backend.LayerResult{}, l.malformed("take layers", v)
	}
	res := backend.LayerResult{TakeResult: backend.TakeResult{
		Wait:      time.Duration(v[1]) * time.Microsecond,
		Remaining: float64(v[3]) / 1000,
		Rate:      float64(v[4]) / 1000,
		Burst:     int(v[5]),
		At:        time.UnixMicro(v[6]),
		Class:     backend.PriorityOfRank(int(v[8])),
		Pushed:    float64(v[9]) / 1000,
	}, FairActive: int(v[11])}
	var layer limiter.Layer
	if v[2] == -1 && v[0] == 0 {
		res.Limiting = backend.FairLayer
		res.FairSpacing = time.Duration(v[10]) * time.Microsecond
	} else if v[2] > 0 {
		if int(v[2]) > len(l.layers) {
			return backend.LayerResult{}, l.malformed("take layers", v)
		}
		layer = l.layers[v[2]-1]
		res.Limiting = layer.Name
	}
	switch v[0] {
	case 1:
		res.Granted, res.Tokens = true, int(v[7])
		res.LayersDue = time.Duration(v[10]) * time.Microsecond
		for j := 12; j+2 < len(v); j += 3 { // the shadow layers
			if v[j] < 0 || int(v[j]) > len(l.layers) || v[j+1] < 0 || v[j+2] >= int64(len(shadowActions)) || v[j] == 0 && !req.ShadowShared {
				return backend.LayerResult{}, l.malformed("take layers", v)
			}
			name := backend.SharedShadow // index 0: the shadow shared bucket
			if v[j] > 0 {
				name = l.layers[v[j]-1].Name
			}
			res.Shadow = append(res.Shadow, backend.ShadowDecision{Layer: name, Wait: time.Duration(v[j+1]) * time.Microsecond, Action: shadowActions[v[j+2]]})
		}
	case 0:
	case 3:
		res.Floor = true
	case 2:
		res.Exceeded = backend.ExceededError(layer, res.At, res.Wait)
	case 4:
		if v[2] == 0 {
			return backend.LayerResult{}, l.malformed("take layers", v)
		}
		res.Exceeded = backend.ReservedError(layer, layerKeyOf(layer, req), res.At, res.Wait)
	case -1:
		return res, fmt.Errorf("cost %d, burst %d: %w", req.Cost, res.Burst, limiter.ErrCostExceedsBurst)
	case -2:
		if layer.IsBudget() {
			return res, backend.PriceError(layer, req.Price)
		}
		return res, backend.CostError(layer, req.Cost)
	case -3:
		return res, l.fail("take layers", fmt.Errorf("layer %q: the Redis clock (%v) is outside the windows computed around this host's clock (%v)", layer.Name, res.At, clock))
	default:
		return backend.LayerResult{}, l.malformed("take layers", v)
	}
	return res, nil
}

// shadowActions are the actions of a shadow layer's decision in
// layersScript's reply, by their number there.
var shadowActions = [...]limiter.Action{"", limiter.ActionWait, limiter.ActionDeadLetter, limiter.ActionDelay}

// RefundLayers implements backend.LayeredStore.
func (l *Layered) RefundLayers(ctx context.Context, req backend.LayerRequest, res backend.LayerResult) error {
	return l.refundLayers(ctx, time.Time{}, req, res)
}

func (l *Layered) refundLayers(ctx context.Context, at time.Time, req backend.LayerRequest, res backend.LayerResult) error {
	if !res.Granted || req.Cost < 1 {
		return nil
	}
	keys, err := backend.LayerKeys(l.layers, req)
	if err != nil {
		return err
	}
	for _, st := range l.steps(req.SkipShared, false) {
		if err := l.refundStep(ctx, at, req, keys, st, res.At.Add(res.Wait), res.Class, 0); err != nil {
			return err
		}
	}
	return nil
}

// refundStep runs layersRefundScript for one step of a take that charged
// the layers for the instant charged (the store's clock: when the message
// was due to go out), whose reservation on the shared bucket was
// in class's queue. A step with the shared bucket also gives it back
// leased, the tokens granted beyond the cost (a Cluster's first step,
// whose later step refused).
func (l *Layered) refundStep(ctx context.Context, at time.Time, req backend.LayerRequest, keys []string, st step, charged time.Time, class limiter.Priority, leased int) error {
	nowUS := int64(0)
	if !at.IsZero() {
		nowUS = at.UnixMicro()
	}
	var rk layerKeys
	args := make([]any, 0, 10+4*len(st.layers))
	shared := "0"
	if st.shared {
		shared = "1"
		rk.add(l.stateKeys...)
	}
	paid := backend.PaidLayers(l.layers, keys, req.Paid, charged) // as the take decided
	layers := st.layers
	var slots []backend.SlotRelease
	if paid != nil || l.slots || l.shadow || l.hasWindow {
		// A paid layer or a window was not charged: nothing to give
		// back. A concurrency slot is released, which wakes its waiters.
		layers = slices.DeleteFunc(slices.Clone(layers), func(i int) bool {
			if l.layers[i].IsConcurrency() {
				slots = append(slots, backend.SlotRelease{Layer: l.layers[i].Name, Key: keys[i], Holder: req.Holder})
				return true
			}
			return (paid != nil && paid[i]) || l.layers[i].Shadow || l.layers[i].IsWindow() // a shadow layer keeps its charge
		})
		if len(slots) > 0 {
			if err := l.releaseSlots(ctx, slots); err != nil {
				return err
			}
		}
		if !st.shared && len(layers) == 0 {
			return nil
		}
	}
	args = append(args, nowUS, req.Cost, shared, l.rateArg, l.burstArg, len(layers), rankArgs[backend.Rank(class)])
	for _, i := range layers {
		rk.addLayer(l, i, keys[i])
		if l.layers[i].IsBudget() { // refund the price
			args = append(args, l.spec[i][1], l.spec[i][2], int64(req.Price))
		} else {
			args = append(args, l.spec[i][1], l.spec[i][2], l.spec[i][3])
		}
		if ly := l.layers[i]; ly.IsQuota() || ly.IsBudget() {
			_, end := backend.QuotaWindow(ly.Per, charged, ly.Location)
			args = append(args, end.UnixMicro())
		} else {
			args = append(args, 0)
		}
	}
	args = append(args, l.warmArg)
	if !st.shared {
		leased = 0
	}
	args = append(args, max(leased, 0), string(rk.fields))
	if err := layersRefundScript.Run(ctx, l.client, rk.keys, args...).Err(); err != nil {
		return l.fail("refund layers", err)
	}
	return nil
}

// layersDelayScript takes from layer buckets what a granted request's
// later send costs them (lua/layers_delay.lua).
var layersDelayScript = redis.NewScript(mathLua + luaSource("layer_prelude.lua") + luaSource("layers_delay.lua"))

// DelayLayers implements backend.LayeredStore: one script call per slot
// group of the request's token-bucket layers (one on a single node). On a
// Cluster, a group that refuses (a later message on its key) leaves the
// groups before it debited: they only over-charge, which is safe.
func (l *Layered) DelayLayers(ctx context.Context, req backend.LayerRequest, res backend.LayerResult, from time.Time, by time.Duration) (bool, error) {
	return l.delayLayers(ctx, time.Time{}, req, res, from, by)
}

func (l *Layered) delayLayers(ctx context.Context, at time.Time, req backend.LayerRequest, res backend.LayerResult, from time.Time, by time.Duration) (bool, error) {
	if !res.Granted || by <= 0 || req.Cost < 1 {
		return true, nil
	}
	keys, err := backend.LayerKeys(l.layers, req)
	if err != nil {
		return false, err
	}
	nowUS := int64(0)
	if !at.IsZero() {
		nowUS = at.UnixMicro()
	}
	paid := backend.PaidLayers(l.layers, keys, req.Paid, res.At.Add(res.Wait)) // as the take decided
	for _, st := range l.steps(true, false) {
		var rk layerKeys
		args := []any{nowUS, from.UnixMicro(), from.Add(by).UnixMicro()}
		for _, i := range st.layers {
			ly := l.layers[i]
			if !ly.IsBucket() || ly.Shadow || (paid != nil && paid[i]) {
				continue
			}
			rk.addLayer(l, i, keys[i])
			args = append(args, l.spec[i][2], l.spec[i][3], backend.DelayCharge(ly, req.Cost, by))
		}
		if len(rk.keys) == 0 {
			continue
		}
		args = append(args, string(rk.fields), req.Cost)
		moved, err := layersDelayScript.Run(ctx, l.client, rk.keys, args...).Int()
		if err != nil {
			return false, l.fail("delay layers", err)
		}
		if moved != 1 {
			return false, nil
		}
	}
	return true, nil
}

func (l *Layered) layerIndex(name string) (int, error) {
	for i, ly := range l.layers {
		if ly.Name == name {
			return i, nil
		}
	}
	return 0, &limiter.ParamError{Param: "Layer", Msg: "no such layer", Value: name}
}

// LayerStatus returns the state of one key of a layer ("" for a layer
// without keys), read with one script call.
func (l *Layered) LayerStatus(ctx context.Context, layer, key string) (backend.LayerState, error) {
	return l.layerStatus(ctx, time.Time{}, layer, key)
}

func (l *Layered) layerStatus(ctx context.Context, at time.Time, layer, key string) (backend.LayerState, error) {
	i, err := l.layerIndex(layer)
	if err != nil {
		return backend.LayerState{}, err
	}
	nowUS, clock := int64(0), at
	if at.IsZero() {
		clock = time.Now()
	} else {
		nowUS = at.UnixMicro()
	}
	ly := l.layers[i]
	rkey, field := l.bucketLoc(i, key)
	args := []any{l.spec[i][1], l.spec[i][2], l.spec[i][3], 0, 0, 0, 0, nowUS, field}
	if ly.IsBudget() {
		args[0] = "q"
	}
	if ly.IsQuota() || ly.IsBudget() {
		w := l.window(i, clock)
		args[3], args[4], args[5], args[6] = w[0], w[1], w[2], w[3]
	}
	v, err := layerStatusScript.Run(ctx, l.client, []string{rkey}, args...).Int64Slice()
	if err != nil {
		return backend.LayerState{}, l.fail("layer status", err)
	}
	if len(v) != 4 || v[1] < 0 {
		return backend.LayerState{}, l.malformed("layer status", v)
	}
	st := backend.LayerState{Layer: layer, Key: key, At: time.UnixMicro(v[2])}
	switch {
	case ly.IsConcurrency():
		st.Used = int(v[0])
		st.Full = st.Used == 0
		return st, nil
	case ly.IsWindow():
		spans, err := backend.WindowSpans(ly, key, limiter.PriorityNormal, clock)
		if err != nil {
			return st, err
		}
		st.Open, st.Full = backend.WindowState(spans, v[2])
		return st, nil
	case ly.IsBudget():
		st.Spent, st.WindowEnd = limiter.Amount(v[0]), time.UnixMicro(v[1])
		st.Full = st.Spent == 0
		return st, nil
	case ly.IsQuota():
		st.Used, st.WindowEnd = int(v[0]), time.UnixMicro(v[1])
		st.Full = st.Used == 0
		return st, nil
	}
	st.Tokens = float64(v[0]) / 1000
	st.Full = st.Tokens >= float64(ly.Burst)
	return st, nil
}

// ResetLayer deletes the state of one key of a layer: its bucket is full,
// its quota unused.
func (l *Layered) ResetLayer(ctx context.Context, layer, key string) error {
	i, err := l.layerIndex(layer)
	if err != nil {
		return err
	}
	pipe := l.client.Pipeline()
	if rkey, field := l.bucketLoc(i, key); field != "" {
		pipe.HDel(ctx, rkey, field)
	} else if l.needsSince([]int{i}) {
		// The slots booked on the deleted key no longer pass.
		pipe.Del(ctx, rkey, l.sinceKey)
	} else {
		pipe.Del(ctx, rkey)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return l.fail("reset layer", err)
	}
	return nil
}

var _ backend.LayeredStore = (*Layered)(nil)
