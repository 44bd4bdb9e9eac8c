// Package backend is what a bucket store is made of: the Store interface
// that a limiter.Bucket drives and the optional interfaces it looks for
// (layers, replica tracking, announcements, classes, adaptive rate,
// warm-up, paid-slot secret), their requests and results, the in-process
// Memory and LayeredMemory stores, and the arithmetic the Redis scripts
// mirror. The vocabulary a program uses (State, Layer, Priority, ...) is
// defined here and named in package limiter, which re-exports it.
//
// It is internal: a program uses package limiter and the Redis store of
// package limiter/redislimiter; the stores of this module are its only
// implementations.
package backend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/throttlehq/throttle/internal/topk"
)

// MaxRate is the highest rate, in tokens per second, that a bucket accepts:
// in its configuration, a runtime override or a fallback rate. It keeps the
// stores' arithmetic exact (the Redis scripts answer in thousandths of a
// token) and far from integer overflow.
const MaxRate = 1e9

// MaxBurst is the largest burst a bucket accepts.
const MaxBurst = math.MaxInt32

// DefaultBurst returns the burst used when none is given: one second of
// tokens at rate, at least 1 and at most MaxBurst.
func DefaultBurst(rate float64) int {
	if !(rate > 0) {
		return 1
	}
	return int(min(math.Max(1, math.Ceil(rate)), MaxBurst))
}

// Sentinel errors. They are wrapped with context; test with errors.Is.
var (
	// ErrCostExceedsBurst is returned at once when a cost is larger than
	// the bucket's burst: such a request could never be granted.
	ErrCostExceedsBurst = errors.New("cost exceeds burst")
	// ErrInvalidCost is returned for a cost below 1.
	ErrInvalidCost = errors.New("cost must be at least 1")
	// ErrStore wraps every failure of a Store: unreachable, timed out, a
	// script error or a malformed reply.
	ErrStore = errors.New("bucket store failed")
	// ErrMisconfigured is matched, besides ErrStore, by a store failure
	// that waiting will not cure: the store refused this client's
	// credentials, permissions or database, or cannot run its scripts. A
	// Bucket never falls back on it: it stops granting (ModeClosed) and
	// logs an error until the store answers again. Check returns it at
	// start, so that a program can exit instead of running unlimited.
	ErrMisconfigured = errors.New("bucket store misconfigured")
)

// State is a snapshot of a bucket.
type State struct {
	// Tokens is the number of tokens in the bucket now. It is negative
	// when callers have reserved tokens that are not yet due.
	Tokens float64
	// Rate is the effective refill rate in tokens per second: the runtime
	// override if one is set, else the configured rate, and 0 while the
	// bucket is paused.
	Rate float64
	// Burst is the effective capacity.
	Burst int
	// BaseRate is the refill rate apart from a pause: Rate once the pause
	// ends, which is the adaptive rate when one is in force (see
	// Adaptive). 0 when the store does not say.
	BaseRate float64
	// ConfiguredRate and ConfiguredBurst are the values this replica was
	// started with.
	ConfiguredRate  float64
	ConfiguredBurst int
	// Override is the runtime override set by an operator, if any.
	Override *Override
	// PausedFor is how long the bucket stays paused, or 0.
	PausedFor time.Duration
	// PausedBy names the replica whose push-back set the pause in force,
	// when the store records it (see AttributedPauser); else "".
	PausedBy string
	// Replicas is the number of live replicas known from heartbeats, or 0
	// when the store does not track them.
	Replicas int
	// Reserved is the tokens each class holds reserved ahead, indexed by
	// Priority: they add up to max(0, -Tokens). Zero from a store without
	// classes.
	Reserved Shares
	// Pushed is each class's push counter (see Push), indexed by Priority;
	// PriorityHigh's is always 0. A replica that may have missed pushes,
	// such as after a resubscription, compares it with the counter its
	// reservations saw.
	Pushed Shares
	// Mode is how the Bucket that produced this State is limiting now. A
	// Store leaves it empty.
	Mode Mode
	// At is the store's clock when it answered, or the zero time when the
	// State does not come from a store.
	At time.Time
	// Changed is the store's clock at the bucket's last change of settings
	// (an override set or cleared, a pause, a resume, a fill, an adaptive
	// decrease): the instant from which the store refills at the new
	// settings. Replicas that hear of a change at different instants move
	// their reservations from it, so that they agree with the store's
	// queue and with each other. The zero time when the store does not
	// say.
	Changed time.Time
}

// Override is a rate and burst set at runtime that wins over every replica's
// configured values until it is cleared or expires.
type Override struct {
	Rate float64
	// Burst is the override's burst, or 0 when the override keeps each
	// replica's configured burst.
	Burst int
	// ExpiresIn is how long the override still holds, or 0 for no expiry.
	ExpiresIn time.Duration
}

// TakeRequest asks a Store for tokens.
type TakeRequest struct {
	// Cost is the number of tokens needed, at least 1.
	Cost int
	// Extra asks for up to this many more tokens, granted only from tokens
	// available now and never reserved ahead. (A Bucket's lease asks for
	// its whole batch as Cost instead, so that a saturated bucket still
	// costs one call per batch.)
	Extra int
	// Hold, when positive, says the tokens go out at any instant from the
	// grant up to Hold after it (a Bucket's lease, spent locally): the
	// take is charged as of the grant plus Hold, as if taken then, so that
	// tokens spent anywhere in between keep every window within rate·W +
	// burst. A bucket that would refill past its burst within Hold loses
	// that refill (TakeResult.Remaining is lower by it): as the tokens may
	// go out as late as then, the bucket cannot count them as spent
	// earlier. The grant's condition is unchanged otherwise: granted now
	// when the bucket holds the cost now, after that loss.
	Hold time.Duration
	// MaxWait is the reservation horizon. If the tokens are not available
	// now but will be within max(MaxWait, Cost/rate), they are reserved and
	// TakeResult.Wait says when they are due. If MaxWait is 0, tokens are
	// taken only if available now.
	MaxWait time.Duration
	// Priority is the request's class (see Priority). A store without
	// classes treats every request alike.
	Priority Priority
	// MinShare is the floor of each class's share of the rate while it has
	// reservations waiting (Options.MinShare). A take that would jump
	// further ahead of a lower class than its floor allows is refused with
	// TakeResult.Floor.
	MinShare Shares
}

// TakeResult is a Store's answer to a TakeRequest.
type TakeResult struct {
	// Granted reports whether tokens were taken or reserved.
	Granted bool
	// Tokens is the number of tokens taken: Cost plus any Extra granted.
	Tokens int
	// Wait is, when Granted, how long until the reserved tokens are due (0
	// when they were available now). When not Granted, it is how long until
	// the same request could be granted if nobody else took tokens.
	Wait time.Duration
	// Remaining is the number of tokens left after the call; negative when
	// tokens are reserved ahead.
	Remaining float64
	// Rate and Burst are the bucket's effective values at the time of the
	// call; Rate is 0 while the bucket is paused.
	Rate  float64
	Burst int
	// At is the store's clock when it answered. At+Wait is the instant, on
	// the store's clock, when granted tokens are due.
	At time.Time
	// Class is the class whose queue holds a reservation: the request's
	// Priority (a store without classes leaves it PriorityNormal). Pushes
	// of Class move the reservation (see Push), and a cancelled one is
	// refunded in it (ClassRefunder).
	Class Priority
	// Pushed is Class's push counter when the store answered: the
	// reservation moves back by each Push of Class with a larger Counter.
	Pushed float64
	// Floor reports a refusal (Granted is false) because the take would
	// have jumped further ahead of a lower class's reservations than that
	// class's MinShare allows. Wait is then the exact time until the floor
	// lets it through. A Bucket queues the callers of a class that a floor
	// holds back behind one that asks (see Options.MinShare).
	Floor bool
}

// Store keeps the state of one token bucket. Implementations must make each
// method atomic with respect to every other caller of the same bucket, and
// must be safe for concurrent use.
type Store interface {
	// Take takes or reserves tokens. A cost above the effective burst
	// returns an error that wraps ErrCostExceedsBurst.
	Take(ctx context.Context, req TakeRequest) (TakeResult, error)
	// Refund puts back tokens that were taken but not used, such as those
	// of a cancelled reservation or an unused lease. The bucket never
	// exceeds its burst.
	Refund(ctx context.Context, tokens int) error
	// Pause stops the bucket from granting for d, counted by the store's
	// clock, for every caller. Reservations already made are kept. A pause
	// never shortens one that is longer.
	Pause(ctx context.Context, d time.Duration) error
	// Status reads the bucket without changing it.
	Status(ctx context.Context) (State, error)
	// Drain empties the bucket, as if its tokens had been spent, and
	// leaves at least debt tokens reserved ahead of every later caller:
	// the tokens become min(tokens, -debt). A Bucket calls it when it
	// comes back from its fallback, so that the tokens its replicas
	// granted and booked locally are charged to the shared bucket instead
	// of adding to a bucket that refilled, or restarted full, meanwhile.
	// Drains do not add up: replicas coming back one after the other each
	// charge their estimate of the whole fleet's bookings.
	Drain(ctx context.Context, debt int) error
	// Limits returns the rate and burst the store was configured with,
	// without any I/O. The Bucket uses them before it has heard from the
	// store, for example to size its fallback when the store is down from
	// the start.
	Limits() (rate float64, burst int)
}

// PastRefunder is implemented by stores that take back tokens whose
// instant has passed: a lease's tokens that went unused until their
// deadline or for Idle, or a reservation woken too late to go out. A
// Bucket gives those back with RefundPast when its store implements it,
// else with Refund.
//
// Refund suits a cancelled reservation, whose slot is still ahead: the
// bucket's level and its queue go back together. Tokens past their slot
// are different: the reservations queued after them keep their instants,
// so tokens put back into a bucket in debt would be granted again among
// those reservations, and the bucket, counted at the instants its tokens
// go out, would hold more than its burst. Given back while many
// reservations queue, such refunds used to let a fleet exceed rate·W +
// burst in a window. RefundPast therefore puts the tokens back, up to the
// burst, only while no reservation is queued (the bucket holds 0 tokens or
// more), and drops them otherwise.
type PastRefunder interface {
	// RefundPast gives back tokens whose instant has passed (see above).
	RefundPast(ctx context.Context, tokens int) error
}

// AttributedPauser is implemented by stores that record which replica set
// a pause, for State.PausedBy. A Bucket pauses with PauseBy, naming itself,
// when its store implements it.
type AttributedPauser interface {
	// PauseBy is Pause, recording by as the replica that paused when the
	// pause extends the one in force.
	PauseBy(ctx context.Context, d time.Duration, by string) error
}

// ReplicaTracker is implemented by stores that count the live replicas of a
// bucket. The Bucket sends a heartbeat for itself every HeartbeatInterval and
// uses the count to size its local fallback share and its leases.
type ReplicaTracker interface {
	// Heartbeat records that replica id is alive for ttl and returns the
	// number of live replicas, this one included.
	Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, error)
	// Leave removes replica id at once.
	Leave(ctx context.Context, id string) error
}

// ReplicaReport is what a Bucket says about itself with each heartbeat, for
// operators' tools. It is a plain value.
type ReplicaReport struct {
	// Mode is how the Bucket limits now.
	Mode Mode
	// Granted is the number of tokens its Wait and Allow granted since it
	// started: a counter, so that a reader derives the rate from two reads.
	Granted int64
	// Waiting is the number of Wait calls waiting for the store now.
	Waiting int
	// WaitingByPriority is Waiting by class, indexed by Priority
	// (limiter.Stats.WaitingByPriority).
	WaitingByPriority [NumPriorities]int
	// Exceeded counts, by layer name, the WaitN calls each layer refused
	// (limiter.Stats.Exceeded) since the Bucket started; layers that refused
	// none are left out. Nil without refusals.
	Exceeded map[string]int64
	// Idle is set while the replica consumes nothing (Bucket.SetIdle),
	// such as a Kafka group member that owns no partition.
	Idle bool
	// Backlog is the source's backlog as the replica last read it
	// (Bucket.SetBacklog); nil when unknown.
	Backlog *Backlog
	// RefusedKeys is, by layer, the keys it refused most over the last
	// minute (a shadow layer: would have refused), largest first: a
	// bounded, approximate count (package topk). Nil when none.
	RefusedKeys map[string][]topk.Entry
	// TenantTokens is the tenants (fair shares) granted the most tokens
	// over the last minute, largest first, as RefusedKeys counts, and
	// TenantTokensTotal the tokens granted to every tenant meanwhile.
	TenantTokens      []topk.Entry
	TenantTokensTotal int64
	// TenantsWaiting is the tenants with the most requests waiting now
	// (on a reservation or for their share), largest first.
	TenantsWaiting []topk.Entry
}

// Backlog is the messages waiting at the broker for a consumer group or
// queue: Ready to be consumed, and SetAside by a delay layer until due.
type Backlog struct {
	Ready, SetAside int64
}

// ReportingTracker is a ReplicaTracker that also records each replica's
// report. A Bucket sends its heartbeats with HeartbeatReport when its store
// implements it.
type ReportingTracker interface {
	ReplicaTracker
	// HeartbeatReport is Heartbeat, recording r for replica id.
	HeartbeatReport(ctx context.Context, id string, ttl time.Duration, r ReplicaReport) (int, error)
}

// ConsumerTracker is a ReportingTracker that also counts the live replicas
// that consume: those whose last report was not Idle. A Bucket on such a
// store divides the rate of its local fallback among those replicas (see
// Bucket.SetIdle); on another store, among all the live ones.
type ConsumerTracker interface {
	ReportingTracker
	// HeartbeatConsumers is HeartbeatReport, returning the number of live
	// replicas and, of them, the number whose last report was not Idle,
	// this one included unless r is Idle.
	HeartbeatConsumers(ctx context.Context, id string, ttl time.Duration, r ReplicaReport) (live, consuming int, err error)
}

// Notifier is implemented by stores that announce the changes operators and
// push-back make to a bucket (a rate override, a fill, a reset, a pause, a
// replica's return from fallback) to every replica. A Bucket that hears one
// reads the bucket once and moves the reservations its callers are sleeping
// on to where the new rate or pause puts them, keeping their order, so the
// change reaches them within a round trip instead of after the reservation
// horizon; it gives back its leased tokens; and, in fallback, it asks the
// store at once whether it is back.
type Notifier interface {
	// Watch calls changed for every announced change until ctx ends, then
	// returns. It resubscribes by itself after a connection failure, and
	// then calls changed once, since announcements may have been missed
	// while it was not subscribed. It calls pushed, unless nil, for every
	// announced Push, and never calls changed for one: a push moves the
	// reservations of a lower class back, it does not change the bucket.
	Watch(ctx context.Context, changed func(), pushed func(Push))
}

// ValidateRate returns a *ParamError for the parameter "Rate" unless rate
// is a number above zero and at most MaxRate.
func ValidateRate(rate float64) error {
	if !(rate > 0) || rate > MaxRate { // also rejects NaN and infinities
		return &ParamError{Param: "Rate", Msg: "must be a number > 0 and <= " + strconv.FormatFloat(MaxRate, 'g', -1, 64), Value: rate}
	}
	return nil
}

// ValidateBurst returns a *ParamError for the parameter "Burst" unless
// burst is at least 1 and at most MaxBurst.
func ValidateBurst(burst int) error {
	if burst < 1 || burst > MaxBurst {
		return &ParamError{Param: "Burst", Msg: "must be >= 1 and <= " + strconv.Itoa(MaxBurst), Value: burst}
	}
	return nil
}

// ParamError is a bad parameter given to a constructor or a call.
type ParamError struct {
	// Param is the Go name of the parameter or field, such as "Rate" or
	// "Lease.Fraction".
	Param string
	Msg   string
	Value any
}

func (e *ParamError) Error() string {
	if e.Value == nil {
		return e.Param + ": " + e.Msg
	}
	if s, ok := e.Value.(string); ok {
		return fmt.Sprintf("%s: %s, got %q", e.Param, e.Msg, s)
	}
	return fmt.Sprintf("%s: %s, got %v", e.Param, e.Msg, e.Value)
}

// ErrMalformedReply is wrapped by a StoreError when a store answers with a
// reply it cannot parse.
var ErrMalformedReply = errors.New("malformed store reply")

// StoreError is a failed Store call. It matches ErrStore with errors.Is and
// unwraps to the cause.
type StoreError struct {
	// Op is the operation: "take", "refund", "pause", "status", ...
	Op string
	// Bucket is the bucket's name.
	Bucket string
	Err    error
	// Misconfigured is set when the failure is not an outage but a
	// configuration problem (see ErrMisconfigured).
	Misconfigured bool
}

func (e *StoreError) Error() string {
	return "bucket " + strconv.Quote(e.Bucket) + ": " + e.Op + ": " + e.Err.Error()
}

func (e *StoreError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrStore) true for every StoreError, and
// errors.Is(err, ErrMisconfigured) true for one whose Misconfigured is set.
func (e *StoreError) Is(target error) bool {
	return target == ErrStore || (target == ErrMisconfigured && e.Misconfigured)
}

// Mode says how a Bucket is limiting right now.
type Mode string

// The modes of a Bucket. ModeShared is normal operation; the others are the
// policies for a store failure, chosen with Options.OnStoreError.
const (
	// ModeShared takes every token from the Store, shared by all replicas.
	ModeShared Mode = "shared"
	// ModeLocal limits with an in-process bucket at this replica's share of
	// the rate while the Store is down. It is the default policy.
	ModeLocal Mode = "local"
	// ModeClosed stops granting until the Store answers again. A Bucket is
	// also closed, whatever its policy, while the store reports
	// ErrMisconfigured, and while the store is down before this replica has
	// learnt how many replicas share the bucket (see Options.FallbackRate).
	ModeClosed Mode = "closed"
	// ModeOpen grants everything while the Store is down. It is dangerous:
	// the sink sees the unthrottled rate of every replica.
	ModeOpen Mode = "open"
)

// ParseMode parses a store-error policy: "local", "closed" or "open".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeLocal, ModeClosed, ModeOpen:
		return m, nil
	}
	return "", &ParamError{Param: "OnStoreError", Msg: "must be local, closed or open", Value: s}
}
