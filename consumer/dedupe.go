package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// Dedupe says that a message whose key was already sent is not sent
// again (Options.Dedupe): the consumer claims the message's key in a
// DedupeStore before each handler attempt (after the limiter granted it),
// marks it sent once the handler succeeded, and releases the claim when the
// message does not end delivered (dead-lettered, set aside, abandoned). A
// message whose key is already marked is acked or committed without a
// handler call (MessageObserver.Deduplicated); one whose key another
// handler holds waits until that holder marks or releases it, or its claim
// expires. The Kafka consumer, with a store that queues its operations
// (redisdedupe.Store), claims each message's key as it fetches it instead,
// and commits it once its queued mark is written. The guide is
// docs/dedupe.md.
//
// Key is required; the other fields have defaults. Dedupe is a
// plain value, safe to copy; its functions must be safe for concurrent
// use.
type Dedupe struct {
	// Store keeps the claims and marks, shared by every replica
	// (consumer/redisdedupe). Default: this process's memory
	// (NewLocalDedupeStore), which dedupes within one replica only.
	Store DedupeStore
	// Key gives a message's dedupe key, such as its message-id header.
	// Required. An empty key means the message has none: it is handled
	// without dedupe (MessageObserver.DedupeSkipped, reason
	// DedupeSkipNoKey), or dead-lettered with ErrNoDedupeKey under
	// RequireKey. An error fails the message: make it Permanent when
	// retrying cannot help.
	Key KeyFunc
	// Window is how long a key stays marked sent after the handler
	// succeeded: a copy that comes within it is not sent. Default 24h.
	Window time.Duration
	// SendTimeout is the longest one handler call (the sink's send) takes,
	// such as the sink's request timeout. Default 10s.
	SendTimeout time.Duration
	// ClaimTTL is how long a claim lives without its holder marking or
	// releasing it: a replica that dies mid-send leaves its claim, and the
	// message is sent again once the claim expired (never zero times).
	// Each attempt claims again (its own claim is extended), so the claim
	// covers the sends and the backoffs between them. Default SendTimeout
	// × Options.Retry.MaxAttempts (10s × 5 = 50s with the defaults), at
	// least a second.
	ClaimTTL time.Duration
	// OnStoreError says what happens while the store fails (the
	// limiter's modes, limiter.Mode): ModeLocal claims and marks in this
	// process (duplicates are caught within the replica only), ModeOpen
	// sends without dedupe, ModeClosed waits for the store, sending
	// nothing, until it answers or the message is abandoned at shutdown.
	// A duplicate send is possible under local and open. Default
	// ModeLocal.
	OnStoreError limiter.Mode
	// RequireKey dead-letters a message without a key (Key returns "")
	// with an error wrapping ErrNoDedupeKey, instead of sending it
	// without dedupe.
	RequireKey bool
}

// The defaults of Dedupe.
const (
	// DefaultDedupeWindow is the default of Dedupe.Window.
	DefaultDedupeWindow = 24 * time.Hour
	// DefaultDedupeSendTimeout is the default of Dedupe.SendTimeout.
	DefaultDedupeSendTimeout = 10 * time.Second
)

// ErrNoDedupeKey is wrapped, as a permanent error, by the failure of a
// message without a dedupe key under Dedupe.RequireKey.
var ErrNoDedupeKey = errors.New("message has no dedupe key")

// The reasons of MessageObserver.DedupeSkipped: why a message was handled
// without dedupe.
const (
	// DedupeSkipNoKey: the message has no dedupe key.
	DedupeSkipNoKey = "no_key"
	// DedupeSkipStoreError: the store failed under ModeOpen.
	DedupeSkipStoreError = "store_error"
)

// validate returns the problems of d, as FieldErrors under "Dedupe.".
func (d *Dedupe) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: "Dedupe." + field, Err: fmt.Errorf(format, args...)})
	}
	if d.Key == nil {
		bad("Key", "is required")
	}
	if d.Window < 0 {
		bad("Window", "%v must not be negative", d.Window)
	}
	if d.SendTimeout < 0 {
		bad("SendTimeout", "%v must not be negative", d.SendTimeout)
	}
	if d.ClaimTTL < 0 {
		bad("ClaimTTL", "%v must not be negative", d.ClaimTTL)
	}
	switch d.OnStoreError {
	case "", limiter.ModeLocal, limiter.ModeClosed, limiter.ModeOpen:
	default:
		bad("OnStoreError", "must be %s, %s or %s, got %q", limiter.ModeLocal, limiter.ModeClosed, limiter.ModeOpen, string(d.OnStoreError))
	}
	return errs
}

// DedupeState is what a DedupeStore's Claim found.
type DedupeState int

const (
	// DedupeClaimed: the caller's token holds the claim (a new claim, or
	// its own extended); it may send.
	DedupeClaimed DedupeState = iota + 1
	// DedupeSent: the key is marked sent; the message is not sent again.
	DedupeSent
)

// DedupeStore keeps dedupe claims and marks for the consumers of every
// replica (Dedupe.Store). A token names one delivery of a message being
// handled: a store must tell it from every other. Implementations must be
// safe for concurrent use, and every method must return once ctx ends.
type DedupeStore interface {
	// Claim claims key for token, for ttl. It returns DedupeClaimed when
	// the key had no claim, or token's own (extended by ttl); DedupeSent
	// when the key is marked sent. While another token holds it, Claim
	// waits, exactly (no polling), until the holder marks or releases it
	// or its claim expires, and decides again.
	Claim(ctx context.Context, key, token string, ttl time.Duration) (DedupeState, error)
	// MarkSent marks key sent for window, whoever holds its claim, and
	// wakes the Claims waiting for it.
	MarkSent(ctx context.Context, key, token string, window time.Duration) error
	// Release deletes token's claim of key, if token still holds it, and
	// wakes the Claims waiting for it.
	Release(ctx context.Context, key, token string) error
}

// NewLocalDedupeStore returns a DedupeStore in this process's memory: it
// dedupes the messages of this replica only, for a single replica or a
// test, and is what Dedupe.OnStoreError ModeLocal falls back on. Expired
// entries are removed as they are met and by a sweep every minute or so
// of calls. It is safe for concurrent use and needs no Close.
func NewLocalDedupeStore() DedupeStore { return newLocalDedupe(time.Now) }

// localDedupe is the in-process DedupeStore. now is its clock; the state
// functions (claimAt, markAt, releaseAt) decide at a given instant, for
// tests at fixed instants.
type localDedupe struct {
	now func() time.Time

	mu        sync.Mutex
	keys      map[string]*localEntry
	lastSweep time.Time
}

type localEntry struct {
	sent    bool
	token   string
	expires time.Time
	changed chan struct{} // closed when the entry is marked or released
}

func newLocalDedupe(now func() time.Time) *localDedupe {
	return &localDedupe{now: now, keys: make(map[string]*localEntry)}
}

// claimAt decides a claim of key by token at now: DedupeClaimed or
// DedupeSent, or 0 with the held claim's remaining time and the channel
// closed when it is marked or released.
func (l *localDedupe) claimAt(now time.Time, key, token string, ttl time.Duration) (DedupeState, time.Duration, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	e := l.keys[key]
	if e != nil && !now.Before(e.expires) {
		delete(l.keys, key)
		e = nil
	}
	switch {
	case e == nil:
		l.keys[key] = &localEntry{token: token, expires: now.Add(ttl), changed: make(chan struct{})}
		return DedupeClaimed, 0, nil
	case e.sent:
		return DedupeSent, 0, nil
	case e.token == token:
		e.expires = now.Add(ttl)
		return DedupeClaimed, 0, nil
	}
	return 0, e.expires.Sub(now), e.changed
}

func (l *localDedupe) markAt(now time.Time, key string, window time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.keys[key]; e != nil && e.changed != nil {
		close(e.changed)
	}
	l.keys[key] = &localEntry{sent: true, expires: now.Add(window)}
}

func (l *localDedupe) releaseAt(key, token string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.keys[key]; e != nil && !e.sent && e.token == token {
		close(e.changed)
		delete(l.keys, key)
	}
}

// sweep removes the expired entries, at most once a minute.
func (l *localDedupe) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < time.Minute {
		return
	}
	l.lastSweep = now
	for k, e := range l.keys {
		if !now.Before(e.expires) {
			delete(l.keys, k)
		}
	}
}

func (l *localDedupe) Claim(ctx context.Context, key, token string, ttl time.Duration) (DedupeState, error) {
	for {
		st, wait, changed := l.claimAt(l.now(), key, token, ttl)
		if st != 0 {
			return st, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

func (l *localDedupe) MarkSent(_ context.Context, key, _ string, window time.Duration) error {
	l.markAt(l.now(), key, window)
	return nil
}

func (l *localDedupe) Release(_ context.Context, key, token string) error {
	l.releaseAt(key, token)
	return nil
}
