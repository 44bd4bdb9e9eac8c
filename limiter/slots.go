package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// ErrNeedsAcquire is returned by WaitN, Wait and Allow on a store with a
// concurrency layer (Layer.Concurrency): only Acquire returns the slots,
// which its caller must release.
var ErrNeedsAcquire = errors.New("a concurrency layer's slots need Acquire and Release")

// Held is what Acquire granted: the slots of the store's concurrency
// layers that the request holds until Release. A nil *Held holds nothing.
// It is safe for concurrent use.
type Held struct {
	b     *Bucket
	store backend.SlotStore
	slots []backend.SlotRelease
	grant Grant
	once  sync.Once
}

// Release gives the slots back, once; further calls do nothing. It wakes
// this process's requests that wait for them at once, and those of the
// other replicas through the store. It does not block for longer than the
// Bucket's Options.ProbeInterval: a release the store does not take in
// time (Redis down) is given back when its lease ends.
func (h *Held) Release() {
	if h == nil || len(h.slots) == 0 {
		return
	}
	h.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.b.opts.ProbeInterval)
		defer cancel()
		if h.store == nil { // granted with the store bypassed (ModeOpen)
		} else if err := h.store.ReleaseSlots(ctx, h.slots); err != nil {
			h.b.log.Debug("releasing concurrency slots failed; their lease gives them back", "slots", len(h.slots), "error", err)
		}
		for _, s := range h.slots {
			h.b.slotQueues.wake(s.Layer, s.Key)
		}
	})
}

// Acquire is WaitN for a store with concurrency layers (Layer.Concurrency):
// it blocks as WaitN does, and the grant also holds one slot of each
// concurrency layer for the request's key, which the caller gives back
// with Held.Release once the request is done (the sink answered), on every
// path: success, failure, shutdown. A slot not released is given back when
// its lease ends (Layer.Lease, counted from when the request goes out), as
// for a process killed while holding it.
//
// A request that finds every slot of a key held waits in line: the
// requests of one key in this process ask in the order they came (FIFO),
// and the first asks again the moment a slot of the key is released, here
// or on another replica (the store announces it), or at the earliest
// lease end, never by polling. A concurrency layer with on_exceed
// dead_letter or delay refuses instead, with a *LimitError (a delay one
// asks to come back after at most backend's ConcurrencyRetry, 1 s). A
// failed Acquire holds nothing. On a store without concurrency layers it
// is WaitN, and Release does nothing. Held.Grant says how the request
// waited, as WaitGrant does.
func (b *Bucket) Acquire(ctx context.Context, req Request) (*Held, error) {
	var (
		g       Grant
		holder  string
		keys    []string
		granted backend.SlotStore
	)
	if b.hasSlots() {
		var err error
		if keys, err = backend.LayerKeys(b.layered.layers, backend.LayerRequest{Keys: req.Keys}); err != nil {
			return nil, err
		}
		holder = b.slotQueues.holder()
	}
	start := b.clock.Now()
	if err := b.waitN(ctx, req, &g, holder, &granted); err != nil {
		return nil, err
	}
	g.Waited = b.clock.Now().Sub(start)
	h := &Held{b: b, grant: g}
	if holder != "" {
		h.store, h.slots = granted, backend.Slots(b.layered.layers, keys, holder)
	}
	return h, nil
}

// Grant says how the request was granted, as WaitGrant does; the zero
// Grant for a nil Held.
func (h *Held) Grant() Grant {
	if h == nil {
		return Grant{}
	}
	return h.grant
}

// hasSlots reports whether the Bucket's store has a concurrency layer.
func (b *Bucket) hasSlots() bool {
	return b.layeredStore() != nil && backend.HasConcurrency(b.layered.layers)
}

// slotQueues are the lines of the requests that wait for a concurrency
// slot, per layer and key, in this process. A request joins the line of
// its key in the first concurrency layer before it asks (Bucket.waitN),
// asks only at its head, and leaves it when it is done; on the other
// concurrency layers it only listens. A release wakes the head and the
// listeners of its key.
type slotQueues struct {
	mu     sync.Mutex
	m      map[slotKey]*slotLine
	prefix string // this process's holder prefix, made once
	once   sync.Once
	seq    atomic.Uint64
}

type slotKey struct{ layer, key string }

type slotLine struct {
	ordered   []*slotWaiter // FIFO: ordered[0] asks
	listeners map[*slotWaiter]struct{}
}

// slotWaiter is one request in the lines. wake holds at most one signal:
// become the head, or a slot was released.
type slotWaiter struct{ wake chan struct{} }

// holder returns a name for a request's slots, unique across replicas: a
// random prefix of this Bucket and a sequence number.
func (q *slotQueues) holder() string {
	q.once.Do(func() {
		var r [8]byte
		_, _ = rand.Read(r[:])
		q.prefix = hex.EncodeToString(r[:]) + "-"
	})
	return q.prefix + strconv.FormatUint(q.seq.Add(1), 36)
}

// join puts w in the line of the first of ks and among the listeners of
// the others. It reports whether w is the head of its line.
func (q *slotQueues) join(w *slotWaiter, ks []slotKey) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = map[slotKey]*slotLine{}
	}
	head := true
	for j, k := range ks {
		ln := q.m[k]
		if ln == nil {
			ln = &slotLine{}
			q.m[k] = ln
		}
		if j == 0 {
			ln.ordered = append(ln.ordered, w)
			head = len(ln.ordered) == 1
			continue
		}
		if ln.listeners == nil {
			ln.listeners = map[*slotWaiter]struct{}{}
		}
		ln.listeners[w] = struct{}{}
	}
	return head
}

// leave takes w out of the lines of ks; the next in line, if w was the
// head, asks at once.
func (q *slotQueues) leave(w *slotWaiter, ks []slotKey) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for j, k := range ks {
		ln := q.m[k]
		if ln == nil {
			continue
		}
		if j == 0 {
			for i, o := range ln.ordered {
				if o == w {
					ln.ordered = append(ln.ordered[:i], ln.ordered[i+1:]...)
					if i == 0 && len(ln.ordered) > 0 {
						signal(ln.ordered[0].wake)
					}
					break
				}
			}
		} else {
			delete(ln.listeners, w)
		}
		if len(ln.ordered) == 0 && len(ln.listeners) == 0 {
			delete(q.m, k)
		}
	}
}

// wake tells the head and the listeners of a key's line that a slot was
// released.
func (q *slotQueues) wake(layer, key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ln := q.m[slotKey{layer, key}]; ln != nil {
		wakeLine(ln)
	}
}

// wakeAll wakes every line: releases may have been missed.
func (q *slotQueues) wakeAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, ln := range q.m {
		wakeLine(ln)
	}
}

func wakeLine(ln *slotLine) {
	if len(ln.ordered) > 0 {
		signal(ln.ordered[0].wake)
	}
	for w := range ln.listeners {
		signal(w.wake)
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// slotKeys returns the request's keys in the concurrency layers, in the
// order of layers.
func slotKeys(layers []Layer, keys map[string]string) []slotKey {
	var out []slotKey
	for _, l := range layers {
		if !l.IsConcurrency() {
			continue
		}
		k := ""
		if l.Keyed {
			k = keys[l.Name]
		}
		out = append(out, slotKey{l.Name, k})
	}
	return out
}

// awaitTurn blocks until w is the head of its line, ctx ends or the Bucket
// closes.
func (b *Bucket) awaitTurn(ctx context.Context, w *slotWaiter) error {
	select {
	case <-w.wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-b.done:
		return ErrClosed
	}
}

// sleepSlot is sleep for a request that found every slot of a
// concurrency layer held: it also ends when a slot of its key is released
// (errChanged).
func (b *Bucket) sleepSlot(ctx context.Context, w *slotWaiter, changed <-chan struct{}, d time.Duration) error {
	err := b.sleepOn(ctx, changed, w.wake, d)
	if errors.Is(err, errPushed) {
		return errChanged
	}
	return err
}
