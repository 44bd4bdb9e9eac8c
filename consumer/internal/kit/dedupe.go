package kit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// The log messages of dedupe (consumer.Options.Dedupe).
const (
	// LogDeduplicated, at debug level, with dedupe_key: a message whose
	// key was already marked sent is acked or committed without a send.
	LogDeduplicated = "message deduplicated: already sent"
	// LogDedupeStoreFailed, at warn level, at most once per
	// dedupeWarnEvery, with mode and err: the dedupe store failed and
	// Dedupe.OnStoreError decides.
	LogDedupeStoreFailed = "dedupe store failed"
)

const (
	// dedupeProbe is how long the store counts as failing after an error:
	// meanwhile the policy decides without asking it (no timeout per
	// message while Redis is down), then the next message asks again.
	dedupeProbe = time.Second
	// dedupeWarnEvery bounds the LogDedupeStoreFailed lines.
	dedupeWarnEvery = 10 * time.Second
	// dedupeAfterTimeout bounds a mark or release made after the handler,
	// which runs even when the message's context ended, so that a message
	// sent during a drain is still marked.
	dedupeAfterTimeout = 5 * time.Second
)

// errDeduplicated is what the dedupe middleware returns for a message
// already sent: process ends it delivered, without a handler call.
var errDeduplicated = errors.New("already sent")

// deduper is the one implementation of consumer.Options.Dedupe: the
// middleware that claims a message's key before each handler call and
// marks it after success, and the release at the end of Process. It is
// safe for concurrent use.
type deduper struct {
	opts   consumer.Dedupe // defaults filled in
	local  consumer.DedupeStore
	obs    *consumer.MessageObserver
	log    *slog.Logger
	prefix string // of the tokens: random, one per Processor
	seq    atomic.Uint64

	downUntil atomic.Int64 // unix ns: the store counts as failing until then
	lastWarn  atomic.Int64 // unix ns of the last LogDedupeStoreFailed
}

// dedupeDefaults returns d with its documented defaults, the claim's TTL
// derived from the retry policy's attempts.
func dedupeDefaults(d consumer.Dedupe, retry consumer.RetryPolicy) consumer.Dedupe {
	if d.Window == 0 {
		d.Window = consumer.DefaultDedupeWindow
	}
	if d.SendTimeout == 0 {
		d.SendTimeout = consumer.DefaultDedupeSendTimeout
	}
	if d.ClaimTTL == 0 {
		d.ClaimTTL = max(d.SendTimeout*time.Duration(retryDefaults(retry).MaxAttempts), time.Second)
	}
	if d.OnStoreError == "" {
		d.OnStoreError = limiter.ModeLocal
	}
	if d.Store == nil {
		d.Store = consumer.NewLocalDedupeStore()
	}
	return d
}

func newDeduper(o consumer.Options) *deduper {
	var b [6]byte
	_, _ = rand.Read(b[:])
	d := &deduper{
		opts:   dedupeDefaults(*o.Dedupe, o.Retry),
		obs:    o.Observer,
		log:    o.Logger,
		prefix: hex.EncodeToString(b[:]) + ".",
	}
	if d.opts.OnStoreError == limiter.ModeLocal {
		d.local = consumer.NewLocalDedupeStore()
	}
	return d
}

// dedupeKey is the context key of a delivery's *delivery.
type dedupeKey struct{}

// delivery is the dedupe state of one Process call: its token, the
// message's key, and the stores where its token holds a claim.
type delivery struct {
	token  string
	keyed  bool // key computed
	key    string
	store  bool // the token holds a claim in Dedupe.Store
	local  bool // the token holds a claim in the local fallback
	noSend bool // skipped: reported once
}

func (d *deduper) newDelivery() *delivery {
	return &delivery{token: d.prefix + strconv.FormatUint(d.seq.Add(1), 36)}
}

// middleware is the dedupe step, between the limiter's wait and the
// handler: claim (waiting for another holder), call, mark.
func (d *deduper) middleware(next consumer.Handler) consumer.Handler {
	return func(ctx context.Context, msg consumer.Message) error {
		dl, _ := ctx.Value(dedupeKey{}).(*delivery)
		if dl == nil { // not called through Processor.Process
			return next(ctx, msg)
		}
		if !dl.keyed {
			k, err := d.opts.Key(msg)
			if err != nil {
				return consumer.Permanent(fmt.Errorf("the dedupe key: %w", err))
			}
			dl.key, dl.keyed = k, true
		}
		if dl.key == "" {
			if d.opts.RequireKey {
				return consumer.Permanent(consumer.ErrNoDedupeKey)
			}
			d.skipped(dl, msg, consumer.DedupeSkipNoKey)
			return next(ctx, msg)
		}
		st, store, err := d.claim(ctx, dl)
		if err != nil {
			return err
		}
		switch st {
		case consumer.DedupeSent:
			if o := d.obs; o != nil && o.Deduplicated != nil {
				o.Deduplicated(msg)
			}
			d.log.LogAttrs(ctx, slog.LevelDebug, LogDeduplicated, slog.String("dedupe_key", dl.key))
			return errDeduplicated
		case 0: // the store failed under ModeOpen
			d.skipped(dl, msg, consumer.DedupeSkipStoreError)
			return next(ctx, msg)
		}
		if store == d.local {
			dl.local = true
		} else {
			dl.store = true
		}
		if err := next(ctx, msg); err != nil {
			return err
		}
		d.mark(ctx, dl)
		return nil
	}
}

func (d *deduper) skipped(dl *delivery, msg consumer.Message, reason string) {
	if dl.noSend {
		return
	}
	dl.noSend = true
	if o := d.obs; o != nil && o.DedupeSkipped != nil {
		o.DedupeSkipped(msg, reason)
	}
}

// claim claims dl's key in the store or, while it fails, as
// OnStoreError says: in the local store (ModeLocal), not at all (ModeOpen:
// state 0), or after waiting for the store (ModeClosed).
func (d *deduper) claim(ctx context.Context, dl *delivery) (consumer.DedupeState, consumer.DedupeStore, error) {
	for {
		if until := d.downUntil.Load(); until == 0 || time.Now().UnixNano() >= until {
			st, err := d.opts.Store.Claim(ctx, dl.key, dl.token, d.opts.ClaimTTL)
			if err == nil {
				d.downUntil.Store(0)
				return st, d.opts.Store, nil
			}
			if ctx.Err() != nil {
				return 0, nil, ctx.Err()
			}
			d.failed(err)
		}
		switch d.opts.OnStoreError {
		case limiter.ModeLocal:
			st, err := d.local.Claim(ctx, dl.key, dl.token, d.opts.ClaimTTL)
			return st, d.local, err
		case limiter.ModeOpen:
			return 0, nil, nil
		}
		// ModeClosed: nothing is sent until the store answers.
		if err := Sleep(ctx, time.Until(time.Unix(0, d.downUntil.Load()))); err != nil {
			return 0, nil, err
		}
	}
}

// mark marks dl's key sent where its token holds a claim, and in the
// local store when the store fails under ModeLocal. The message was sent:
// it is delivered whatever the mark's fate.
func (d *deduper) mark(ctx context.Context, dl *delivery) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dedupeAfterTimeout)
	defer cancel()
	local := dl.local
	if dl.store {
		if err := d.opts.Store.MarkSent(ctx, dl.key, dl.token, d.opts.Window); err != nil {
			d.failed(err)
			local = d.local != nil
		}
	}
	if local {
		_ = d.local.MarkSent(ctx, dl.key, dl.token, d.opts.Window)
	}
	dl.store, dl.local = false, false
}

// release gives back dl's claims: the message was not delivered. A
// release that fails leaves the claim to expire.
func (d *deduper) release(ctx context.Context, dl *delivery) {
	if !dl.store && !dl.local {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dedupeAfterTimeout)
	defer cancel()
	if dl.local {
		_ = d.local.Release(ctx, dl.key, dl.token)
	}
	if dl.store {
		if err := d.opts.Store.Release(ctx, dl.key, dl.token); err != nil {
			d.failed(err)
		}
	}
	dl.store, dl.local = false, false
}

// failed records a store failure: the observer, the probe interval, and
// a rate-bounded warning.
func (d *deduper) failed(err error) {
	now := time.Now()
	d.downUntil.Store(now.Add(dedupeProbe).UnixNano())
	if o := d.obs; o != nil && o.DedupeStoreError != nil {
		o.DedupeStoreError(err)
	}
	last := d.lastWarn.Load()
	if now.UnixNano()-last >= int64(dedupeWarnEvery) && d.lastWarn.CompareAndSwap(last, now.UnixNano()) {
		d.log.Warn(LogDedupeStoreFailed, "mode", string(d.opts.OnStoreError), "err", err)
	}
}
