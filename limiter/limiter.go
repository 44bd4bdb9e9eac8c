package limiter

import (
	"errors"

	"github.com/throttlehq/throttle/internal/backend"
)

// Store keeps the state of one bucket: the Redis store of package
// limiter/redislimiter (redislimiter.New), or an in-process one
// (NewLocalStore). A program passes it to New; its methods are the
// Bucket's, and the stores of this module are its only implementations.
type Store interface{ backend.Store }

// State is a snapshot of a bucket, which Bucket.State returns. Its fields:
//
//   - Tokens: the tokens in the bucket now, negative while callers hold
//     reservations not yet due.
//   - Rate, Burst: the effective refill rate (tokens per second; 0 while
//     paused) and capacity: an operator's override if one is set, else
//     the configured values. BaseRate: the rate apart from a pause, the
//     adaptive rate when one is in force.
//   - ConfiguredRate, ConfiguredBurst: what this replica was started with.
//   - Override: the operator's override (Rate, Burst, ExpiresIn), or nil.
//   - PausedFor, PausedBy: how long the bucket stays paused, and the
//     replica whose push-back set the pause ("" when not recorded).
//   - Replicas: the live replicas known from heartbeats (0 when the store
//     does not track them).
//   - Reserved, Pushed: per class, the tokens reserved ahead and the push
//     counter (how far higher classes moved its reservations back).
//   - Mode: how the Bucket is limiting. At: the store's clock when it
//     answered.
type State = backend.State

// Mode says how a Bucket is limiting right now: ModeShared, or the policy
// it applies while its store fails (Options.OnStoreError).
type Mode = backend.Mode

// The modes of a Bucket. ModeShared is normal operation; the others are the
// policies for a store failure, chosen with Options.OnStoreError.
const (
	// ModeShared takes every token from the Store, shared by all replicas.
	ModeShared = backend.ModeShared
	// ModeLocal limits with an in-process bucket at this replica's share of
	// the rate while the Store is down. It is the default policy.
	ModeLocal = backend.ModeLocal
	// ModeClosed stops granting until the Store answers again. A Bucket is
	// also closed, whatever its policy, while the store reports
	// ErrMisconfigured, and while the store is down before this replica has
	// learnt how many replicas share the bucket (see Options.FallbackRate).
	ModeClosed = backend.ModeClosed
	// ModeOpen grants everything while the Store is down. It is dangerous:
	// the sink sees the unthrottled rate of every replica.
	ModeOpen = backend.ModeOpen
)

// Priority is a request's class. Across every replica and deployment that
// shares a bucket, a waiting request of a higher class gets tokens before
// any request of a lower class, including lower-class requests that already
// hold reservations further out: those reservations move back by the
// tokens the higher class took ahead of them. A lower class gets what the
// higher ones leave, and Options.MinShare keeps a floor under it. The zero
// value is PriorityNormal, so a caller that never names a class gets the
// behaviour of a bucket without classes. String gives "high", "normal" or
// "low".
type Priority = backend.Priority

// The classes, served in this order: PriorityHigh, then PriorityNormal,
// then PriorityLow. PriorityNormal is the zero value.
const (
	PriorityHigh   = backend.PriorityHigh
	PriorityNormal = backend.PriorityNormal
	PriorityLow    = backend.PriorityLow
)

// NumPriorities is the number of classes; Shares is indexed by Priority.
const NumPriorities = backend.NumPriorities

// ParsePriority parses "high", "normal" or "low". The empty string is
// PriorityNormal. Another string gives a *ParamError.
func ParsePriority(s string) (Priority, error) { return backend.ParsePriority(s) }

// Shares holds a fraction of the rate per class, indexed by Priority, such
// as Options.MinShare. The zero value is no floor for any class. Its
// Validate(param) returns a *ParamError naming param for a share outside
// [0, 1) or shares that add up to 1 or more.
type Shares = backend.Shares

// Backlog is the messages waiting at the broker for a consumer group or
// queue, as a replica last read it (Bucket.SetBacklog): Ready to be
// consumed, and SetAside by a delay layer until due. It is a plain value.
type Backlog = backend.Backlog

// Layer is a further limit that a message must pass together with the
// shared bucket: a keyed token bucket (Rate and Burst, one bucket per key,
// such as one per recipient) or a calendar quota (Quota per hour, day or
// month in a time zone, optionally one per key). Its OnExceed action says
// whether a request it cannot grant in time waits, is dead-lettered or is
// delayed (LimitError). The store decides the shared bucket and every layer
// in one atomic step: all of them grant, or none is charged. Give layers to
// NewLocal or NewLocalStore, or to the Redis store (redislimiter's
// Store.WithLayers). Its fields:
//
//   - Name: unique among the bucket's layers, not empty, without braces,
//     colons or white space; it names the layer in errors, metrics and
//     dead-letter headers.
//   - Keyed: one state per key, which each request names in Request.Keys;
//     a layer that is not keyed is one more limit shared by every message.
//   - Rate, Burst: a token bucket refilling at Rate tokens per second up
//     to Burst (0: one second of tokens, at least 1).
//   - Quota, Per, Location: a calendar quota instead, at most Quota tokens
//     per hour, day or month (PerHour, PerDay, PerMonth) in Location
//     (default UTC), counted from the window's start; Rate and Burst 0.
//   - OnExceed, MaxWait: what a request that the layer cannot grant within
//     MaxWait gets: ActionWait (the default) waits as long as needed;
//     ActionDeadLetter refuses at once with a *LimitError; ActionDelay
//     refuses with a *LimitError that says when the layer has room, and a
//     token-bucket delay layer books that room for the message
//     (LimitError.Reserved), which it claims back with Request.Paid.
//     MaxWait (default 0: no wait) only goes with dead_letter or delay.
//   - Concurrency, Lease: an in-flight cap instead, at most Concurrency
//     requests of a key holding a slot at once, from their grant
//     (Bucket.Acquire) to their release (Held.Release) or the end of
//     their Lease (default DefaultLease); Rate, Burst and Quota 0.
//
// A refusal charges no layer, but for that booking. IsQuota reports
// whether the layer is a quota. A store keeps state only for the keys in
// use: a keyed bucket's expires once it is full again, a quota's at the end
// of its window.
type Layer = backend.Layer

// DefaultLease is a concurrency layer's Layer.Lease when none is given:
// one minute.
const DefaultLease = backend.DefaultLease

// Layers are a bucket's layers, in order; a []Layer converts to it. Its
// Validate checks them and fills in their defaults in place (Burst,
// OnExceed, Location), returning a *ParamError per problem, joined, whose
// Param is "Layers[i].Field": each name unique, not empty and without
// braces, colons or white space; a token bucket's Rate above 0 and at most
// 1e9 and its Burst (0 for one second of tokens); a quota's Quota, Per and
// no Rate or Burst; OnExceed wait, dead_letter or delay, and a MaxWait only
// with dead_letter or delay. NewLocal and the stores call it.
type Layers = backend.Layers

// Action is what a layer does when it cannot grant within its MaxWait (see
// Layer.OnExceed).
type Action = backend.Action

// The actions of a layer: wait as long as needed (the default), refuse at
// once with a *LimitError for the dead-letter queue, or refuse with a
// *LimitError that says when the layer will have room.
const (
	ActionWait       = backend.ActionWait
	ActionDeadLetter = backend.ActionDeadLetter
	ActionDelay      = backend.ActionDelay
)

// Period is the window of a quota layer (Layer.Per).
type Period = backend.Period

// The quota windows. Each starts at the calendar boundary in the quota's
// time zone: the top of the hour, midnight, the first of the month.
const (
	PerHour  = backend.PerHour
	PerDay   = backend.PerDay
	PerMonth = backend.PerMonth
)

// LimitError is a request refused by a layer under its OnExceed action
// (ActionDeadLetter or ActionDelay), or for a cost the layer can never
// grant. It matches ErrLimitExceeded, and for such a cost also
// ErrCostExceedsBurst. Its Layer, Action, Reason and Wait say which layer
// refused, what to do with the message and when the layer has room; for a
// delay layer that booked the message's slot (Reserved), Slot returns the
// PaidSlot the message carries back in Request.Paid. Its fields:
//
//   - Layer, Action, Reason: the layer that refused, ActionDeadLetter or
//     ActionDelay (a cost that can never pass is ActionDeadLetter), and
//     why, in a few words for logs and dead-letter headers.
//   - Wait, RetryAt: how long after the store's answer the layer will have
//     room, and that instant on the store's clock (ActionDelay only); 0
//     for a cost that can never pass.
//   - Reserved, Key, Sig: set when a token-bucket delay layer booked the
//     message's tokens for RetryAt: the message's key in the layer and the
//     Bucket's signature of the slot. The slot stays spent if the message
//     never comes back, or comes back late.
type LimitError = backend.LimitError

// ShadowDecision is what a shadow layer (Layer.Shadow) would have done with
// a request that WaitN granted: Layer, Action ("" granted and charged on
// the layer's own state; ActionWait, ActionDeadLetter or ActionDelay had
// it been enforced) and Wait, how long after the decision the layer would
// have had room. A Bucket hands each to Observer.ShadowDecided.
type ShadowDecision = backend.ShadowDecision

// PaidSlot is a slot that a delay layer booked for a message
// (LimitError.Slot), which the message names when it comes back
// (Request.Paid) so that it passes the layer without taking from it again.
// The consumers carry it in a header, in JSON. A slot passes only with the
// signature (Sig) that the Bucket gave it: an HMAC-SHA256 of the bucket's
// name, the slot's layer, key and due instant with a secret that the Redis
// store keeps for the bucket (an in-process store: a secret of this
// process), so that a producer can neither make a slot nor move one to
// another layer, key or instant.
type PaidSlot = backend.PaidSlot

// Adaptive configures the adaptive rate (AIMD) of a bucket whose real limit
// is unknown or changes (Options.Adaptive): each push-back (Bucket.Pause)
// multiplies the rate by Decrease, down to MinRate; while none comes, the
// rate climbs back by Increase every Interval, up to the configured rate.
// The adaptive rate is state of the shared bucket, so every replica follows
// it, and replicas that report one push-back within MergeWindow of each
// other lower it once. An operator's override, and a reset, start again
// from the configured rate. Its fields, all but MinRate optional:
//
//   - MinRate: the floor, required: > 0 and at most the bucket's rate.
//   - Decrease: the factor of each push-back, > 0 and < 1; default 0.7.
//   - Increase, Interval: the climb, Increase tokens per second every
//     Interval (a continuous slope); defaults 1% of the configured rate
//     and 1s.
//   - MergeWindow: how long after a decrease further push-backs change
//     nothing; default 500ms.
//
// Validate checks the fields; ValidateFor also checks MinRate against the
// bucket's rate. Each returns a *ParamError per problem, joined.
type Adaptive = backend.Adaptive

// ParamError is a bad parameter given to a constructor or a call. Param is
// the Go name of the parameter or field, such as "Rate" or
// "Lease.Fraction".
type ParamError = backend.ParamError

// Sentinel errors. They are wrapped with context; test with errors.Is.
var (
	// ErrCostExceedsBurst is returned at once when a cost is larger than
	// the bucket's burst (or a layer's burst or quota): such a request
	// could never be granted.
	ErrCostExceedsBurst = backend.ErrCostExceedsBurst
	// ErrInvalidCost is returned for a cost below 1.
	ErrInvalidCost = backend.ErrInvalidCost
	// ErrStore wraps every failure of a Store: unreachable, timed out, a
	// script error or a malformed reply.
	ErrStore = backend.ErrStore
	// ErrClosed is returned by a Bucket after Close.
	ErrClosed = errors.New("bucket closed")
	// ErrMisconfigured is matched, besides ErrStore, by a store failure
	// that waiting will not cure: the store refused this client's
	// credentials, permissions or database, or cannot run its scripts. A
	// Bucket never falls back on it: it stops granting (ModeClosed) and
	// logs an error until the store answers again. Check returns it at
	// start, so that a program can exit instead of running unlimited.
	ErrMisconfigured = backend.ErrMisconfigured
	// ErrMissingKey is returned by WaitN when a keyed layer has no key in
	// Request.Keys, and by Wait and Allow on a store with a keyed layer.
	ErrMissingKey = backend.ErrMissingKey
	// ErrMissingHolder is returned by a layered store for a request
	// without a holder on a store with a concurrency layer; a Bucket
	// names one for each Acquire.
	ErrMissingHolder = backend.ErrMissingHolder
	// ErrLimitExceeded is matched by every *LimitError: a layer refused a
	// request under its OnExceed action, or a cost can never pass a
	// layer. No layer was charged.
	ErrLimitExceeded = backend.ErrLimitExceeded
)

// Fair shares a saturated shared bucket among tenants by weight (weighted
// max-min): while the bucket has tokens every request is granted as
// before; once requests queue, each tenant with requests waiting may hold
// at most its weighted share of Horizon in the queue (Rate · Horizon ·
// weight / the weights of the tenants holding reservations in the
// request's class), and a request over that share books nothing and asks
// again exactly when its tenant's reservations have come due far enough.
// Since the queue drains in order, each tenant's throughput follows what
// it holds: the shares follow the weights, what a tenant does not use goes
// to the others, an idle tenant holds nothing, and a newcomer waits at
// most behind the others' shares of the horizon. Each class shares within
// itself. Give it to NewLocalFairStore or redislimiter's
// Layered.WithFair; requests name their tenant in Request.Tenant. Its
// fields:
//
//   - Weights: the weight of named tenants, each > 0.
//   - DefaultWeight: the weight of any other tenant; default 1.
//   - Horizon: how far ahead, in time of the shared rate, the tenants
//     together hold reservations before their shares apply; default
//     500ms, between 1ms and 1m.
//
// Validate fills in the defaults and returns a *ParamError per problem,
// joined. The store keeps three numbers per tenant that holds
// reservations, which expire a second after its last one.
type Fair = backend.Fair

// FairLayer names a fair-share wait: in Observer.LayerWaited's layer, and
// the Layer of the *LimitError that Request.FairRefuse asks for.
const FairLayer = backend.FairLayer

// NewLocalFairStore is NewLocalStore with fair shares among tenants (see
// Fair): an in-process store that decides them with the shared bucket, in
// the same arithmetic as the Redis store's script.
func NewLocalFairStore(rate float64, burst int, fair Fair, layers ...Layer) (Store, error) {
	m, err := backend.NewMemory(rate, burst)
	if err != nil {
		return nil, err
	}
	lm, err := backend.NewLayeredMemory(m, layers)
	if err != nil {
		return nil, err
	}
	if err := lm.SetFair(fair); err != nil {
		return nil, err
	}
	return lm, nil
}
