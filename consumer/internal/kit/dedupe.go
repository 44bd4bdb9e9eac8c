package kit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
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
	// later: the mark after a send goes out in the background, and the
	// backend waits for the delivery's Marking (MarksLater).
	later bool
	// lstore is opts.Store's queued operations, nil when it has none:
	// the claims ahead (Processor.ClaimAhead) and the marks of later.
	lstore laterStore
	// fresh is how old a claim ahead may be at the message's turn: it
	// then still covers a send (ClaimTTL - SendTimeout); an older one is
	// claimed again. Not positive: no claims ahead.
	fresh time.Duration
	now   func() time.Time // the age of the claims ahead
	// holders are the claims ahead that hold their key and whose message
	// has not started, by key: a message of another lane whose turn comes
	// first takes such a claim over (steal), instead of waiting for a
	// message that may wait for its worker.
	aheadMu sync.Mutex
	holders map[string]*Ahead

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
		opts:    dedupeDefaults(*o.Dedupe, o.Retry),
		obs:     o.Observer,
		log:     o.Logger,
		prefix:  hex.EncodeToString(b[:]) + ".",
		now:     time.Now,
		holders: map[string]*Ahead{},
	}
	if d.opts.OnStoreError == limiter.ModeLocal {
		d.local = consumer.NewLocalDedupeStore()
	}
	if ls, ok := d.opts.Store.(laterStore); ok {
		d.lstore = ls
		d.fresh = d.opts.ClaimTTL - d.opts.SendTimeout
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
	// marking is the mark under way after the send (deduper.later): mk.
	marking *Marking
	mk      Marking
	// ahead is the claim made before the message's turn, until the
	// first attempt used it.
	ahead *Ahead
}

// laterStore is what a DedupeStore may offer besides
// (redisdedupe.Store): operations queued for a moment to go out together
// with others, each calling done once, from another goroutine. The
// Processor claims ahead with them (Processor.ClaimAhead) and, with
// MarksLater, marks.
type laterStore interface {
	ClaimLater(key, token string, ttl time.Duration, done func(consumer.DedupeState, error))
	MarkSentLater(key, token string, window time.Duration, done func(error))
	ReleaseLater(key, token string, done func(error))
	// Flush sends the queued operations now, or right after the call in
	// flight.
	Flush()
}

// Ahead is the dedupe claim of a message made before its turn
// (Processor.ClaimAhead): the backend hands it to ProcessAhead, or to
// DropAhead when the message is not handled.
type Ahead struct {
	key, token string
	dl         delivery  // its message's, at its turn (deliveryAhead)
	start      time.Time // before the claim went out
	// Under mu: answered once st and err are set; wait, made by a
	// waiter that came first (ready), is closed then. (Most claims are
	// answered before their message's turn: no channel for them.)
	mu       sync.Mutex
	answered bool
	wait     chan struct{}
	st       consumer.DedupeState
	err      error
	// Under deduper.aheadMu: started once its message's turn came;
	// stolen once another message took its claim over (its message
	// claims again with a token of its own).
	started, stolen bool
}

// claimAhead starts the claim of msg's key in the store's queue, or
// returns nil: no dedupe, a store without one, a store failing, no
// claims ahead (fresh), or a key that fails or is empty (the message's
// turn decides).
func (d *deduper) claimAhead(msg consumer.Message) *Ahead {
	if d.lstore == nil || d.fresh <= 0 || d.down() {
		return nil
	}
	k, err := d.opts.Key(msg)
	if err != nil || k == "" {
		return nil
	}
	a := &Ahead{key: k, token: d.newToken(), start: d.now()}
	d.lstore.ClaimLater(k, a.token, d.opts.ClaimTTL, func(st consumer.DedupeState, err error) {
		if err != nil {
			d.failed(err)
		}
		if err == nil && st == consumer.DedupeClaimed {
			d.aheadMu.Lock()
			if !a.started && d.holders[a.key] == nil {
				d.holders[a.key] = a
			}
			d.aheadMu.Unlock()
		}
		a.answer(st, err)
	})
	return a
}

// answer sets a's claim's answer and wakes its waiter, if any.
func (a *Ahead) answer(st consumer.DedupeState, err error) {
	a.mu.Lock()
	a.st, a.err, a.answered = st, err, true
	w := a.wait
	a.mu.Unlock()
	if w != nil {
		close(w)
	}
}

// ready returns nil once a's claim is answered (st and err are then
// set), or a channel closed when it is.
func (a *Ahead) ready() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.answered {
		return nil
	}
	if a.wait == nil {
		a.wait = make(chan struct{})
	}
	return a.wait
}

// start records that a's message came to its turn; it reports false when
// another message took a's claim over (steal).
func (d *deduper) start(a *Ahead) bool {
	d.aheadMu.Lock()
	defer d.aheadMu.Unlock()
	if a.stolen {
		return false
	}
	a.started = true
	if d.holders[a.key] == a {
		delete(d.holders, a.key)
	}
	return true
}

// steal takes over, for dl, the claim ahead of dl's key that a message
// of this replica holds and has not started: dl then holds it with that
// token, and the other message claims again at its turn (and waits for
// dl). Without it, dl could wait for a message queued in another lane,
// which waits for a worker that dl holds (with fewer workers than lanes).
func (d *deduper) steal(dl *delivery) bool {
	d.aheadMu.Lock()
	defer d.aheadMu.Unlock()
	h := d.holders[dl.key]
	if h == nil || h.token == dl.token {
		return false
	}
	delete(d.holders, dl.key)
	h.stolen = true
	dl.token = h.token
	return true
}

// dropAhead releases a's claim: its message is not handled. The release
// is queued after the claim.
func (d *deduper) dropAhead(a *Ahead) {
	if !d.start(a) {
		return // its claim is another message's now
	}
	d.lstore.ReleaseLater(a.key, a.token, func(err error) {
		if err != nil {
			d.failed(err)
		}
	})
}

// down reports whether the store counts as failing (dedupeProbe).
func (d *deduper) down() bool {
	until := d.downUntil.Load()
	return until != 0 && time.Now().UnixNano() < until
}

// Marking is a dedupe mark under way after a send (MarksLater): the
// backend commits or acks the message in Then. It is safe for concurrent
// use.
type Marking struct {
	mu   sync.Mutex
	done bool
	then func()
}

// Then calls fn once the mark ended (at once if it did): the key is
// marked sent, or the mark failed and Dedupe.OnStoreError applied. Call it
// once.
func (m *Marking) Then(fn func()) {
	m.mu.Lock()
	if !m.done {
		m.then = fn
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	fn()
}

func (m *Marking) finish() {
	m.mu.Lock()
	m.done = true
	fn := m.then
	m.mu.Unlock()
	if fn != nil {
		fn()
	}
}

func (d *deduper) newDelivery() *delivery { return &delivery{token: d.newToken()} }

func (d *deduper) newToken() string {
	var b [32]byte
	return string(strconv.AppendUint(append(b[:0], d.prefix...), d.seq.Add(1), 36))
}

// deliveryAhead is the delivery of a message claimed ahead (a may be nil).
func (d *deduper) deliveryAhead(a *Ahead) *delivery {
	if a == nil {
		return d.newDelivery()
	}
	a.dl = delivery{token: a.token, key: a.key, keyed: true, ahead: a}
	return &a.dl
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
		st, store, err := d.claimFirst(ctx, dl)
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
		if d.later && d.lstore != nil && dl.store {
			d.markLater(dl)
			return nil
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

// claimFirst is claim, for the first attempt of a message claimed ahead
// (dl.ahead): it waits for that claim and uses its answer, claimed (while
// fresh) or sent; else (held by another token, stale, failed) it claims
// as claim does.
func (d *deduper) claimFirst(ctx context.Context, dl *delivery) (consumer.DedupeState, consumer.DedupeStore, error) {
	a := dl.ahead
	if a == nil {
		return d.claimStealing(ctx, dl)
	}
	dl.ahead = nil
	if !d.start(a) {
		// Another message took the claim over: claim with a token of
		// our own, waiting for it.
		dl.token = d.newToken()
		return d.claim(ctx, dl)
	}
	if w := a.ready(); w != nil {
		d.lstore.Flush() // its turn came: the claim goes now
		select {
		case <-w:
		case <-ctx.Done():
			dl.store = true // it may be claimed: Process releases it
			return 0, nil, ctx.Err()
		}
	}
	if a.err == nil {
		switch {
		case a.st == consumer.DedupeSent:
			return a.st, d.opts.Store, nil
		case a.st == consumer.DedupeClaimed && d.now().Sub(a.start) < d.fresh:
			d.downUntil.Store(0)
			return a.st, d.opts.Store, nil
		case a.st == consumer.DedupeClaimed:
			dl.store = true // stale: claimed again below, or released
			return d.claim(ctx, dl)
		}
	}
	return d.claimStealing(ctx, dl)
}

// claimStealing is claim, after taking over the claim ahead of dl's key
// that a message of this replica holds and has not started (steal), if
// any: that claim is then extended with its token, without a wait.
func (d *deduper) claimStealing(ctx context.Context, dl *delivery) (consumer.DedupeState, consumer.DedupeStore, error) {
	if d.lstore != nil && d.steal(dl) {
		dl.store = true // the token holds it: claimed again below, or released
	}
	return d.claim(ctx, dl)
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
	d.markKey(ctx, dl.key, dl.token, dl.store, dl.local)
	dl.store, dl.local = false, false
}

// markLater marks dl's key sent in the store's queue (MarksLater), and
// in the local store as mark does; dl.marking ends when it is done.
func (d *deduper) markLater(dl *delivery) {
	m, key, token, local := &dl.mk, dl.key, dl.token, dl.local
	dl.marking, dl.store, dl.local = m, false, false
	d.lstore.MarkSentLater(key, token, d.opts.Window, func(err error) {
		if err != nil {
			d.failed(err)
			local = d.local != nil
		}
		if local {
			_ = d.local.MarkSent(context.Background(), key, token, d.opts.Window)
		}
		m.finish()
	})
}

// markKey marks key, claimed by token, sent in the store (store) and in
// the local store (local), and in the local one when the store fails
// under ModeLocal.
func (d *deduper) markKey(ctx context.Context, key, token string, store, local bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dedupeAfterTimeout)
	defer cancel()
	if store {
		if err := d.opts.Store.MarkSent(ctx, key, token, d.opts.Window); err != nil {
			d.failed(err)
			local = d.local != nil
		}
	}
	if local {
		_ = d.local.MarkSent(ctx, key, token, d.opts.Window)
	}
}

// release gives back dl's claims: the message was not delivered. A
// release that fails leaves the claim to expire.
func (d *deduper) release(ctx context.Context, dl *delivery) {
	if dl.ahead != nil { // claimed ahead, ended before its first claim step
		d.dropAhead(dl.ahead)
		dl.ahead = nil
	}
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
