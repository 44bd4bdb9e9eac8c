package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/throttlehq/throttle/consumer/internal/grant"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/limiter"
)

// The headers a layer's refusal puts on the dead letter (see NewLimiter).
const (
	// HeaderLimit names the layer of limit.extra that refused the message.
	HeaderLimit = "x-throttle-limit"
	// HeaderLimitReason says why, in a few words.
	HeaderLimitReason = "x-throttle-limit-reason"
)

// DefaultTenantWaiting is LimitOptions.TenantWaiting's default.
const DefaultTenantWaiting = 4

// ErrWaitTimeout is wrapped by the error of a wait that
// LimitOptions.WaitTimeout cut short. It is retryable: the retry policy
// tries again later and dead-letters the message once its attempts are
// used up.
var ErrWaitTimeout = errors.New("max wait for tokens exceeded")

// LimitOptions configure NewLimiter. The zero value waits without a bound
// in the Bucket's class (limiter.Options.Priority), for a bucket without
// keyed layers.
type LimitOptions struct {
	// Keys gives the message's key in each keyed layer of the bucket
	// (limiter.Request.Keys), such as the recipient of an SMS. It is
	// required when the bucket has a keyed layer. An error fails the
	// message: make it Permanent when retrying cannot help, so that the
	// message is dead-lettered with the reason.
	Keys func(Message) (map[string]string, error)
	// Priority gives the message's class. Default: the Bucket's class
	// for every message. An error fails the message, as for Keys. A
	// consumer whose Options.Limiter is this limiter orders its messages
	// by the same function (Options.Priority's default).
	Priority PriorityFunc
	// Prices price each message for the bucket's budget layers
	// (limiter.Layer.Budget, limiter.Request.Price): the price of the
	// recipient's country, times the message's cost (its SMS segments)
	// with PerSegment. Required when the bucket has a budget layer;
	// Validate checks it.
	Prices *limiter.Prices
	// Recipient gives the message's recipient, a telephone number, for
	// the prices by country (Prices.Countries; required with them). An
	// error fails the message, as for Keys; a recipient that is not a
	// telephone number dead-letters it, naming the budget layer.
	Recipient func(Message) (string, error)
	// WaitTimeout bounds each wait for tokens, the shared bucket's and the
	// layers' together: a wait still going after it is cut short and fails
	// the attempt with a retryable error wrapping ErrWaitTimeout. It is
	// the caller's bound, unlike limiter.Layer.MaxWait, the longest wait a
	// layer grants before its OnExceed refuses at once. Default 0: no
	// bound.
	WaitTimeout time.Duration
	// Tenant gives the message's tenant on a bucket with fair shares
	// (limiter.Fair, limiter.Request.Tenant), such as a customer named in a
	// header. It is required when the bucket has fair shares. An error
	// fails the message, as for Keys; so does an empty tenant.
	Tenant func(Message) (string, error)
	// TenantWaiting bounds the messages of one tenant that wait for its
	// fair share at once in this limiter (limiter.Request.FairWaiting): a
	// further message of the tenant that its share makes wait is not held
	// here but refused at once with a *limiter.LimitError (Layer
	// limiter.FairLayer, ActionDelay), which Throttle turns into a
	// SetAside, so that a tenant over its share does not hold the handlers
	// that other tenants need. The messages of a tenant set aside so are
	// spaced by its share's pace: each until the wait its share gave,
	// but no sooner than the tenant's spacing (limiter.LimitError.Spacing)
	// after the one set aside before it.
	// Default 0: DefaultTenantWaiting. Negative: no bound, every message
	// waits (a consumer that must keep its order, such as Kafka under
	// ordering partition).
	TenantWaiting int
	// Waiting, when set, is called with +1 when a message starts waiting
	// for tokens and -1 when it stops, and Granted with the tokens of
	// each grant: for a gauge of waiting messages and a counter of
	// tokens. They must not block.
	Waiting func(delta int)
	Granted func(tokens int)
}

// NewLimiter returns the limiter a consumer waits on (Options.Limiter)
// for bucket: each message's request names its keys (LimitOptions.Keys),
// its class (LimitOptions.Priority) and the slots it already paid for
// (the header x-throttle-paid of a message set aside, see Throttle), and
// waits at most LimitOptions.WaitTimeout. What the layers
// decide becomes what the consumer does with the message:
//
//   - a layer with on_exceed dead_letter that refuses makes the message
//     fail permanently, so that it is dead-lettered with HeaderLimit and
//     HeaderLimitReason naming the layer and the reason;
//   - a layer with on_exceed delay that refuses sets the message aside
//     until the layer has room (Throttle turns the refusal into a
//     SetAside), carrying the slot the layer booked;
//   - a cost a layer can never grant is a permanent failure too.
//
// It is the one adapter from a message to a limiter request: the binary
// uses it as a library user does. It returns an error wrapping
// ErrInvalidConfig for a nil bucket, options that Validate rejects, or a
// bucket with a keyed layer and no Keys. The limiter is safe for
// concurrent use.
func NewLimiter(bucket *limiter.Bucket, opts LimitOptions) (MessageLimiter, error) {
	errs := []error{opts.Validate()}
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	budget, slots := "", false
	if bucket == nil {
		bad("bucket", "must not be nil")
	} else {
		errs = append(errs, opts.ValidateLayers(bucket.Layers()))
		for _, l := range bucket.Layers() {
			if l.IsBudget() && budget == "" {
				budget = l.Name
			}
			slots = slots || l.IsConcurrency()
		}
		if opts.Tenant == nil && bucket.Fair() != nil {
			bad("Tenant", "is required: the bucket has fair shares")
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if opts.TenantWaiting == 0 {
		opts.TenantWaiting = DefaultTenantWaiting
	}
	return &messageLimiter{b: bucket, opts: opts, tenants: map[string]*tenantPace{}, budget: budget, slots: slots}, nil
}

// Validate returns nil or every problem of o that needs no bucket, each a
// *FieldError naming the Go field at fault ("WaitTimeout"), joined with
// errors.Join. NewLimiter calls it; a program may call it to check its
// configuration before it has a bucket.
func (o LimitOptions) Validate() error {
	var errs []error
	if o.WaitTimeout < 0 {
		errs = append(errs, &FieldError{Field: "WaitTimeout", Err: fmt.Errorf("%v must not be negative", o.WaitTimeout)})
	}
	if o.Prices != nil {
		if err := o.Prices.Validate(); err != nil {
			errs = append(errs, &FieldError{Field: "Prices", Err: err})
		}
		if o.Prices.NeedsRecipient() && o.Recipient == nil {
			errs = append(errs, &FieldError{Field: "Recipient", Err: errors.New("is required with prices by country (Prices.Countries)")})
		}
	}
	return errors.Join(errs...)
}

// ValidateLayers returns nil or every problem of o for a bucket with
// layers, each a *FieldError, joined: Keys is required when a layer is
// keyed, Prices when one is a budget. NewLimiter calls it with the
// bucket's layers; a program may call it before it has a bucket.
func (o LimitOptions) ValidateLayers(layers []limiter.Layer) error {
	var errs []error
	for _, l := range layers {
		if l.Keyed && o.Keys == nil {
			errs = append(errs, &FieldError{Field: "Keys", Err: fmt.Errorf("is required: layer %q is keyed", l.Name)})
			break
		}
	}
	for _, l := range layers {
		if l.IsBudget() && o.Prices == nil {
			errs = append(errs, &FieldError{Field: "Prices", Err: fmt.Errorf("is required: layer %q is a budget", l.Name)})
			break
		}
	}
	return errors.Join(errs...)
}

// messageLimiter is what NewLimiter returns.
type messageLimiter struct {
	b    *limiter.Bucket
	opts LimitOptions
	// budget names the bucket's first budget layer, "" for none: the
	// layer a message that cannot be priced is dead-lettered under.
	budget string
	// slots is set when the bucket has a concurrency layer: a grant
	// then holds slots (limiter.Bucket.Acquire). Without one,
	// AcquireMessage waits with WaitGrant, which holds nothing and
	// allocates no Held.
	slots bool

	mu      sync.Mutex
	tenants map[string]*tenantPace
}

// tenantPace paces the messages of a tenant set aside for its fair share:
// next is when the next one is due.
type tenantPace struct {
	next time.Time
}

// setAside returns how long to set aside a message of tenant that the
// bucket made wait d for its share (from now), its reservations coming
// due spacing apart: until the later of that and the tenant's next due,
// which moves spacing further, so that the
// messages a tenant over its share sets aside come back at its pace
// rather than all at once.
func (l *messageLimiter) setAside(tenant string, now time.Time, d, spacing time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.tenants) > 1024 {
		for k, p := range l.tenants {
			if p.next.Before(now) {
				delete(l.tenants, k)
			}
		}
	}
	p := l.tenants[tenant]
	if p == nil {
		p = &tenantPace{}
		l.tenants[tenant] = p
	}
	due := now.Add(d)
	if p.next.After(due) {
		due = p.next
	}
	p.next = due.Add(spacing)
	return due.Sub(now)
}

// MessagePriority returns LimitOptions.Priority: a consumer whose
// Options.Priority is unset orders its messages by the classes this
// limiter waits in (the backends' kit reads it).
func (l *messageLimiter) MessagePriority() PriorityFunc { return l.opts.Priority }

// Wait implements Limiter: a request without a message, in the Bucket's
// class. It fails with limiter.ErrMissingKey on a bucket with a keyed
// layer.
func (l *messageLimiter) Wait(ctx context.Context, cost int) error {
	return l.wait(ctx, cost, func(ctx context.Context) error { return l.b.Wait(ctx, cost) })
}

// WaitMessage implements MessageLimiter. On a bucket with a concurrency
// layer it fails with limiter.ErrNeedsAcquire: AcquireMessage returns the
// release.
func (l *messageLimiter) WaitMessage(ctx context.Context, msg Message, cost int) error {
	if !grant.Wanted(ctx) {
		return l.waitMessage(ctx, msg, cost, nil)
	}
	// A throttle wait span asks how the wait was granted (tracing.go).
	var g limiter.Grant
	err := l.waitMessage(ctx, msg, cost, &g)
	if err == nil {
		grant.Set(ctx, g)
	}
	return err
}

// waitMessage is WaitMessage, filling g (when not nil) from
// limiter.Bucket.WaitGrant.
func (l *messageLimiter) waitMessage(ctx context.Context, msg Message, cost int, g *limiter.Grant) error {
	req, err := l.request(msg, cost)
	if err != nil {
		return err
	}
	now := l.requestedAt(req)
	return l.paced(req, now, l.wait(ctx, cost, func(ctx context.Context) error {
		if g == nil {
			return l.b.WaitN(ctx, req)
		}
		var err error
		*g, err = l.b.WaitGrant(ctx, req)
		return err
	}))
}

// requestedAt returns the time req is made, for paced: now for a request
// with a tenant, the zero time otherwise (paced does not read it then,
// and the clock is not read for every message).
func (l *messageLimiter) requestedAt(req limiter.Request) time.Time {
	if req.Tenant == "" {
		return time.Time{}
	}
	return time.Now()
}

// paced returns err, a refusal by the fair share of a request made at now
// moved to the tenant's pace (setAside).
func (l *messageLimiter) paced(req limiter.Request, now time.Time, err error) error {
	if req.Tenant == "" || err == nil {
		return err
	}
	if le, ok := errors.AsType[*limiter.LimitError](err); ok && le.Layer == limiter.FairLayer && !le.Reserved {
		le.Wait = l.setAside(req.Tenant, now, le.Wait, le.Spacing)
		le.RetryAt = now.Add(le.Wait)
	}
	return err
}

// AcquireMessage implements SlotLimiter: WaitMessage that holds a slot of
// each concurrency layer of the bucket (limiter.Layer.Concurrency) for
// the message's key until release is called. release is never nil, and
// does nothing after a failure, on a bucket without concurrency layers,
// and when called again.
func (l *messageLimiter) AcquireMessage(ctx context.Context, msg Message, cost int) (release func(), err error) {
	g, held, err := l.acquire(ctx, msg, cost)
	if err == nil {
		grant.Set(ctx, g) // for a throttle wait span (tracing.go)
	}
	if held == nil {
		return noRelease, err
	}
	return held.Release, err
}

// noRelease is the release of a grant that holds no slot.
func noRelease() {}

// acquire is AcquireMessage: it returns how the wait was granted and, on
// a bucket with a concurrency layer, the limiter's Held (nil after a
// failure, and without such a layer).
func (l *messageLimiter) acquire(ctx context.Context, msg Message, cost int) (limiter.Grant, *limiter.Held, error) {
	req, err := l.request(msg, cost)
	if err != nil {
		return limiter.Grant{}, nil, err
	}
	var (
		g    limiter.Grant
		held *limiter.Held
	)
	now := l.requestedAt(req)
	err = l.paced(req, now, l.wait(ctx, cost, func(ctx context.Context) error {
		var err error
		if !l.slots {
			g, err = l.b.WaitGrant(ctx, req)
			return err
		}
		if held, err = l.b.Acquire(ctx, req); err == nil {
			g = held.Grant()
		}
		return err
	}))
	return g, held, err
}

// request returns the bucket request for msg.
func (l *messageLimiter) request(msg Message, cost int) (limiter.Request, error) {
	req := limiter.Request{Cost: cost, Paid: setaside.PaidSlots(msg.Headers)}
	var err error
	if l.opts.Priority != nil {
		if req.Priority, err = l.opts.Priority(msg); err != nil {
			return req, err
		}
	} else {
		req.Priority = l.b.Priority()
	}
	if l.opts.Keys != nil {
		if req.Keys, err = l.opts.Keys(msg); err != nil {
			return req, err
		}
	}
	if l.opts.Tenant != nil && l.b.Fair() != nil {
		if req.Tenant, err = l.opts.Tenant(msg); err != nil {
			return req, err
		}
		if req.Tenant == "" {
			return req, Permanent(errors.New("the message's tenant is empty"))
		}
		req.FairWaiting = max(l.opts.TenantWaiting, 0)
	}
	if l.budget != "" {
		if req.Price, err = l.price(msg, cost); err != nil {
			return req, err
		}
	}
	return req, nil
}

// price returns what msg, of cost, costs on the bucket's budget layers. A
// recipient that is not a telephone number is a permanent failure naming
// the budget layer.
func (l *messageLimiter) price(msg Message, cost int) (limiter.Amount, error) {
	to := ""
	if l.opts.Prices.NeedsRecipient() {
		var err error
		if to, err = l.opts.Recipient(msg); err != nil {
			return 0, err
		}
	}
	p, err := l.opts.Prices.Price(to, cost, l.budget)
	if le, ok := errors.AsType[*limiter.LimitError](err); ok {
		return 0, Permanent(fmt.Errorf("pricing the message: %w", limitRefusal{le}))
	}
	return p, err
}

// wait runs do, bounded by WaitTimeout and reported to Waiting and Granted.
func (l *messageLimiter) wait(ctx context.Context, cost int, do func(context.Context) error) error {
	if l.opts.Waiting != nil {
		l.opts.Waiting(1)
		defer l.opts.Waiting(-1)
	}
	var err error
	if l.opts.WaitTimeout <= 0 {
		err = do(ctx)
	} else {
		wctx, cancel := context.WithTimeoutCause(ctx, l.opts.WaitTimeout, ErrWaitTimeout)
		err = do(wctx)
		if err != nil && ctx.Err() == nil && errors.Is(context.Cause(wctx), ErrWaitTimeout) {
			err = fmt.Errorf("no tokens within %v: %w", l.opts.WaitTimeout, ErrWaitTimeout)
		}
		cancel()
	}
	if err == nil && l.opts.Granted != nil {
		l.opts.Granted(cost)
	}
	return err
}

// limitRefusal is a layer's dead_letter refusal as the consumer
// dead-letters it: the headers name the layer and say why.
type limitRefusal struct{ *limiter.LimitError }

func (e limitRefusal) Unwrap() error { return e.LimitError }

// DeadLetterHeaders names the headers the backends add to the dead letter
// (see HeaderError).
func (e limitRefusal) DeadLetterHeaders() map[string]string {
	return map[string]string{HeaderLimit: e.Layer, HeaderLimitReason: e.Reason}
}

// keyedLayerError returns an error when l is a *limiter.Bucket with a keyed
// layer: it cannot name a message's keys, so a consumer must wait on
// NewLimiter's limiter instead.
func keyedLayerError(l Limiter) error {
	b, ok := l.(*limiter.Bucket)
	if !ok {
		return nil
	}
	for _, ly := range b.Layers() {
		if ly.Keyed {
			return fmt.Errorf("is a *limiter.Bucket with the keyed layer %q, which needs each message's key: wrap it with consumer.NewLimiter", ly.Name)
		}
		if ly.IsConcurrency() {
			return fmt.Errorf("is a *limiter.Bucket with the concurrency layer %q, whose slots need a release: wrap it with consumer.NewLimiter", ly.Name)
		}
	}
	return nil
}

var _ SlotLimiter = (*messageLimiter)(nil)
