package limiter

import (
	"errors"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// Options configure a Bucket. The zero value is ready to use; each field
// documents its default.
type Options struct {
	// MaxReserve is the reservation horizon: Wait reserves tokens that will
	// be due within max(MaxReserve, cost/rate), so that waiting replicas are
	// served in order with one store call per message. A caller beyond the
	// horizon is told how long to wait before it asks again. When more
	// callers wait than the rate serves within MaxReserve, the horizon grows
	// to fit them all (up to 10·MaxReserve), so that they queue instead of
	// coming back; a caller turned away by a horizon shorter than the
	// queue its answer shows asks again at once, once, and keeps its
	// place. When the store announces a rate
	// change or a pause, the Bucket reads the bucket once and moves every
	// reservation its callers sleep on to where the new rate or the pause
	// puts it, keeping their order. The local fallback uses the same
	// horizon. Default 1s.
	MaxReserve time.Duration
	// OnStoreError is the policy while the store is unreachable or too
	// slow: ModeLocal (the default), ModeClosed or ModeOpen. A store error
	// that matches ErrMisconfigured always closes the Bucket.
	OnStoreError Mode
	// FallbackRate is the rate of the local bucket in ModeLocal. Default:
	// the last effective rate divided by the live replicas seen in
	// heartbeats before the failure, less those that reported themselves
	// idle (Bucket.SetIdle). A replica that has never reached a
	// store that counts replicas (one started while Redis is down) does not
	// know its share: without a FallbackRate it stays closed until the
	// store answers, since any guess could let the fleet run above the
	// rate. Its local burst is the burst in the same proportion.
	FallbackRate float64
	// ProbeInterval is how often a Bucket in fallback asks the store
	// whether it is back. Default 1s.
	ProbeInterval time.Duration
	// ReplicaID names this replica in heartbeats. Default: host name,
	// process id and a counter.
	ReplicaID string
	// HeartbeatInterval is how often the Bucket reports itself alive to a
	// store that tracks replicas (the Redis store). A replica counts as gone after
	// three missed heartbeats. Default 3s.
	HeartbeatInterval time.Duration
	// MaxPause caps every Pause: it is the one cap on a push-back pause
	// (consumer.PushBack hands the bucket the delay a sink reported, as
	// it is). Bucket.MaxPause reports the cap in force. Default 60s.
	MaxPause time.Duration
	// Lease configures token leasing. Default: on, adapting to the rate.
	Lease LeaseOptions
	// Adaptive, when set, makes each Pause also lower the bucket's rate,
	// which then climbs back (AIMD; see Adaptive), in a store that
	// keeps an adaptive rate (the Redis store and NewLocalStore's). Default
	// nil: the rate stays the configured one.
	Adaptive *Adaptive
	// Priority is the class of Wait and Allow (WaitN uses its
	// Request.Priority as it is), and of the tokens this replica leases:
	// they serve only requests of this class. Default PriorityNormal.
	Priority Priority
	// MinShare keeps a floor under each class: while a class has
	// reservations waiting, the higher classes jump ahead of them only as
	// far as leaves it this fraction of the rate. A request the floor holds
	// back waits until it lets it through; the Bucket's callers of its
	// class queue behind it meanwhile, in order, instead of all asking the
	// store. Every replica that shares a bucket should name the same
	// shares. Default: none.
	MinShare Shares
	// Shadow makes the shared bucket a shadow: decided on every request
	// and recorded, never enforced, to see what its rate and burst would
	// do before they are turned on. Nothing waits for it and it charges
	// none of the shared bucket's state: the store decides it, in the
	// same call as the layers, on state of its own (in Redis,
	// PREFIX{NAME}:shadow) at the shared bucket's rate and burst (an
	// operator's override included), as a shadow layer with OnExceed wait
	// (see Layer.Shadow), and hands it to Observer.ShadowDecided with
	// Layer "" (SharedShadow); Stats.Exceeded counts its would-refusals
	// under "". The request is then limited by the enforced layers alone.
	// Because nothing is taken from the shared bucket, a shadow bucket
	// leases nothing (Lease is off) and queues no class (Priority,
	// MinShare: the shadow decides every class alike), and push-back
	// pauses, the adaptive rate and the warm-up do not hold its requests
	// back. It needs a store that decides layers (the Redis store's
	// WithLayers, with or without layers, or NewLocalStore; New wraps an
	// in-process bucket without layers itself) and no fair shares (they
	// divide the shared bucket's queue, which a shadow has not). Under
	// ModeLocal the fallback decides the shadow at this replica's share,
	// on fresh state. Default false: enforced.
	Shadow bool
	// Observer receives events for metrics. Default: none.
	Observer *Observer
	// Logger receives mode transitions. Default: slog.Default().
	Logger *slog.Logger
	// Clock is the Bucket's one time source for its timers (sleeps, probe,
	// heartbeats, lease expiry) and for the Observer. The token arithmetic
	// never uses it: the store has its own clock. Default: the system
	// clock. Only this module's tests set it.
	Clock backend.Clock
}

// Validate returns the *ParamError of every field out of range, joined,
// each naming the Go field (such as "FallbackRate" or "Lease.Fraction"),
// or nil. New calls it; a program may call it to check its configuration
// before it has a store.
func (o Options) Validate() error {
	var errs []error
	if o.OnStoreError != "" {
		if _, err := backend.ParseMode(string(o.OnStoreError)); err != nil {
			errs = append(errs, err)
		}
	}
	if o.FallbackRate != 0 {
		if err := backend.ValidateRate(o.FallbackRate); err != nil {
			errs = append(errs, &ParamError{Param: "FallbackRate", Msg: "must be 0 (the replica's share) or a number > 0 and <= " + strconv.FormatFloat(backend.MaxRate, 'g', -1, 64), Value: o.FallbackRate})
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"MaxReserve", o.MaxReserve}, {"ProbeInterval", o.ProbeInterval},
		{"HeartbeatInterval", o.HeartbeatInterval}, {"MaxPause", o.MaxPause}, {"Lease.Idle", o.Lease.Idle}, {"Lease.Hold", o.Lease.Hold},
	} {
		if d.v < 0 {
			errs = append(errs, &ParamError{Param: d.name, Msg: "must be >= 0 (0 for the default)", Value: d.v})
		}
	}
	if o.Priority >= NumPriorities {
		errs = append(errs, &ParamError{Param: "Priority", Msg: "must be high, normal or low", Value: o.Priority.String()})
	}
	if err := o.MinShare.Validate("MinShare"); err != nil {
		errs = append(errs, err)
	}
	if o.Adaptive != nil {
		errs = append(errs, o.Adaptive.Validate())
	}
	lease := o.Lease
	if err := lease.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ValidateFair returns a *ParamError naming Shadow when o makes the shared
// bucket a shadow on a store with fair shares f (nil: none), which New
// refuses: fair shares divide the shared bucket's queue, which a shadow
// bucket has not.
func (o Options) ValidateFair(f *Fair) error {
	if o.Shadow && f != nil {
		return &ParamError{Param: "Shadow", Msg: "cannot go with fair shares: they divide the shared bucket's queue, which a shadow bucket has not", Value: true}
	}
	return nil
}

// withDefaults returns o with every zero field set to its default. o is
// valid.
func (o Options) withDefaults() Options {
	if o.MaxReserve <= 0 {
		o.MaxReserve = time.Second
	}
	if o.OnStoreError == "" {
		o.OnStoreError = ModeLocal
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = time.Second
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = 3 * time.Second
	}
	if o.MaxPause <= 0 {
		o.MaxPause = time.Minute
	}
	if o.ReplicaID == "" {
		host, _ := os.Hostname()
		o.ReplicaID = host + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(replicaSeq.Add(1), 10)
	}
	_ = o.Lease.validate() // sets the lease defaults
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = backend.SystemClock
	}
	return o
}

var replicaSeq atomic.Int64

// Observer receives a Bucket's events, for metrics. Every field is optional.
// The functions are called from many goroutines and must be safe for that.
type Observer struct {
	// Waited is called after each successful Wait or WaitN with the time
	// it blocked.
	Waited func(d time.Duration)
	// Took is called after each store answer with the bucket's tokens,
	// effective rate and burst.
	Took func(remaining, rate float64, burst int)
	// ModeChanged is called once per transition, just after Mode reports
	// the new mode. err is the store error that caused it, or nil on
	// recovery.
	ModeChanged func(from, to Mode, err error)
	// StoreError is called for every failed store call.
	StoreError func(err error)
	// Paused is called when this Bucket learns of a push-back pause of the
	// shared bucket: its own Pause (by is its ReplicaID), or a pause that
	// another replica set, heard as an announcement of a store that
	// announces changes (the Redis store; by is that replica's ID when it
	// records it, else ""). d is how long the pause still holds. It is called from
	// the Bucket's own goroutines and must not block.
	Paused func(d time.Duration, by string)
	// LayerWaited is called after each successful WaitN on a layered
	// store (besides Waited), with the time it blocked and the layer whose
	// wait was the longest: "" for the shared bucket, or when it did not
	// wait.
	LayerWaited func(layer string, d time.Duration)
	// LimitExceeded is called when a layer refuses a WaitN under its
	// OnExceed action (ActionDeadLetter or ActionDelay), or for a cost it
	// can never grant (ActionDeadLetter).
	LimitExceeded func(layer string, action Action)
	// ShadowDecided is called, for each shadow layer (Layer.Shadow), with
	// its decision on a request that WaitN was granted: once per message
	// and shadow layer, when the store grants it (before the Bucket
	// sleeps on a reservation). A shadow layer is never enforced, so it
	// reaches LimitExceeded never.
	ShadowDecided func(d ShadowDecision)
	// PaidRefused is called for each paid slot (Request.Paid) that WaitN
	// refused for a missing or wrong signature (see PaidSlot), with
	// the layer it names if the store has that layer, else ""; the layer
	// then decided as usual.
	PaidRefused func(layer string)
	// PaidForfeit is called for each paid slot that WaitN could not
	// honour (see Stats.PaidForfeit), with the layer it names.
	PaidForfeit func(layer string)
	// PriorityWaited is called after each successful Wait or WaitN
	// (besides Waited) with the request's class and the time it blocked.
	PriorityWaited func(p Priority, d time.Duration)
}
