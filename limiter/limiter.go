// Package limiter is a token bucket that many processes can share.
//
// A bucket refills at Rate tokens per second up to Burst tokens. A new bucket
// starts full, and however long it sits idle it never holds more than Burst.
// A message may cost several tokens.
//
// The bucket's state lives in a Store. The Redis store (package
// limiter/redislimiter) keeps it in Redis and updates it with one atomic Lua
// script per operation that reads the time from Redis itself, so every
// replica that names the same bucket shares one rate whatever its own clock
// says. The Memory store keeps it in this process, for single-replica use,
// tests, and the local fallback when Redis is down.
//
// A Bucket is the handle that consumers use: Wait blocks until tokens are
// granted, Allow takes them only if they are there now, and State reads the
// bucket. Waiting is exact: the store either reserves the caller's tokens and
// says when they are due, or says how long to wait before asking again. No
// call polls on a fixed interval.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Limiter is the interface consumers depend on. *Bucket implements it.
type Limiter interface {
	// Wait blocks until cost tokens are granted or ctx ends.
	Wait(ctx context.Context, cost int) error
	// Allow takes cost tokens if they are available now and reports whether
	// it did. It never blocks on the rate.
	Allow(ctx context.Context, cost int) (bool, error)
	// State reads the bucket without changing it.
	State(ctx context.Context) (State, error)
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
	// ErrClosed is returned by a Bucket after Close.
	ErrClosed = errors.New("bucket closed")
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
	// ConfiguredRate and ConfiguredBurst are the values this replica was
	// started with.
	ConfiguredRate  float64
	ConfiguredBurst int
	// Override is the runtime override set by an operator, if any.
	Override *Override
	// PausedFor is how long the bucket stays paused, or 0.
	PausedFor time.Duration
	// Replicas is the number of live replicas known from heartbeats, or 0
	// when the store does not track them.
	Replicas int
	// Mode is how the Bucket that produced this State is limiting now. A
	// Store leaves it empty.
	Mode Mode
}

// Override is a rate and burst set at runtime that wins over every replica's
// configured values until it is cleared or expires.
type Override struct {
	Rate  float64
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
	// MaxWait is the reservation horizon. If the tokens are not available
	// now but will be within max(MaxWait, Cost/rate), they are reserved and
	// TakeResult.Wait says when they are due. If MaxWait is 0, tokens are
	// taken only if available now.
	MaxWait time.Duration
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
	// Limits returns the rate and burst the store was configured with,
	// without any I/O. The Bucket uses them before it has heard from the
	// store, for example to size its fallback when the store is down from
	// the start.
	Limits() (rate float64, burst int)
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

// Notifier is implemented by stores that announce the changes operators and
// push-back make to a bucket (a rate override, a fill, a reset, a pause) to
// every replica. A Bucket that hears one takes again the reservations its
// callers are sleeping on, so the change reaches them within a round trip
// instead of after the reservation horizon.
type Notifier interface {
	// Watch calls changed for every announced change until ctx ends, then
	// returns. It resubscribes by itself after a connection failure, and
	// then calls changed once, since announcements may have been missed
	// while it was not subscribed.
	Watch(ctx context.Context, changed func())
}

// ValidateRate returns an error naming the parameter unless rate is a
// finite number above zero.
func ValidateRate(rate float64) error {
	if math.IsNaN(rate) || math.IsInf(rate, 0) || rate <= 0 {
		return &ParamError{Param: "rate", Msg: "must be a finite number > 0", Value: rate}
	}
	return nil
}

// ValidateBurst returns an error naming the parameter unless burst >= 1.
func ValidateBurst(burst int) error {
	if burst < 1 {
		return &ParamError{Param: "burst", Msg: "must be >= 1", Value: burst}
	}
	return nil
}

// ParamError is a bad parameter given to a constructor or a call.
type ParamError struct {
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
}

func (e *StoreError) Error() string {
	return "bucket " + strconv.Quote(e.Bucket) + ": " + e.Op + ": " + e.Err.Error()
}

func (e *StoreError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrStore) true for every StoreError.
func (e *StoreError) Is(target error) bool { return target == ErrStore }
