package backend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// A Layer is a further limit that a message must pass together with the
// shared bucket: a keyed token bucket (Rate and Burst, one bucket per key,
// such as one per recipient) or a calendar quota (Quota per hour, day or
// month in a time zone, optionally one per key). A layered store decides the
// shared bucket and every layer in one atomic step: all of them grant, or
// none is charged.
//
// A missing key state means a full bucket or an unused quota, so a store
// keeps state only for the keys in use: a keyed bucket's state expires once
// it is full again, a quota's at the end of its window.
type Layer struct {
	// Name names the layer in errors, metrics and dead-letter headers. It
	// must be unique among the layers of a bucket, and may not be empty or
	// contain braces, colons or white space (it is part of Redis keys).
	Name string
	// Keyed makes the layer hold one state per key: each request then
	// names its key (LayerRequest.Keys). A layer that is not keyed is one
	// more limit shared by every message.
	Keyed bool
	// Rate and Burst make the layer a token bucket refilling at Rate tokens
	// per second up to Burst. A Burst of 0 means DefaultBurst(Rate).
	Rate  float64
	Burst int
	// Quota makes the layer a calendar quota instead: at most Quota tokens
	// per calendar Per in Location, counted from the window's start. Rate
	// and Burst must then be 0.
	Quota int
	// Per is the quota's window: PerHour, PerDay or PerMonth.
	Per Period
	// Location is the time zone of a quota's or a budget's windows.
	// Default UTC.
	Location *time.Location
	// Concurrency makes the layer an in-flight cap instead: at most
	// Concurrency requests of a key (or of the layer, without keys) hold
	// a slot at once, from their grant until their holder releases it
	// (SlotStore.ReleaseSlots) or its Lease ends. Rate, Burst and Quota
	// must then be 0. A request that finds every slot held waits (or is
	// refused, under OnExceed) until one is released or the earliest lease
	// ends.
	Concurrency int
	// Lease is how long a concurrency slot is held at most: a holder that
	// dies without releasing it (a replica killed) gives it back then.
	// It counts from the instant the request goes out. Default
	// DefaultLease. Only with Concurrency.
	Lease time.Duration
	// Budget makes the layer a spend budget instead: a quota in money, at
	// most Budget (in micro-units of the prices' currency) per calendar
	// Per in Location, each request charged its Price
	// (LayerRequest.Price) rather than its Cost. Rate, Burst and Quota
	// must then be 0. It behaves as a quota in everything else.
	Budget Amount
	// Window makes the layer a send window instead (see Window): it
	// grants only while the key's local time is inside the window, and
	// charges nothing. Rate, Burst, Quota and Budget must then be 0, and
	// OnExceed defaults to ActionDelay: a message outside its window is
	// set aside until it opens. Keyed must be set when the window reads
	// its keys as telephone numbers (Window.ByNumber or Countries).
	Window *Window
	// OnExceed is what happens when the layer cannot grant within MaxWait:
	// ActionWait (the default) waits as long as needed, ActionDeadLetter
	// refuses at once with a *LimitError, ActionDelay refuses with a
	// *LimitError that says when the layer will have room. A refusal
	// charges no layer, with one exception: a token-bucket layer with
	// ActionDelay that refuses books the message's tokens on itself for the
	// instant it will have room (LimitError.Reserved), first come first
	// served behind the slots it booked before, so that the messages it
	// sets aside together come back one slot apart. The message then
	// comes back naming the layer in LayerRequest.Paid, and passes it
	// without taking from it again.
	OnExceed Action
	// MaxWait is the longest wait for this layer that a request is
	// granted; a longer one is refused at once under OnExceed, decided
	// when the store answers (the request does not wait MaxWait first).
	// Only with ActionDeadLetter or ActionDelay. Default 0: any wait for
	// this layer is refused. It is not a bound on a caller's wait: that is
	// the caller's context (consumer.LimitOptions.WaitTimeout), and the
	// bucket's reservation horizon is Options.MaxReserve.
	MaxWait time.Duration
	// Shadow makes the layer decide and report but never enforce: it
	// never makes a request wait, refuses it or books a slot, and a
	// request's result (Granted, Wait, Exceeded, LayersDue) is what it
	// would be without the layer. It keeps a state of its own (in Redis
	// under keys of its own, see redislimiter.Layered), charged at the
	// request's send instant, as an enforced layer would be, only when it
	// would have granted the request then; when it would not have, it is
	// charged nothing and the request's LayerResult.Shadow says what it
	// would have done. Its decision is made in the same atomic step as
	// the other layers'. Refunds and moved reservations leave it as
	// charged. A token bucket or a quota may be a shadow, not a
	// concurrency layer. Default false: enforced.
	Shadow bool
}

// IsQuota reports whether the layer is a calendar quota.
func (l Layer) IsQuota() bool { return l.Quota > 0 }

// IsConcurrency reports whether the layer is an in-flight cap
// (Layer.Concurrency).
func (l Layer) IsConcurrency() bool { return l.Concurrency > 0 }

// IsBucket reports whether the layer is a keyed token bucket: neither a
// quota, a concurrency cap, a budget nor a send window.
func (l Layer) IsBucket() bool {
	return !l.IsQuota() && !l.IsConcurrency() && !l.IsBudget() && !l.IsWindow()
}

// DefaultLease is a concurrency layer's Lease when none is given.
const DefaultLease = time.Minute

// ConcurrencyRetry is the longest a concurrency layer with ActionDelay
// asks a refused request to stay away (LimitError.Wait): a slot frees when
// its holder releases it, which no store can foresee, so the request comes
// back after this, or at the earliest lease end when sooner.
const ConcurrencyRetry = time.Second

// Period is the window of a quota.
type Period string

// The quota windows. Each starts at the calendar boundary in the quota's
// time zone: the top of the hour, midnight, the first of the month.
const (
	PerHour  Period = "hour"
	PerDay   Period = "day"
	PerMonth Period = "month"
)

// Action is what a layer does when it cannot grant within its MaxWait.
type Action string

// The actions of a layer; see Layer.OnExceed.
const (
	ActionWait       Action = "wait"
	ActionDeadLetter Action = "dead_letter"
	ActionDelay      Action = "delay"
)

// ParseAction parses "wait", "dead_letter" or "delay"; "" is ActionWait.
func ParseAction(s string) (Action, error) {
	switch a := Action(s); a {
	case "":
		return ActionWait, nil
	case ActionWait, ActionDeadLetter, ActionDelay:
		return a, nil
	}
	return "", &ParamError{Param: "OnExceed", Msg: "must be wait, dead_letter or delay", Value: s}
}

// ParsePeriod parses "hour", "day" or "month".
func ParsePeriod(s string) (Period, error) {
	switch p := Period(s); p {
	case PerHour, PerDay, PerMonth:
		return p, nil
	}
	return "", &ParamError{Param: "Per", Msg: "must be hour, day or month", Value: s}
}

// QuotaWindow returns the calendar window of p, in loc (nil: UTC), that holds t:
// [start, end). Days and months follow the calendar through daylight-saving
// changes, so a day may last 23 or 25 hours. An hour starts where loc's
// clock shows minute 0; in the repeated hour of a fall-back change those are
// two distinct windows.
func QuotaWindow(p Period, t time.Time, loc *time.Location) (start, end time.Time) {
	if loc == nil {
		loc = time.UTC
	}
	lt := t.In(loc)
	switch p {
	case PerHour:
		// Subtracting the local minutes keeps to the right side of a
		// fall-back change, where time.Date's choice is not defined.
		start = lt.Add(-time.Duration(lt.Minute())*time.Minute - time.Duration(lt.Second())*time.Second - time.Duration(lt.Nanosecond()))
		return start, start.Add(time.Hour)
	case PerMonth:
		y, m, _ := lt.Date()
		return time.Date(y, m, 1, 0, 0, 0, 0, loc), time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	default:
		y, m, d := lt.Date()
		return time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	}
}

// QuotaWindows returns four boundaries b0 < b1 < b2 < b3 of p around t: the
// windows [b0, b1), [b1, b2) ∋ t and [b2, b3). A store whose clock is not
// the caller's picks the window that holds its own time, so a skew smaller
// than a window never charges the wrong one.
func QuotaWindows(p Period, t time.Time, loc *time.Location) [4]time.Time {
	start, end := QuotaWindow(p, t, loc)
	prev, _ := QuotaWindow(p, start.Add(-time.Nanosecond), loc)
	_, next := QuotaWindow(p, end, loc)
	return [4]time.Time{prev, start, end, next}
}

// Layers are a bucket's layers, in order.
type Layers []Layer

// Validate checks the layers and fills in their defaults (Burst, OnExceed,
// Location), as ValidateLayers.
func (ls Layers) Validate() error { return ValidateLayers(ls) }

// ValidateLayers checks a bucket's layers and fills in their defaults (Burst,
// OnExceed, Location). Errors are *ParamError whose Param is
// "Layers[i].Field", joined with errors.Join.
func ValidateLayers(layers []Layer) error {
	var errs []error
	seen := map[string]bool{}
	for i := range layers {
		l := &layers[i]
		bad := func(field, msg string, v any) {
			errs = append(errs, &ParamError{Param: "Layers[" + strconv.Itoa(i) + "]." + field, Msg: msg, Value: v})
		}
		switch {
		case l.Name == "":
			bad("Name", "must not be empty", nil)
		case strings.ContainsAny(l.Name, "{}: \t\r\n"):
			bad("Name", "must not contain braces, colons or white space", l.Name)
		case seen[l.Name]:
			bad("Name", "is used by another layer", l.Name)
		}
		seen[l.Name] = true
		if l.OnExceed == "" {
			l.OnExceed = ActionWait
			if l.Window != nil {
				l.OnExceed = ActionDelay
			}
		}
		if _, err := ParseAction(string(l.OnExceed)); err != nil {
			bad("OnExceed", "must be wait, dead_letter or delay", string(l.OnExceed))
		}
		if l.MaxWait < 0 {
			bad("MaxWait", "must be >= 0", l.MaxWait)
		} else if l.MaxWait > 0 && l.OnExceed == ActionWait {
			bad("MaxWait", "applies only with OnExceed dead_letter or delay", l.MaxWait)
		}
		if l.Concurrency != 0 || l.Lease != 0 {
			if l.Rate != 0 || l.Burst != 0 || l.Quota != 0 || l.Per != "" {
				bad("Concurrency", "a concurrency layer takes no Rate, Burst, Quota or Per", l.Concurrency)
			}
			if l.Concurrency < 1 || l.Concurrency > MaxBurst {
				bad("Concurrency", "must be >= 1 and <= "+strconv.Itoa(MaxBurst), l.Concurrency)
			}
			if l.Shadow {
				bad("Shadow", "a concurrency layer cannot be a shadow: its slots are held until released", true)
			}
			if l.Lease < 0 {
				bad("Lease", "must be >= 0", l.Lease)
			} else if l.Lease == 0 {
				l.Lease = DefaultLease
			} else if l.Lease < time.Millisecond {
				bad("Lease", "must be at least 1ms", l.Lease)
			}
			continue
		}
		if l.Window != nil {
			if l.Rate != 0 || l.Burst != 0 || l.Quota != 0 || l.Budget != 0 || l.Per != "" {
				bad("Window", "a window takes no Rate, Burst, Quota, Budget or Per", nil)
			}
			if err := l.Window.validate("Layers[" + strconv.Itoa(i) + "].Window"); err != nil {
				errs = append(errs, err)
			}
			if l.Window.needsNumber() && !l.Keyed {
				bad("Keyed", "a window that reads its keys as telephone numbers (ByNumber, Countries) must be keyed", false)
			}
			continue
		}
		if l.Budget != 0 {
			if l.Rate != 0 || l.Burst != 0 || l.Quota != 0 {
				bad("Budget", "a budget takes no Rate, Burst or Quota", l.Budget)
			}
			if l.Budget < 1 || l.Budget > MaxAmount {
				bad("Budget", "must be > 0 and at most 2^53 micro-units", l.Budget)
			}
			if _, err := ParsePeriod(string(l.Per)); err != nil {
				bad("Per", "must be hour, day or month", string(l.Per))
			}
			if l.Location == nil {
				l.Location = time.UTC
			}
			continue
		}
		if l.Quota != 0 || l.Per != "" {
			if l.Rate != 0 || l.Burst != 0 {
				bad("Quota", "a quota takes no Rate or Burst", l.Quota)
			}
			if l.Quota < 1 || l.Quota > MaxBurst {
				bad("Quota", "must be >= 1 and <= "+strconv.Itoa(MaxBurst), l.Quota)
			}
			if _, err := ParsePeriod(string(l.Per)); err != nil {
				bad("Per", "must be hour, day or month", string(l.Per))
			}
			if l.Location == nil {
				l.Location = time.UTC
			}
			continue
		}
		if l.Rate == 0 && l.Burst == 0 {
			bad("Rate", "needs a rate (Rate, a token bucket) or a quota (Quota and Per), or a Concurrency", nil)
			continue
		}
		if err := ValidateRate(l.Rate); err != nil {
			bad("Rate", err.(*ParamError).Msg, l.Rate)
			continue
		}
		if l.Burst == 0 {
			l.Burst = DefaultBurst(l.Rate)
		}
		if err := ValidateBurst(l.Burst); err != nil {
			bad("Burst", err.(*ParamError).Msg, l.Burst)
		}
	}
	return errors.Join(errs...)
}

// ErrLimitExceeded is matched by every *LimitError: a layer refused a request
// under its OnExceed action (dead_letter or delay), or a cost can never pass
// a layer. No layer was charged.
var ErrLimitExceeded = errors.New("limit exceeded")

// LimitError is a request refused by a layer. It matches ErrLimitExceeded;
// one for a cost above a layer's burst or quota also matches
// ErrCostExceedsBurst.
type LimitError struct {
	// Layer is the name of the layer that refused.
	Layer string
	// Action is ActionDeadLetter or ActionDelay: what the caller should do
	// with the message. A cost that can never pass is ActionDeadLetter.
	Action Action
	// Reason says why, in a few words, for logs and dead-letter headers.
	Reason string
	// Wait is how long after the store's answer the layer will have room,
	// if nobody else takes it first; RetryAt is that instant on the
	// store's clock, set for ActionDelay only. Both are 0 for a cost that
	// can never pass. When Reserved is set, the room at RetryAt is this
	// message's: nobody else can take it.
	Wait    time.Duration
	RetryAt time.Time
	// Reserved is set when the layer, a token bucket with ActionDelay,
	// booked the message's tokens for RetryAt (see Layer.OnExceed). The
	// message should come back then with a PaidSlot of Layer, Key and
	// RetryAt in LayerRequest.Paid (or Request.Paid); the slot stays spent
	// if it never comes back, or comes back late.
	Reserved bool
	// Key is the message's key in the layer ("" for a layer without
	// keys), set with Reserved.
	Key string
	// Spacing is, for a refusal by the fair share (Layer FairLayer), how
	// far apart the tenant's reservations come due now (its pace) times
	// the live replicas, by which a consumer spaces the messages of the
	// tenant it sets aside: each replica sets aside about its share of
	// them, and together they come back at the tenant's pace.
	Spacing time.Duration
	// Sig is the signature that a Bucket's WaitN gives a booked slot
	// (with Reserved), which the slot carries back (PaidSlot.Sig, see
	// Slot); "" when the Bucket could not sign it, in which case the slot
	// will not pass the layer. Stores leave it empty.
	Sig string
	err error
	// booked is the store's clock when it booked the slot (with
	// Reserved): PaidSlot.Booked.
	booked time.Time
}

func (e *LimitError) Error() string {
	return "limit " + strconv.Quote(e.Layer) + ": " + e.Reason
}

// Is makes errors.Is(err, ErrLimitExceeded) true.
func (e *LimitError) Is(target error) bool { return target == ErrLimitExceeded }

// Unwrap returns ErrCostExceedsBurst for a cost that can never pass.
func (e *LimitError) Unwrap() error { return e.err }

// LayerRequest asks a layered store for a message's tokens on the shared
// bucket and on every layer.
type LayerRequest struct {
	// Cost is the number of tokens, at least 1, charged on every layer.
	Cost int
	// MaxWait is the reservation horizon, as in TakeRequest: when the
	// longest wait of all layers is within max(MaxWait, Cost/rate of the
	// shared bucket), every layer is charged and Wait says when the tokens
	// are due.
	MaxWait time.Duration
	// Keys maps the name of each keyed layer to this message's key. A keyed
	// layer without a key, or with an empty one, fails the request with
	// ErrMissingKey.
	Keys map[string]string
	// SkipShared leaves the shared bucket out of the decision: the caller
	// already holds the shared tokens (from its lease), or the shared
	// bucket is a shadow (ShadowShared).
	SkipShared bool
	// ShadowShared, with SkipShared, decides the shared bucket as a
	// shadow (limiter.Options.Shadow): on state of its own, at the
	// shared bucket's rate and burst (an operator's override included;
	// no adaptive rate, warm-up, pause or class), as a shadow layer with
	// OnExceed wait is decided. Its decision comes first in
	// LayerResult.Shadow, with Layer "" (SharedShadow).
	ShadowShared bool
	// Extra asks for up to this many more tokens of the shared bucket (a
	// lease), granted only when the whole request is granted without a
	// wait, and only from tokens the shared bucket holds now. The layers
	// are charged Cost only. LayerResult.Tokens counts them.
	Extra int
	// Priority and MinShare are the request's class and the classes'
	// floors on the shared bucket, as in TakeRequest. LayerResult.Class
	// says which class's queue holds a reservation; RefundLayers gives it
	// back there.
	Priority Priority
	MinShare Shares
	// Price is what the request costs on every budget layer
	// (Layer.Budget), in micro-units of the budget's currency. A price
	// above a budget fails the request with a *LimitError (ActionDeadLetter,
	// matching ErrCostExceedsBurst); 0 passes every budget uncharged.
	Price Amount
	// Paid names the slots this message already paid for: those that a
	// delay layer booked when it refused the message
	// (LimitError.Reserved). A layer with such a slot, for this request's
	// key in it, and not late, never makes the request wait or refuses
	// it; the shared bucket and the other layers are decided as usual. A
	// slot more than PaidLateness late is forfeit: the message could
	// otherwise be sent right next to the one booked after it, over the
	// layer's rate, so the layer is decided as usual. A slot that does
	// not name a token-bucket layer with ActionDelay, or whose key is not
	// this request's key in it, is ignored too.
	//
	// A layer passed on a slot is charged nothing while it is still booked
	// up to the slot or beyond. After it refilled past its burst less the
	// cost (the last slot came back a little late), it is charged the
	// excess, max(0, tokens + cost - burst), as if the slot had been
	// given back at its time and taken again now. A refund gives nothing
	// back on such a layer.
	Paid []PaidSlot
	// Tenant names the request's tenant on a store with fair shares
	// (Fair): "" leaves the request out of them. Ignored with SkipShared
	// and by a store without fair shares.
	Tenant string
	// Holder names the request in the concurrency layers' slots: it must
	// be set, and unique to the request, when the store has a concurrency
	// layer (else ErrMissingHolder). A request whose holder already holds
	// a key's slot keeps it (its lease counted again from this send), so
	// that a request decided again does not take a second one. Release
	// the slots with SlotStore.ReleaseSlots.
	Holder string
}

// ErrMissingHolder is returned for a request without a Holder on a store
// with a concurrency layer.
var ErrMissingHolder = errors.New("missing slot holder")

// SlotRelease names one concurrency slot to give back: the layer, the
// request's key in it ("" for a layer without keys) and its holder
// (LayerRequest.Holder).
type SlotRelease struct {
	Layer, Key, Holder string
}

// SlotStore is a LayeredStore with concurrency layers: ReleaseSlots gives
// back the slots that granted requests hold, all in one call where the
// store can, and wakes the requests that wait for them on every replica.
// Releasing a slot that is not held (released before, or its lease ended)
// does nothing.
type SlotStore interface {
	ReleaseSlots(ctx context.Context, slots []SlotRelease) error
}

// ReleaseWaiter is a SlotStore whose ReleaseSlots may return before the
// release is sent, by a goroutine of the store's: WaitReleases waits until
// every such goroutine ended (its call answered or failed), or ctx ends.
// Bucket.Close calls it, so that nothing the Bucket's callers started
// outlives the Bucket.
type ReleaseWaiter interface {
	WaitReleases(ctx context.Context) error
}

// LayerCharge is what a key of a layer owes the store: what a Bucket's
// local fallback granted on it while the store was down (LayerCharger).
// Key is "" for a layer without keys. Tokens are a token bucket's tokens,
// a quota's, or a budget's money in millionths of a unit (Amount). At is
// when the last of them went out: a quota or budget is charged in the
// window holding At, and only while that window lasts.
type LayerCharge struct {
	Layer  string
	Key    string
	Tokens float64
	At     time.Time
}

// LayerCharger is a LayeredStore that charges layer keys without deciding
// anything: ChargeLayers takes each charge's Tokens from its token bucket as
// of now (the key may go below zero, and waits the longer), or adds them to
// its quota's or budget's use in the window holding At while that window
// is the store's current one; it skips a charge of a shadow layer, of a
// layer without state (a concurrency layer, a send window) or of no layer
// of the store. A Bucket that comes back from its local fallback charges it
// with what the fallback granted, so that a key sent locally does not go
// again through the store within its spacing, and a quota or budget spent
// locally is not spent again (the store never saw the local sends).
type LayerCharger interface {
	ChargeLayers(ctx context.Context, charges []LayerCharge) error
}

// Charged reports how a LayerCharger charges layer l: a token bucket's
// tokens (counted false), a quota's or budget's use in a window (counted
// true, see ChargeWindow), or not at all (ok false: a shadow layer, a
// concurrency layer or a send window).
func Charged(l Layer) (counted, ok bool) {
	if l.Shadow {
		return false, false
	}
	if l.counted() {
		return true, true
	}
	return false, l.IsBucket()
}

// ChargeWindow returns the window [start, end) of the quota or budget l
// that holds at.
func ChargeWindow(l Layer, at time.Time) (start, end time.Time) {
	w := QuotaWindows(l.Per, at, l.Location)
	return w[1], w[2]
}

// SlotNotifier is a SlotStore that announces releases to every replica:
// WatchSlots calls released with the layer and key of each release that
// freed a slot of a key whose slots were all held, until ctx ends, and all
// when announcements may have been missed (a resubscription), so that
// every waiter asks again. The callbacks must not block.
type SlotNotifier interface {
	WatchSlots(ctx context.Context, released func(layer, key string), all func())
}

// Slots returns the slots a request with keys (LayerKeys) and holder
// holds after its grant: one per concurrency layer.
func Slots(layers []Layer, keys []string, holder string) []SlotRelease {
	var out []SlotRelease
	for i, l := range layers {
		if l.IsConcurrency() {
			out = append(out, SlotRelease{Layer: l.Name, Key: keys[i], Holder: holder})
		}
	}
	return out
}

// HasConcurrency reports whether any of layers is a concurrency layer.
func HasConcurrency(layers []Layer) bool {
	for _, l := range layers {
		if l.IsConcurrency() {
			return true
		}
	}
	return false
}

// PaidSlot is a slot that a delay layer booked for a message
// (LimitError.Reserved), which the message names when it comes back
// (LayerRequest.Paid). The consumers carry it in a header, in JSON.
type PaidSlot struct {
	// Layer and Key name the layer and the message's key in it ("" for a
	// layer without keys): LimitError.Layer and LimitError.Key.
	Layer string `json:"layer"`
	Key   string `json:"key"`
	// Due is the instant the slot was booked for, on the store's clock:
	// LimitError.RetryAt.
	Due time.Time `json:"due"`
	// Booked is the instant the store booked the slot, on its clock. A
	// store honours the slot only while the layer's state for its key has
	// been kept since then: one made again after Booked (Redis restarted
	// empty, a replica's local fallback) never held it. A slot without it
	// (booked by an older version) passes only a state older than this
	// version's.
	Booked time.Time `json:"booked,omitzero"`
	// Sig is the Bucket's signature of the slot (LimitError.Sig): a
	// Bucket's WaitN lets only the slots signed with its bucket's secret
	// reach the store (see PaidSecretStore).
	Sig string `json:"sig,omitempty"`
}

// PaidLateness returns how late after its Due a slot of layer l still
// counts as paid (see LayerRequest.Paid): 10% of the time the layer takes
// to refill one token, between 25 ms and 1 s. It is the jitter allowed to
// the delay topic or queue that brings the message back: a message back
// that late may be sent that much closer to the one after it than the
// layer's spacing, so that a key's messages keep at least 90% of it
// (less for a layer faster than 4/s, whose floor is 25 ms). One back later forfeits its slot and takes the layer
// again, which keeps to the layer's rate but sets the message aside again,
// behind the slots booked meanwhile.
func PaidLateness(l Layer) time.Duration {
	d := time.Duration(min(0.10/l.Rate, 1) * float64(time.Second))
	return min(max(d, 25*time.Millisecond), time.Second)
}

// PaidUntil returns, in the order of layers, the last instant on the
// store's clock at which the request whose keys are keys (see LayerKeys)
// passes each layer on a slot it paid for (LayerRequest.Paid): the slot's
// Due plus PaidLateness, for a token-bucket layer with ActionDelay and the
// request's key in it; the zero time for a layer without such a slot. It
// returns nil when no layer has one. A store that decides on a clock of
// its own compares them there (PaidLayers does it for a given instant).
func PaidUntil(layers []Layer, keys []string, paid []PaidSlot) []time.Time {
	slots := PaidSlots(layers, keys, paid)
	if slots == nil {
		return nil
	}
	out := make([]time.Time, len(layers))
	for i, s := range slots {
		out[i] = PaidSlotUntil(layers[i], s)
	}
	return out
}

// PaidSlotUntil returns the last instant at which a request passes layer
// l on slot s (one of PaidSlots): its Due plus PaidLateness, or the zero
// time for a zero slot.
func PaidSlotUntil(l Layer, s PaidSlot) time.Time {
	if s.Due.IsZero() {
		return time.Time{}
	}
	return s.Due.Add(PaidLateness(l))
}

// PaidSlots returns, in the order of layers, the slot the request whose
// keys are keys paid for on each (of those naming the layer and the
// request's key in it, the latest Due), a zero PaidSlot for a layer
// without one, or nil when no layer has one. A store honours a slot only
// while the layer's state for its key still holds it (PaidHeld).
func PaidSlots(layers []Layer, keys []string, paid []PaidSlot) []PaidSlot {
	if len(paid) == 0 {
		return nil
	}
	var out []PaidSlot
	for i, l := range layers {
		if l.OnExceed != ActionDelay || !l.IsBucket() || l.Shadow {
			continue
		}
		for _, s := range paid {
			if s.Layer != l.Name || s.Key != keys[i] {
				continue
			}
			if out == nil {
				out = make([]PaidSlot, len(layers))
			}
			if s.Due.After(out[i].Due) {
				out[i] = s
			}
		}
	}
	return out
}

// PaidHeld reports whether a layer's state for a key still holds slot s:
// its last send instant (µs) at or after s.Due, less a millisecond, and
// the state kept since s was booked, not made again after (created, µs;
// 0 for a state older than this version's, made before it kept the
// instant). A slot booked in a state the store has lost since (Redis
// restarted empty, a replica's local fallback) is decided as usual, or
// the key would get its fresh burst and the old slot both; a fresh state
// that booked past the slot's Due meanwhile would hold it otherwise.
func PaidHeld(s PaidSlot, last, created int64) bool {
	return last >= s.Due.UnixMicro()-1000 && created <= PaidBookedMicro(s)
}

// PaidBookedMicro returns s.Booked in Unix µs, or 0 for a slot without it
// (booked by an older version).
func PaidBookedMicro(s PaidSlot) int64 {
	if s.Booked.IsZero() {
		return 0
	}
	return s.Booked.UnixMicro()
}

// PaidLayers returns, in the order of layers, which of them the request
// whose keys are keys passes on a slot it paid for at now, the store's
// clock (PaidUntil), or nil when none. Every store decides which slots
// count with it, and charges such a layer PaidCharge.
func PaidLayers(layers []Layer, keys []string, paid []PaidSlot, now time.Time) []bool {
	var out []bool
	for i, u := range PaidUntil(layers, keys, paid) {
		if u.IsZero() || now.After(u) {
			continue
		}
		if out == nil {
			out = make([]bool, len(layers))
		}
		out[i] = true
	}
	return out
}

// PaidCharge returns what a request of cost paid for on a layer of burst
// (see LayerRequest.Paid) is charged when the layer holds tokens: the
// excess over what a slot given back at its time would have left room for,
// max(0, tokens + cost - burst).
func PaidCharge(tokens, cost, burst float64) float64 {
	return max(0, tokens+cost-burst)
}

// ReservesOnRefusal reports whether layer l, refusing a request whose wait
// on it is waitUS microseconds, books the request's slot (see
// Layer.OnExceed): a token bucket with ActionDelay, and a wait below the
// longest a store computes (about 31 years), which means no room ever.
// A quota books nothing ahead: its refusal names the start of its next
// window, as a quota with ActionWait does.
func ReservesOnRefusal(l Layer, waitUS int64) bool {
	return l.OnExceed == ActionDelay && l.IsBucket() && waitUS < maxWaitUS
}

// ErrMissingKey is returned for a request that does not name the key of a
// keyed layer.
var ErrMissingKey = errors.New("missing layer key")

// LayerResult is a layered store's answer.
type LayerResult struct {
	// TakeResult is the answer as a whole: Granted and Wait (the longest
	// wait of the layers) for all layers; Tokens is Cost plus the Extra
	// shared tokens granted; Remaining, Rate and Burst describe
	// the shared bucket (zero with SkipShared); At is the store's clock.
	TakeResult
	// Limiting names the layer whose wait is Wait, or "" for the shared
	// bucket (also when nobody waits).
	Limiting string
	// FairActive is, on a store with fair shares and for a request with a
	// Tenant, the number of tenants of its class that hold reservations not
	// yet due after the call; 0 otherwise.
	FairActive int
	// FairSpacing is, when Limiting is FairLayer, how far apart the
	// tenant's reservations come due now (LimitError.Spacing).
	FairSpacing time.Duration
	// LayersDue is, for a granted request, how long after At every layer
	// had room: at most Wait, which is the shared bucket's. The layers
	// were charged for the instant At+Wait; the request may go out as
	// early as At+LayersDue (when a change of the shared bucket brings
	// its reservation forward), never earlier.
	LayersDue time.Duration
	// Exceeded is set when a layer refused under its OnExceed action;
	// Granted is then false and nothing was charged.
	Exceeded *LimitError
	// Shadow holds, for a granted request, the decision of each shadow
	// layer (Layer.Shadow) in the order of the layers; nil without shadow
	// layers, and for a request not granted (the shadow layers decide
	// when it is).
	Shadow []ShadowDecision
}

// ShadowDecision is what a shadow layer (Layer.Shadow) would have done with
// a granted request had it been enforced.
type ShadowDecision struct {
	// Layer names the layer; "" (SharedShadow) for a shadow shared bucket.
	Layer string
	// Action is "" when the layer would have granted the request at its
	// send instant (and was charged); ActionWait when the request would
	// have waited for it beyond that instant; ActionDeadLetter or
	// ActionDelay when the layer would have refused it under its
	// OnExceed (a cost above its burst or quota: ActionDeadLetter).
	Action Action
	// Wait is how long after the decision (LayerResult.At) the layer
	// would have had room for the request: 0 when it had room at once,
	// and 0 for a cost it can never grant.
	Wait time.Duration
}

// Exceeded reports whether the layer would not have granted the request
// at its send instant.
func (d ShadowDecision) Exceeded() bool { return d.Action != "" }

// SharedShadow is the Layer of the ShadowDecision of a shadow shared
// bucket (LayerRequest.ShadowShared).
const SharedShadow = ""

// LayeredStore is a Store that also decides further layers with its shared
// bucket in one atomic step.
type LayeredStore interface {
	Store
	// Layers returns the store's layers, with their defaults filled in.
	Layers() []Layer
	// TakeLayers decides the shared bucket and every layer together. It
	// charges all of them or none. A cost above a layer's burst or quota
	// returns a *LimitError that wraps ErrCostExceedsBurst; one above the
	// shared bucket's burst returns ErrCostExceedsBurst as Take does.
	TakeLayers(ctx context.Context, req LayerRequest) (LayerResult, error)
	// RefundLayers gives back what a granted TakeLayers charged: a
	// cancelled reservation, in the queue of res.Class on the shared
	// bucket. A quota is refunded only while its window is the one
	// charged.
	RefundLayers(ctx context.Context, req LayerRequest, res LayerResult) error
	// DelayLayers moves a granted request's send from the instant from,
	// which its token-bucket layers (but one passed on a paid slot) were
	// charged for, to from+by: it takes from each what the move costs the
	// key's next message (DelayChargeAt), and reports true. A request
	// without its Paid slots moves every token-bucket layer, those it
	// passed on a slot included: so a caller moves a slot with its
	// message once the move is past the slot's lateness. When a key was charged meanwhile for a message that
	// goes out after from, and the layer would not hold the debit at that
	// message's instant, the two cannot be kept apart: it takes nothing
	// and reports false, and the request must be decided again. A quota
	// is left as charged.
	DelayLayers(ctx context.Context, req LayerRequest, res LayerResult, from time.Time, by time.Duration) (bool, error)
}

// DelayCharge returns the tokens a layer l charged cost for one instant
// owes when the request goes out later by: the refill between the two
// instants, which the key's next message must not spend, at most the cost
// (the least a store takes; see DelayChargeAt).
func DelayCharge(l Layer, cost int, by time.Duration) float64 {
	return min(by.Seconds()*l.Rate, float64(cost))
}

// DelayChargeAt is DelayCharge for a layer holding tokens now (after its
// refill to now, at most its burst), the new instant being ahead after
// now (0 when it is past): at least what leaves the layer with burst -
// cost at the new instant, as it holds right after a charge there. That
// matters when the new instant is still ahead: the layer holds its state
// as of now and caps it at its burst only when read, so a refill that the
// cap would have cut between the two instants still counts when the key's
// next message asks at the new one (docs/design.md). A charge moved later
// by that much never leaves the layer holding more than it would have
// with the charge at the later instant. layers_delay.lua takes alike.
func DelayChargeAt(l Layer, cost int, by time.Duration, tokens float64, ahead time.Duration) float64 {
	return max(DelayCharge(l, cost, by), tokens+max(ahead, 0).Seconds()*l.Rate-float64(l.Burst-cost))
}

// LayerState is the state of one key of one layer.
type LayerState struct {
	// Layer and Key name it.
	Layer, Key string
	// Tokens is, for a keyed bucket, the tokens available now (negative
	// while reserved ahead).
	Tokens float64
	// Used is, for a quota, the tokens used in the current window (for
	// a concurrency layer, the slots held now), and
	// WindowEnd when it resets.
	Used      int
	WindowEnd time.Time
	// Spent is, for a budget, the money spent in the current window
	// (WindowEnd when it resets).
	Spent Amount
	// Open is, for a window, the key's open interval holding the store's
	// clock, or the next one: [Open[0], Open[1]).
	Open [2]time.Time
	// Full is set when no state is kept: a full bucket, an unused quota
	// or budget; for a window, when it is open.
	Full bool
	// At is the store's clock.
	At time.Time
}

// formatRate writes a rate in the unit it was most likely given in, as
// ParseRate reads it: "1/s", "240/min", "5/h", "200000/d", else per second.
func formatRate(rate float64) string {
	for _, u := range []struct {
		name string
		secs float64
	}{{"s", 1}, {"min", 60}, {"h", 3600}, {"d", 86400}} {
		if n := rate * u.secs; n >= 1 && math.Abs(n-math.Round(n)) < 1e-6*n {
			return strconv.FormatFloat(math.Round(n), 'f', -1, 64) + "/" + u.name
		}
	}
	return strconv.FormatFloat(rate, 'g', 4, 64) + "/s"
}

// CostError returns the *LimitError for a cost that layer l can never grant:
// above its burst or its quota. It also matches ErrCostExceedsBurst.
func CostError(l Layer, cost int) error {
	limit, what := l.Burst, "burst"
	if l.IsQuota() {
		limit, what = l.Quota, "quota"
	}
	return &LimitError{
		Layer: l.Name, Action: ActionDeadLetter,
		Reason: fmt.Sprintf("cost %d exceeds %s %d", cost, what, limit),
		err:    fmt.Errorf("cost %d, %s %d: %w", cost, what, limit, ErrCostExceedsBurst),
	}
}

// PriceError returns the *LimitError for a price that budget layer l can
// never grant: above its budget. It also matches ErrCostExceedsBurst.
func PriceError(l Layer, price Amount) error {
	return &LimitError{
		Layer: l.Name, Action: ActionDeadLetter,
		Reason: fmt.Sprintf("price %s exceeds budget %s", price, l.Budget),
		err:    fmt.Errorf("price %s, budget %s: %w", price, l.Budget, ErrCostExceedsBurst),
	}
}

// ExceededError returns the *LimitError for layer l refusing a request under
// its OnExceed action, with room after wait. Stores call it so that every
// store words its refusals alike.
func ExceededError(l Layer, at time.Time, wait time.Duration) *LimitError {
	return exceededError(l, at, wait, "room in")
}

// ReservedError returns the *LimitError for delay layer l refusing a
// request whose key in it is key, and booking its slot after wait (see
// ReservesOnRefusal): ExceededError's, with Reserved, Key and RetryAt set.
func ReservedError(l Layer, key string, at time.Time, wait time.Duration) *LimitError {
	e := exceededError(l, at, wait, "slot booked in")
	e.Reserved, e.Key, e.RetryAt, e.booked = true, key, at.Add(wait), at
	return e
}

// exceededError is ExceededError, saying what comes after wait as when.
func exceededError(l Layer, at time.Time, wait time.Duration, when string) *LimitError {
	if l.IsConcurrency() {
		return concurrencyError(l, at, wait)
	}
	shown := wait.Round(time.Millisecond) // the reason is for people
	if wait >= time.Minute {
		shown = wait.Round(time.Second)
	}
	var reason string
	switch {
	case l.IsWindow():
		reason = fmt.Sprintf("outside the send window; opens in %v", shown)
	case l.IsBudget():
		reason = fmt.Sprintf("budget of %s per %s spent; resets in %v", l.Budget, l.Per, shown)
	case l.IsQuota():
		reason = fmt.Sprintf("quota of %d per %s used up; resets in %v", l.Quota, l.Per, shown)
	default:
		reason = fmt.Sprintf("rate %s (burst %d) exceeded; %s %v", formatRate(l.Rate), l.Burst, when, shown)
	}
	e := &LimitError{Layer: l.Name, Action: l.OnExceed, Reason: reason, Wait: wait}
	if l.OnExceed == ActionDelay {
		e.RetryAt = at.Add(wait)
	}
	return e
}

// concurrencyError is ExceededError for a concurrency layer: every slot is
// held, the earliest lease ends after wait. A delay refusal asks to come
// back after at most ConcurrencyRetry.
func concurrencyError(l Layer, at time.Time, wait time.Duration) *LimitError {
	reason := fmt.Sprintf("concurrency %d in use; the earliest lease ends in %v", l.Concurrency, wait.Round(time.Millisecond))
	e := &LimitError{Layer: l.Name, Action: l.OnExceed, Reason: reason, Wait: wait}
	if l.OnExceed == ActionDelay {
		e.Wait = min(wait, ConcurrencyRetry)
		e.RetryAt = at.Add(e.Wait)
	}
	return e
}
