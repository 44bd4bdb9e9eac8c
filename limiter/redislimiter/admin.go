package redislimiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// AdminConfig names the bucket an Admin works on.
type AdminConfig struct {
	// Bucket is the bucket's name, as in Config.
	Bucket string
	// Prefix is prepended to every key. Default DefaultPrefix.
	Prefix string
	// Rate and Burst are the replicas' configured values, if known; 0
	// means unknown. Without them an Admin still reads and changes the
	// bucket, but Status knows the rate, burst and tokens only from an
	// override that sets them.
	Rate  float64
	Burst int
}

// Admin reads and changes one bucket for an operator: its status, the
// runtime override, fill and reset. It needs no configured limits. Changes
// are announced on the bucket's channel, so every running replica's Watch
// hears of them at once.
//
// An Admin is safe for concurrent use.
type Admin struct {
	client Client
	name   string
	keys   keys
	rate   float64
	burst  int
	// rateArg and burstArg are the configured values as script arguments,
	// 0 when unknown.
	rateArg, burstArg any
}

// NewAdmin returns an Admin for the bucket of cfg. It makes no Redis call.
// Errors in the parameters are *limiter.ParamError naming the field.
func NewAdmin(client Client, cfg AdminConfig) (*Admin, error) {
	if client == nil {
		return nil, &limiter.ParamError{Param: "client", Msg: "must not be nil"}
	}
	if err := ValidateBucketName(cfg.Bucket); err != nil {
		return nil, err
	}
	if cfg.Rate != 0 {
		if err := backend.ValidateRate(cfg.Rate); err != nil {
			return nil, err
		}
	}
	if cfg.Burst != 0 {
		if err := backend.ValidateBurst(cfg.Burst); err != nil {
			return nil, err
		}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	return &Admin{
		client: client, name: cfg.Bucket, keys: newKeys(cfg.Prefix, cfg.Bucket),
		rate: cfg.Rate, burst: cfg.Burst,
		rateArg: strconv.FormatFloat(cfg.Rate, 'g', -1, 64), burstArg: cfg.Burst,
	}, nil
}

// Keys returns the Redis keys of the bucket: state, override, replicas and
// configs.
func (a *Admin) Keys() []string { return slices.Clone(a.keys.all) }

// OverrideStatus is a runtime override (SetOverride) as Redis holds it.
type OverrideStatus struct {
	// Rate is the override's rate, or 0 when Redis holds no number.
	Rate float64
	// Burst is the override's burst, or 0 when the override keeps each
	// replica's configured burst.
	Burst int
	// ExpiresIn is how long the override still holds, or 0 for no expiry.
	ExpiresIn time.Duration
	// Ignored is set when Redis holds a rate or burst that is not a number
	// within (0, backend.MaxRate] or [1, backend.MaxBurst], written by
	// something other than SetOverride. The replicas then use their
	// configured values, and RawRate and RawBurst show what Redis holds.
	Ignored bool
	// RawRate and RawBurst are the override's fields verbatim ("" when
	// absent).
	RawRate, RawBurst string
}

// BucketStatus is a bucket as Redis holds it. It is a plain value.
type BucketStatus struct {
	// Bucket is the bucket's name.
	Bucket string
	// Rate is the rate the bucket refills at when not paused: the
	// override's if one is in force, else the configured rate given to the
	// Admin, else 0 for unknown.
	Rate float64
	// Burst is the effective burst, known the same way, or 0 for unknown.
	Burst int
	// TokensKnown reports whether Tokens is known: it needs Rate and Burst.
	TokensKnown bool
	// Tokens is the number of tokens now; negative when callers have
	// reserved tokens ahead.
	Tokens float64
	// PausedFor is how long a push-back pause still holds, or 0.
	PausedFor time.Duration
	// PausedBy is the ReplicaID of the replica whose push-back set the
	// pause, or "" when unknown.
	PausedBy string
	// Override is the runtime override, or nil when none is set.
	Override *OverrideStatus
	// Replicas is the number of live replicas, from their heartbeats.
	Replicas int
	// Reserved is the tokens each class holds reserved ahead, indexed by
	// limiter.Priority, and Pushed each class's push counter (see
	// backend.Push). Both are zero when Tokens is unknown.
	Reserved limiter.Shares
	Pushed   limiter.Shares
	// At is Redis's clock when it answered.
	At time.Time
	// changed is the last change of settings (limiter.State.Changed).
	changed time.Time
}

// Status reads the bucket without changing it, in one script call.
func (a *Admin) Status(ctx context.Context) (BucketStatus, error) {
	return a.status(ctx, 0)
}

func (a *Admin) status(ctx context.Context, nowUS int64) (BucketStatus, error) {
	v, err := statusScript.Run(ctx, a.client, a.keys.all[:3], a.rateArg, a.burstArg, nowUS).Slice()
	if err != nil {
		return BucketStatus{}, storeError("status", a.name, err)
	}
	malformed := func() (BucketStatus, error) {
		return BucketStatus{}, storeError("status", a.name, fmt.Errorf("%w: %v", backend.ErrMalformedReply, v))
	}
	if len(v) != 16 {
		return malformed()
	}
	ints := make([]int64, len(v))
	for _, i := range []int{1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15} {
		n, ok := v[i].(int64)
		if !ok {
			return malformed()
		}
		ints[i] = n
	}
	st := BucketStatus{
		Bucket:    a.name,
		Rate:      float64(ints[1]) / 1000,
		Burst:     int(ints[2]),
		PausedFor: time.Duration(ints[3]) * time.Microsecond,
		Replicas:  int(ints[7]),
		At:        time.UnixMicro(ints[8]),
	}
	if ints[15] > 0 {
		st.changed = time.UnixMicro(ints[15])
	}
	for rank := range limiter.NumPriorities {
		st.Reserved[backend.PriorityOfRank(rank)] = float64(ints[10+rank]) / 1000
	}
	st.Pushed[limiter.PriorityNormal] = float64(ints[13]) / 1000
	st.Pushed[limiter.PriorityLow] = float64(ints[14]) / 1000
	if n, ok := v[0].(int64); ok {
		st.Tokens, st.TokensKnown = float64(n)/1000, true
	}
	st.PausedBy, _ = v[9].(string)
	rawRate, hasRate := v[4].(string)
	rawBurst, hasBurst := v[5].(string)
	if hasRate || hasBurst {
		o := &OverrideStatus{RawRate: rawRate, RawBurst: rawBurst}
		r, rerr := strconv.ParseFloat(rawRate, 64)
		if rerr == nil {
			o.Rate = r
		}
		if rerr != nil || backend.ValidateRate(r) != nil {
			o.Ignored = true
		}
		if hasBurst {
			b, berr := strconv.ParseFloat(rawBurst, 64)
			if berr == nil && b >= 1 && b <= backend.MaxBurst {
				o.Burst = int(b)
			} else {
				o.Ignored = true
			}
		}
		if ints[6] > 0 {
			o.ExpiresIn = time.Duration(ints[6]) * time.Millisecond
		}
		st.Override = o
	}
	return st, nil
}

// SetOverride sets a rate and burst that win over every replica's configured
// values, for ttl (0: until cleared), and announces the change. Burst 0
// keeps the replicas' configured burst. Running replicas take it up at once:
// a Bucket that hears the announcement moves the reservations its callers
// are sleeping on to where the new rate puts them, keeping their order.
// Errors in the parameters are *limiter.ParamError naming "Rate", "Burst"
// or "TTL".
func (a *Admin) SetOverride(ctx context.Context, rate float64, burst int, ttl time.Duration) error {
	if err := backend.ValidateRate(rate); err != nil {
		return err
	}
	if burst != 0 {
		if err := backend.ValidateBurst(burst); err != nil {
			return &limiter.ParamError{Param: "Burst", Msg: "must be >= 1 and <= " + strconv.Itoa(backend.MaxBurst) + ", or 0 to keep the configured burst", Value: burst}
		}
	}
	if ttl < 0 {
		return &limiter.ParamError{Param: "TTL", Msg: "must be >= 0", Value: ttl}
	}
	ms := int64(0)
	if ttl > 0 {
		ms = max(1, ttl.Milliseconds())
	}
	err := setOverrideScript.Run(ctx, a.client, a.keys.all[:2], strconv.FormatFloat(rate, 'g', -1, 64), burst, ms, a.keys.channel).Err()
	if err != nil {
		return storeError("set override", a.name, err)
	}
	return nil
}

// ClearOverride removes the runtime override, so every replica's configured
// rate applies again, and announces it.
func (a *Admin) ClearOverride(ctx context.Context) error {
	if err := setOverrideScript.Run(ctx, a.client, a.keys.all[:2], "", 0, 0, a.keys.channel).Err(); err != nil {
		return storeError("clear override", a.name, err)
	}
	return nil
}

// Fill fills the bucket to its effective burst, as before a known peak, and
// announces it. A pause from push-back is kept. When the Admin knows no
// burst, each replica fills to its own configured burst.
func (a *Admin) Fill(ctx context.Context) error {
	if err := fillScript.Run(ctx, a.client, a.keys.all[:2], a.rateArg, a.burstArg, 0, a.keys.channel).Err(); err != nil {
		return storeError("fill", a.name, err)
	}
	return nil
}

// PausedByOperator is the BucketStatus.PausedBy of a pause that an
// operator set with Admin.Pause, where a push-back pause records the
// replica's id.
const PausedByOperator = "operator"

// MaxAdminPause is the longest pause Admin.Pause sets: a pause meant to
// outlast it is a rate override ('bucket set') or a stopped fleet.
const MaxAdminPause = 24 * time.Hour

// ErrLimitsUnknown is returned by Admin.Pause and Admin.Resume when the
// bucket's rate or burst is unknown: the Admin was given no configured
// limits, and no override in Redis sets both.
var ErrLimitsUnknown = errors.New("the bucket's configured rate and burst are unknown: give the configured limits (AdminConfig.Rate and Burst) or set an override with a burst")

// Pause stops the bucket refilling and granting for d, for every replica,
// as a sink's push-back does, and announces it; PausedBy reads
// PausedByOperator. A longer pause already in force is kept. Reservations
// made before stay valid and fall due after the pause. It needs the rate
// and burst (see ErrLimitsUnknown). Errors in d are *limiter.ParamError
// naming "D": it must be > 0 and at most MaxAdminPause.
func (a *Admin) Pause(ctx context.Context, d time.Duration) error {
	if err := ValidatePause(d); err != nil {
		return err
	}
	if err := a.needLimits(ctx); err != nil {
		return err
	}
	err := pauseScript.Run(ctx, a.client, a.keys.all[:2], a.rateArg, a.burstArg, max(1, d.Microseconds()), 0, a.keys.channel, PausedByOperator).Err()
	if err != nil {
		return storeError("pause", a.name, err)
	}
	return nil
}

// Resume ends a pause now, whoever set it (Pause, or a sink's push-back),
// and announces it, so that every replica grants again at once; ended
// reports whether the bucket was paused. The tokens are those the bucket
// had when paused. It needs the rate and burst (see ErrLimitsUnknown).
func (a *Admin) Resume(ctx context.Context) (ended bool, err error) {
	if err := a.needLimits(ctx); err != nil {
		return false, err
	}
	n, err := resumeScript.Run(ctx, a.client, a.keys.all[:2], a.rateArg, a.burstArg, 0, a.keys.channel).Int()
	if err != nil {
		return false, storeError("resume", a.name, err)
	}
	return n == 1, nil
}

// ValidatePause checks the length of an operator's pause (Admin.Pause): it
// must be > 0 and at most MaxAdminPause. The error is a *limiter.ParamError
// naming "D".
func ValidatePause(d time.Duration) error {
	if d <= 0 || d > MaxAdminPause {
		return &limiter.ParamError{Param: "D", Msg: "must be > 0 and at most " + MaxAdminPause.String(), Value: d}
	}
	return nil
}

// needLimits returns ErrLimitsUnknown unless the rate and burst are known,
// from the configured limits or an override.
func (a *Admin) needLimits(ctx context.Context) error {
	if a.rate > 0 && a.burst > 0 {
		return nil
	}
	st, err := a.Status(ctx)
	if err != nil {
		return err
	}
	if st.Rate <= 0 || st.Burst <= 0 {
		return fmt.Errorf("bucket %s: %w", a.name, ErrLimitsUnknown)
	}
	return nil
}

// Reset deletes the bucket's state, its shadow's (limiter.Options.Shadow)
// and the override, and announces it: the
// bucket is full, not paused, and every replica's configured rate applies
// again. The replica heartbeats are kept.
func (a *Admin) Reset(ctx context.Context) error {
	if err := deleteScript.Run(ctx, a.client, []string{a.keys.all[0], a.keys.all[1], a.keys.shadow}, a.keys.channel, "reset").Err(); err != nil {
		return storeError("reset", a.name, err)
	}
	return nil
}

// Replica is a live replica of a bucket, as its heartbeats describe it. It
// is a plain value, safe to copy and to share between goroutines.
type Replica struct {
	// ID is the replica's id (limiter.Options.ReplicaID).
	ID string
	// Rate and Burst are the replica's configured values (Config.Rate and
	// Config.Burst), or 0 when its heartbeat did not carry them.
	Rate  float64
	Burst int
	// Reported is set when the heartbeat carried the replica's report
	// (backend.ReplicaReport): Mode, Granted and Waiting are then as of
	// its last heartbeat, else zero.
	Reported bool
	Mode     limiter.Mode
	// Granted counts the tokens the replica granted since it started; two
	// reads give its rate.
	Granted int64
	// Waiting is the number of its Wait calls waiting for the store.
	Waiting int
	// Exceeded counts, by layer, the requests each layer of its store
	// refused since it started (limiter.Stats.Exceeded); nil when none
	// did or the heartbeat did not say.
	Exceeded map[string]int64
	// WaitingByPriority is Waiting by class, indexed by limiter.Priority;
	// zeros when none waits or the heartbeat did not say.
	WaitingByPriority [limiter.NumPriorities]int
	// Idle is set when its report says it consumes nothing
	// (backend.ReplicaReport.Idle), such as a Kafka group member that
	// owns no partition.
	Idle bool
	// Backlog is the source's backlog its report carried
	// (backend.ReplicaReport.Backlog), nil when unknown. It belongs to the
	// consumer group or queue: every replica of one reports the same.
	Backlog *limiter.Backlog
	// RefusedKeys is, by layer, the keys the layer refused most on the
	// replica over the last minute (a shadow layer: would have refused),
	// with their counts: at most 10 a layer, approximate (a key's count
	// may be over by the smallest count the replica kept). Nil when none,
	// or when the heartbeat did not say.
	RefusedKeys map[string]map[string]int64
	// TenantTokens is, on a store with fair shares (limiter.Fair), the
	// tenants the replica granted the most tokens over the last minute
	// (at most 10, counted as RefusedKeys), and TenantTokensTotal the
	// tokens it granted to every tenant meanwhile: a tenant's share of
	// the rate is its tokens, summed over the replicas, divided by the
	// total. TenantsWaiting is the tenants with the most requests waiting
	// in the replica now (on a reservation or for their share), at most
	// 10. Nil and 0 without fair shares.
	TenantTokens      map[string]int64
	TenantTokensTotal int64
	TenantsWaiting    map[string]int64
	// BeatAt is when its last heartbeat ran, on Redis's clock: Granted is
	// the count as of then, so two beats give the rate exactly. Zero when
	// the heartbeat did not say (an older replica).
	BeatAt time.Time
}

// parseWaitingByPriority parses a report's "w:HIGH,NORMAL,LOW" token.
func parseWaitingByPriority(tok string) (w [limiter.NumPriorities]int, ok bool) {
	rest, ok := strings.CutPrefix(tok, "w:")
	if !ok {
		return w, false
	}
	f := strings.Split(rest, ",")
	if len(f) != limiter.NumPriorities {
		return w, false
	}
	for i, p := range []limiter.Priority{limiter.PriorityHigh, limiter.PriorityNormal, limiter.PriorityLow} {
		n, err := strconv.Atoi(f[i])
		if err != nil || n < 0 {
			return [limiter.NumPriorities]int{}, false
		}
		w[p] = n
	}
	return w, true
}

// parseBacklog parses a report's "b:READY,SETASIDE" token.
func parseBacklog(tok string) (limiter.Backlog, bool) {
	rest, ok := strings.CutPrefix(tok, "b:")
	if !ok {
		return limiter.Backlog{}, false
	}
	ready, aside, ok := strings.Cut(rest, ",")
	r, rerr := strconv.ParseInt(ready, 10, 64)
	a, aerr := strconv.ParseInt(aside, 10, 64)
	if !ok || rerr != nil || aerr != nil || r < 0 || a < 0 {
		return limiter.Backlog{}, false
	}
	return limiter.Backlog{Ready: r, SetAside: a}, true
}

// parseTops parses a report's top lists (Store.report): "k:LAYER:TOP",
// "t:TOTAL:TOP" and "q:TOP", into r, and reports whether tok was one.
// A malformed one is skipped.
func (r *Replica) parseTops(tok string) bool {
	kind, rest, _ := strings.Cut(tok, ":")
	switch kind {
	case "k":
		layer, list, ok := strings.Cut(rest, ":")
		if top, tok := parseTop(list); ok && tok && layer != "" {
			if r.RefusedKeys == nil {
				r.RefusedKeys = map[string]map[string]int64{}
			}
			r.RefusedKeys[layer] = top
		}
	case "t":
		total, list, ok := strings.Cut(rest, ":")
		n, err := strconv.ParseInt(total, 10, 64)
		if top, tok := parseTop(list); ok && tok && err == nil && n >= 0 {
			r.TenantTokens, r.TenantTokensTotal = top, n
		}
	case "q":
		if top, ok := parseTop(rest); ok {
			r.TenantsWaiting = top
		}
	default:
		return false
	}
	return true
}

// InUse reports whether Redis holds anything of the bucket: its state (a
// bucket that is not full, or paused), an override, or a live replica. A
// name that nothing uses is most likely a typo, or the bucket of replicas
// that are all stopped and whose bucket refilled. It makes two calls.
func (a *Admin) InUse(ctx context.Context) (bool, error) {
	cmd := redis.NewIntCmd(ctx, "exists", a.keys.all[0], a.keys.all[1])
	_ = a.client.Process(ctx, cmd)
	n, err := cmd.Result()
	if err != nil {
		return false, storeError("in use", a.name, err)
	}
	if n > 0 {
		return true, nil
	}
	reps, err := a.Replicas(ctx)
	return len(reps) > 0, err
}

// Replicas returns the live replicas, from their heartbeats, sorted by id.
func (a *Admin) Replicas(ctx context.Context) ([]Replica, error) {
	v, err := replicasScript.Run(ctx, a.client, a.keys.all[2:], 0).StringSlice()
	if err != nil {
		return nil, storeError("replicas", a.name, err)
	}
	if len(v)%2 != 0 {
		return nil, storeError("replicas", a.name, fmt.Errorf("%w: %d values, want pairs", backend.ErrMalformedReply, len(v)))
	}
	out := make([]Replica, 0, len(v)/2)
	for i := 0; i < len(v); i += 2 {
		r := Replica{ID: v[i]}
		// "rate burst", then from replicas that report it "mode granted
		// waiting" and tokens "x:LAYER:N", "w:HIGH,NORMAL,LOW", "idle" and
		// "b:READY,SETASIDE",
		// and last "a:BEAT_US" (unknown tokens are skipped).
		f := strings.Fields(v[i+1])
		if n := len(f); n > 0 && strings.HasPrefix(f[n-1], "a:") {
			if us, err := strconv.ParseInt(f[n-1][2:], 10, 64); err == nil && us > 0 {
				r.BeatAt = time.UnixMicro(us)
			}
			f = f[:n-1]
		}
		if len(f) >= 2 {
			r.Rate, _ = strconv.ParseFloat(f[0], 64)
			r.Burst, _ = strconv.Atoi(f[1])
			if backend.ValidateRate(r.Rate) != nil || backend.ValidateBurst(r.Burst) != nil {
				r.Rate, r.Burst = 0, 0
			}
			if len(f) >= 5 {
				granted, gerr := strconv.ParseInt(f[3], 10, 64)
				waiting, werr := strconv.Atoi(f[4])
				if f[2] != "-" && gerr == nil && werr == nil && granted >= 0 && waiting >= 0 {
					r.Mode, r.Granted, r.Waiting, r.Reported = limiter.Mode(f[2]), granted, waiting, true
				}
				for _, tok := range f[5:] {
					if tok == "idle" {
						r.Idle = r.Reported
						continue
					}
					if w, ok := parseWaitingByPriority(tok); ok {
						r.WaitingByPriority = w
						continue
					}
					if bl, ok := parseBacklog(tok); ok {
						r.Backlog = &bl
						continue
					}
					if r.parseTops(tok) {
						continue
					}
					if x := strings.Split(tok, ":"); len(x) == 3 && x[0] == "x" && x[1] != "" {
						if n, err := strconv.ParseInt(x[2], 10, 64); err == nil && n >= 0 {
							if r.Exceeded == nil {
								r.Exceeded = map[string]int64{}
							}
							r.Exceeded[x[1]] = n
						}
					}
				}
			}
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Replica) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
