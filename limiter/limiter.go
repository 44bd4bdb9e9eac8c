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

// State is a snapshot of a bucket: its tokens (negative while reserved
// ahead), effective and configured rate and burst, an operator's override,
// a pause, the live replicas, the tokens each class holds reserved, and the
// Bucket's Mode. Bucket.State returns it.
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

// Layer is a further limit that a message must pass together with the
// shared bucket: a keyed token bucket (Rate and Burst, one bucket per key,
// such as one per recipient) or a calendar quota (Quota per hour, day or
// month in a time zone, optionally one per key). Its OnExceed action says
// whether a request it cannot grant in time waits, is dead-lettered or is
// delayed (LimitError). The store decides the shared bucket and every layer
// in one atomic step: all of them grant, or none is charged. Give layers to
// NewLocal or NewLocalStore, or to the Redis store (redislimiter's
// Store.WithLayers).
type Layer = backend.Layer

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
// PaidSlot the message carries back in Request.Paid.
type LimitError = backend.LimitError

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
// Validate and ValidateFor check it.
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
	// ErrLimitExceeded is matched by every *LimitError: a layer refused a
	// request under its OnExceed action, or a cost can never pass a
	// layer. No layer was charged.
	ErrLimitExceeded = backend.ErrLimitExceeded
)
