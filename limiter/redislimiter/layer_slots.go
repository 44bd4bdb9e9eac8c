package redislimiter

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
)

// slotsReleaseScript gives back concurrency slots, several in one call,
// and announces the releases that free a slot of a key whose slots were
// all held (lua/slots_release.lua).
var slotsReleaseScript = redis.NewScript(luaSource("slots_release.lua"))

// slotsChannel returns the Pub/Sub channel on which a bucket's slot
// releases are announced: PREFIX{NAME}:slots.
func (l *Layered) slotsChannel() string {
	return l.cfg.Prefix + "{" + l.cfg.Bucket + "}:slots"
}

// ReleaseSlots implements backend.SlotStore: it gives back the slots in
// one script call on a single node (one per slot on a Cluster, pipelined),
// batched with the releases of concurrent callers: a call that finds none
// in flight is sent at once, and its caller waits for it; those that
// arrive meanwhile are queued, their callers return at once, and they go
// together when the call in flight returns (a failure then leaves them to
// their leases). A release that frees a slot of a key whose slots were all
// held is announced on PREFIX{NAME}:slots, which wakes the requests that
// wait for that key on every replica (WatchSlots).
func (l *Layered) ReleaseSlots(ctx context.Context, slots []backend.SlotRelease) error {
	if len(slots) == 0 {
		return nil
	}
	return l.releases.release(ctx, slots)
}

// releaseSlots sends one release call for slots.
func (l *Layered) releaseSlots(ctx context.Context, slots []backend.SlotRelease) error {
	one := func(slots []backend.SlotRelease) ([]string, []any) {
		keys := make([]string, 0, len(slots))
		args := make([]any, 0, 1+3*len(slots))
		args = append(args, l.slotsChannel())
		for _, s := range slots {
			i, err := l.layerIndex(s.Layer)
			if err != nil || !l.layers[i].IsConcurrency() {
				continue
			}
			keys = append(keys, l.layerKey(i, s.Key))
			args = append(args, s.Holder, l.layers[i].Concurrency, "slot "+s.Layer+" "+s.Key)
		}
		return keys, args
	}
	if !l.cluster {
		keys, args := one(slots)
		if len(keys) == 0 {
			return nil
		}
		if err := slotsReleaseScript.Run(ctx, l.client, keys, args...).Err(); err != nil {
			return l.fail("release slots", err)
		}
		return nil
	}
	pipe := l.client.Pipeline()
	for _, s := range slots {
		keys, args := one([]backend.SlotRelease{s})
		if len(keys) > 0 {
			slotsReleaseScript.Run(ctx, pipe, keys, args...)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return l.fail("release slots", err)
	}
	return nil
}

// releaseBatcher sends the concurrent ReleaseSlots of one store together:
// a caller that finds no call in flight sends its slots, and then, until
// the queue is empty, those queued meanwhile, each batch one call (up to
// maxReleaseBatch slots), and returns that first call's error; a caller
// that finds one in flight queues its slots and returns at once. It is
// safe for concurrent use.
type releaseBatcher struct {
	l *Layered

	mu       sync.Mutex
	flushing bool
	queue    []*releasePending
}

type releasePending struct {
	slots []backend.SlotRelease
	err   error
	done  chan struct{}
}

// maxReleaseBatch bounds the slots of one release call.
const maxReleaseBatch = 256

func (b *releaseBatcher) release(ctx context.Context, slots []backend.SlotRelease) error {
	p := &releasePending{slots: slots, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	if b.flushing {
		// The caller that flushes sends it with the next batch: this
		// one need not wait for it (a failure leaves the slot to its
		// lease), so that its handler is free at once.
		b.mu.Unlock()
		return nil
	}
	b.flushing = true
	for len(b.queue) > 0 {
		var batch []*releasePending
		var all []backend.SlotRelease
		for len(b.queue) > 0 && (len(all) == 0 || len(all)+len(b.queue[0].slots) <= maxReleaseBatch) {
			batch = append(batch, b.queue[0])
			all = append(all, b.queue[0].slots...)
			b.queue = b.queue[1:]
		}
		b.mu.Unlock()
		// Without the caller's deadline: a release the caller gave up
		// waiting for still goes out, bounded by the client's timeouts.
		err := b.l.releaseSlots(context.WithoutCancel(ctx), all)
		for _, q := range batch {
			q.err = err
			close(q.done)
		}
		b.mu.Lock()
	}
	b.flushing = false
	b.mu.Unlock()
	return p.err
}

// WatchSlots implements backend.SlotNotifier: it calls released with the
// layer and key of each announced release of the bucket's slots until ctx
// ends, and all() after each resubscription (announcements may have been
// missed). It shares the client's Pub/Sub connection with Watch; the
// callbacks must not block.
func (l *Layered) WatchSlots(ctx context.Context, released func(layer, key string), all func()) {
	h := joinHub(l.client)
	defer h.leave()
	w := &watcher{changed: all, message: func(payload string) {
		rest, ok := strings.CutPrefix(payload, "slot ")
		if !ok {
			return
		}
		if layer, key, ok := strings.Cut(rest, " "); ok {
			released(layer, key)
		}
	}}
	ch := l.slotsChannel()
	h.add(ctx, ch, w)
	defer h.remove(ch, w)
	<-ctx.Done()
}

var (
	_ backend.SlotStore    = (*Layered)(nil)
	_ backend.SlotNotifier = (*Layered)(nil)
)
