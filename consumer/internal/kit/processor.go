package kit

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// Processor is the per-message path that every backend shares: the
// Throttle and PushBack middleware that the Options ask for, the retry
// policy, the MessageObserver, and a rate-bounded info log of handler
// failures ("sink failing: 503 ×120 in the last 10s, retrying", then "sink
// recovered after 10s"). A backend builds one in its constructor and calls
// Process for each message, then commits, acks or dead-letters by the
// Outcome. It is safe for concurrent use.
type Processor struct {
	opts     consumer.Options
	setAside bool // the backend sets messages aside itself (SetsAside)
	handler  consumer.Handler
	obs      *consumer.MessageObserver // opts.Observer plus the failure log
	trouble  *troubleLog
	tracer   trace.Tracer // nil without Options.TracerProvider
	group    string       // ConsumerGroup, for the spans
	// spanNames holds each destination's consumer span name: a
	// consumer has one or two (a topic and its delay topic).
	spanNames sync.Map
	dedupe    *deduper // nil without Options.Dedupe
	// marksLater: the backend waits for Outcome.Marking (MarksLater).
	marksLater bool
}

// ProcessorOption is an option of NewProcessor, for the backend.
type ProcessorOption func(*Processor)

// SetsAside tells the Processor that its backend can set a message aside
// (a RabbitMQ delay queue, a Kafka delay topic): Process then returns a
// handler's consumer.SetAside error as Outcome.SetAside at once. Without
// it, Process waits the delay in the handler and tries again.
func SetsAside() ProcessorOption { return func(p *Processor) { p.setAside = true } }

// MarksLater tells the Processor that its backend commits or acks a
// delivered message only once its Outcome.Marking ran: with
// Options.Dedupe, the mark after a send then goes out while the backend
// goes on with its next message, instead of before Process returns.
func MarksLater() ProcessorOption { return func(p *Processor) { p.marksLater = true } }

// NewProcessor validates o (WithDefaults) and returns a Processor that
// calls h, wrapped in the middleware o asks for.
func NewProcessor(o consumer.Options, h consumer.Handler, opts ...ProcessorOption) (*Processor, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: handler must not be nil", consumer.ErrInvalidConfig)
	}
	o, err := WithDefaults(o)
	if err != nil {
		return nil, err
	}
	p := &Processor{opts: o, trouble: newTroubleLog(o.Logger)}
	if o.Dedupe != nil {
		p.dedupe = newDeduper(o)
	}
	p.handler = consumer.Chain(h, middleware(o, p.dedupe)...)
	for _, opt := range opts {
		opt(p)
	}
	if p.dedupe != nil {
		p.dedupe.later = p.marksLater
	}
	if o.TracerProvider != nil {
		p.tracer = o.TracerProvider.Tracer(consumer.TracerName)
	}
	user := o.Observer
	p.obs = &consumer.MessageObserver{
		Delivered: func(m consumer.Message) {
			p.trouble.delivered()
			observeDelivered(user, m)
		},
		Failed: func(m consumer.Message, err error) {
			if !consumer.IsPermanent(err) {
				p.trouble.failed(err)
			}
			observeFailed(user, m, err)
		},
		Retried: func(m consumer.Message, err error, d time.Duration) { observeRetried(user, m, err, d) },
	}
	return p, nil
}

// Options returns the options with their defaults filled in.
func (p *Processor) Options() consumer.Options { return p.opts }

// QueuesMarks reports whether a delivered message may end with its dedupe
// mark still under way (Outcome.Marking): Options.Dedupe on a store that
// queues its marks (redisdedupe.Store), with MarksLater.
func (p *Processor) QueuesMarks() bool {
	return p.dedupe != nil && p.dedupe.later && p.dedupe.lstore != nil
}

// Process handles msg under the retry policy (see the function Process):
// it numbers the attempts from 1, waits on the limiter before each,
// reports each event to the MessageObserver, and returns how the message
// ended. The caller commits or acks a delivered message, sets aside one
// with Outcome.SetAside (only with SetsAside), dead-letters a failed one
// (then calls DeadLettered), and leaves an abandoned one for redelivery.
//
// Called with StartSpan's ctx, it records each retry and an abandoned
// outcome as events of the message's span, and each limiter wait as a
// child span (consumer.Throttle).
//
// With Options.Dedupe, the attempts of one Process call share one claim
// token: the message's key is claimed before each handler call (after
// the limiter's wait), marked sent after the call that succeeded, and
// released when the message ends otherwise (Outcome.Delivered false). A
// message already sent ends with Outcome.Deduplicated, to be committed or
// acked like a delivered one. With MarksLater, a delivered message whose
// mark is under way has Outcome.Marking set: the backend commits or acks
// it in Marking.Then.
func (p *Processor) Process(ctx context.Context, msg consumer.Message) Outcome {
	return p.ProcessAhead(ctx, msg, nil)
}

// ClaimAhead starts the dedupe claim of msg (Options.Dedupe) before its
// turn, when the store can queue it with others (redisdedupe.Store): a
// backend calls it as it fetches msg, in the order of its messages, and
// hands the result to ProcessAhead, or to DropAhead when msg is not
// handled. It returns nil when there is nothing to claim ahead (no
// dedupe, no such store, the store failing, no key). A claim ahead that is
// older than ClaimTTL − SendTimeout at msg's turn is made again then.
func (p *Processor) ClaimAhead(msg consumer.Message) *Ahead {
	if p.dedupe == nil {
		return nil
	}
	return p.dedupe.claimAhead(msg)
}

// DropAhead releases a's claim (ClaimAhead; nil does nothing): its
// message was not handled, and the next owner claims it at once.
func (p *Processor) DropAhead(a *Ahead) {
	if a != nil {
		p.dedupe.dropAhead(a)
	}
}

// ProcessAhead is Process for a message claimed ahead (ClaimAhead; a may
// be nil): its first attempt uses that claim's answer instead of
// claiming then.
func (p *Processor) ProcessAhead(ctx context.Context, msg consumer.Message, a *Ahead) Outcome {
	var dl *delivery
	pctx := ctx
	if p.dedupe != nil {
		dl = p.dedupe.deliveryAhead(a)
		pctx = context.WithValue(ctx, dedupeKey{}, dl)
	}
	out := process(pctx, p.opts.Retry, p.handler, msg, p.obs, p.setAside)
	if dl != nil && !out.Delivered() {
		p.dedupe.release(ctx, dl)
	}
	if dl != nil && out.Delivered() {
		out.Marking = dl.marking
	}
	if out.Abandoned {
		SpanAbandoned(ctx, out.Attempts)
	}
	return out
}

// Key returns msg's ordering key (Options.OrderingKey). Its error is
// permanent: dead-letter the message with DeadLettered.
func (p *Processor) Key(msg consumer.Message) (string, error) {
	if p.opts.OrderingKey == nil {
		return keyOf(msg)
	}
	k, err := p.opts.OrderingKey(msg)
	if err != nil {
		return "", consumer.Permanent(err)
	}
	return k, nil
}

// KeyFailed returns the Outcome of a message whose ordering key could
// not be computed (Key's error): it failed for good in its first attempt,
// without a handler call, and is to be dead-lettered (Attempts 1, Err
// err).
func (p *Processor) KeyFailed(err error) Outcome { return Outcome{Attempts: 1, Err: err} }

// Class returns msg's class (Options.Priority), by which the backend
// orders the messages waiting for a handler; PriorityNormal without
// Options.Priority.
func (p *Processor) Class(msg consumer.Message) limiter.Priority {
	if p.opts.Priority == nil {
		return limiter.PriorityNormal
	}
	c, _ := p.opts.Priority(msg)
	return c
}

// Classes reports whether messages have classes of their own
// (Options.Priority), so that the backend reserves slots for the higher
// ones.
func (p *Processor) Classes() bool { return p.opts.Priority != nil }

// DeadLettered reports a message that the backend handed to its
// dead-letter destination: it sets msg.Attempt to the attempts made, calls
// MessageObserver.DeadLettered, records the event on ctx's span
// (StartSpan's) with the error as its status, and logs "message
// dead-lettered" at warn level with the attempts, the error (key "err")
// and attrs, the backend's position of the message and its KeyDestination.
func (p *Processor) DeadLettered(ctx context.Context, msg consumer.Message, o Outcome, attrs ...slog.Attr) {
	if o.Attempts > 0 {
		msg.Attempt = o.Attempts
	}
	spanDeadLettered(ctx, o, destination(attrs))
	ObserveDeadLettered(p.opts.Observer, msg, o.Err)
	attrs = append(attrs, slog.Int("attempts", o.Attempts))
	if o.Err != nil {
		attrs = append(attrs, slog.String("err", o.Err.Error()))
	}
	p.opts.Logger.LogAttrs(context.Background(), slog.LevelWarn, "message dead-lettered", attrs...)
}

// destination returns the value of attrs' KeyDestination, or "".
func destination(attrs []slog.Attr) string {
	for _, a := range attrs {
		if a.Key == KeyDestination {
			return a.Value.String()
		}
	}
	return ""
}
