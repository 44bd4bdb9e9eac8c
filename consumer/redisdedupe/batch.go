package redisdedupe

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/consumer"
)

// The kinds of operations, as lua/dedupe.lua reads them.
var kindClaim, kindMark, kindRelease any = "c", "m", "r"

const (
	// maxBatch is the most operations sent in one call.
	maxBatch = 128
	// linger is the longest an operation queued with later waits for
	// others before it goes out.
	linger = 2 * time.Millisecond
)

// op is one claim, mark or release waiting in a batcher: kind 'c', 'm' or
// 'r', its key, token and TTL (ms), as lua/dedupe.lua reads them.
// (kind and ttl are boxed once, not at each call, and key and token go to
// the script as *string, which go-redis writes without boxing a copy: a
// script argument is an interface.)
type op struct {
	kind  any // kindClaim, kindMark or kindRelease
	key   string
	token string
	ttl   any // a string, boxed once (Store.msArg)
	res   any
	err   error
	done  chan struct{} // closed when res and err are set; nil for later
	lead  chan struct{} // receives when this op's caller is to send the next batch; nil for later
	// later: one of these is called with the reply (laterOp), and the op
	// goes back to opPool.
	cb      func(any, error)
	claimed func(consumer.DedupeState, error) // the reply read by claimReply
	ended   func(error)                       // the error, wrapped with what
	what    string                            // "mark" or "release", for ended's error
}

// opPool recycles the ops of later, which nobody references once their
// callback returned.
var opPool = sync.Pool{New: func() any { return new(op) }}

// batcher sends the operations of concurrent callers together: while one
// call is in flight, the operations that arrive queue, and the caller of
// the first of them sends them all (up to maxBatch) when it returns, as
// one call of dedupeScript on a single Redis node, or, on a Cluster (where
// the keys are in many slots), as one pipeline of a call per operation. A
// lone operation of do goes out at once; one of later waits up to linger
// for others (or until maxBatch are queued), unless a call of do takes it
// along sooner. The operations go out in the order they were queued. It is
// safe for concurrent use; it has no goroutine of its own but the timer
// and, when maxBatch operations of later are queued, a sender that ends
// when the queue is empty.
type batcher struct {
	client  Client
	channel string
	cluster bool
	linger  time.Duration
	// proc runs a script call built by send (args, reused: one send at a
	// time); nil on a client without it, which goes through
	// dedupeScript.Run.
	proc processor
	args []any

	mu    sync.Mutex
	queue []*op
	busy  bool        // a caller is sending a batch
	timer *time.Timer // armed: operations of later wait for it
	armed bool
	// urgent: the queue goes out right after the call in flight (flush).
	urgent bool
}

func newBatcher(client Client, channel string) *batcher {
	var cluster bool
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		cluster = true
	}
	b := &batcher{client: client, channel: channel, cluster: cluster, linger: linger}
	b.proc, _ = client.(processor)
	b.timer = time.AfterFunc(time.Hour, b.fire)
	b.timer.Stop()
	return b
}

// later queues the operation kind on key, to go out within linger with the
// operations of other callers, and calls cb with its reply, from the
// goroutine that sent it: cb must not block.
func (b *batcher) later(kind any, key, token string, ttl any, cb func(any, error)) {
	o := opPool.Get().(*op)
	o.kind, o.key, o.token, o.ttl, o.cb = kind, key, token, ttl, cb
	b.laterOp(o)
}

// laterOp is later for an op of opPool with its kind, key, token, ttl and
// one callback set (cb, claimed, or ended with what).
func (b *batcher) laterOp(o *op) {
	b.mu.Lock()
	b.queue = append(b.queue, o)
	send := false
	switch {
	case b.busy: // goes with, or after, the call in flight
	case len(b.queue) >= maxBatch:
		b.busy, send = true, true
	case !b.armed:
		b.armed = true
		b.timer.Reset(b.linger)
	}
	b.mu.Unlock()
	if send {
		go b.send()
	}
}

// flush sends the queued operations now, from the caller's goroutine,
// or, while a call is in flight, right after it.
func (b *batcher) flush() {
	b.mu.Lock()
	if b.busy {
		b.urgent = true
		b.mu.Unlock()
		return
	}
	if len(b.queue) == 0 {
		b.mu.Unlock()
		return
	}
	b.busy = true
	b.mu.Unlock()
	b.send()
}

// fire sends the operations of later that waited linger, unless a call is
// in flight (the queue goes after it).
func (b *batcher) fire() {
	b.mu.Lock()
	b.armed = false
	if b.busy || len(b.queue) == 0 {
		b.mu.Unlock()
		return
	}
	b.busy = true
	b.mu.Unlock()
	b.send()
}

// do runs the operation kind on key, in a batch with the operations of
// other callers, and returns its reply.
func (b *batcher) do(kind any, key, token string, ttl any) (any, error) {
	o := &op{kind: kind, key: key, token: token, ttl: ttl, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, o)
	lead := !b.busy
	b.busy = true
	b.mu.Unlock()
	if lead {
		b.send()
	}
	for {
		select {
		case <-o.done:
			return o.res, o.err
		case <-o.lead:
			b.send()
		}
	}
}

// send sends the queued operations, up to maxBatch, then hands the lead to
// the first one still queued.
func (b *batcher) send() {
	b.mu.Lock()
	n := min(len(b.queue), maxBatch)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	b.mu.Unlock()

	ctx := context.Background() // the client's timeouts bound it
	if b.cluster && len(batch) > 1 {
		pipe := b.client.Pipeline()
		cmds := make([]*redis.Cmd, len(batch))
		for i, o := range batch {
			cmds[i] = dedupeScript.EvalSha(ctx, pipe, []string{o.key}, b.channel, o.kind, o.token, o.ttl)
		}
		_, _ = pipe.Exec(ctx)
		for i, o := range batch {
			v, err := cmds[i].Result()
			if redis.HasErrorPrefix(err, "NOSCRIPT") {
				v, err = dedupeScript.Run(ctx, b.client, []string{o.key}, b.channel, o.kind, o.token, o.ttl).Result()
			}
			o.res, o.err = first(v, err)
		}
	} else {
		v, err := b.call(ctx, batch)
		if err == nil && len(v) != len(batch) {
			err = fmt.Errorf("%d replies to %d operations", len(v), len(batch))
		}
		for i, o := range batch {
			if err != nil {
				o.err = err
			} else {
				o.res = v[i]
			}
		}
	}
	for _, o := range batch {
		switch {
		case o.done != nil:
			close(o.done)
			continue
		case o.claimed != nil:
			st, _, err := claimReply(o.res, o.err)
			o.claimed(st, err)
		case o.ended != nil:
			err := o.err
			if err != nil {
				err = fmt.Errorf("redisdedupe: %s: %w", o.what, err)
			}
			o.ended(err)
		default:
			o.cb(o.res, o.err)
		}
		*o = op{}
		opPool.Put(o)
	}

	// The next batch: sent by the first caller of do still queued (with
	// the operations queued before its own), or at once while maxBatch
	// are queued, or after linger.
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range b.queue {
		if o.lead != nil {
			o.lead <- struct{}{}
			return
		}
	}
	switch {
	case len(b.queue) >= maxBatch || len(b.queue) > 0 && b.urgent:
		b.urgent = false
		go b.send()
	case len(b.queue) > 0:
		b.busy = false
		if !b.armed {
			b.armed = true
			b.timer.Reset(b.linger)
		}
	default:
		b.busy, b.urgent = false, false
	}
}

// first returns the one reply of a call of dedupeScript with one
// operation.
func first(v any, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	if s, ok := v.([]any); ok && len(s) == 1 {
		return s[0], nil
	}
	return nil, fmt.Errorf("unexpected reply %v", v)
}

// processor is what a go-redis client has besides Client: running a
// command built by the caller.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// call runs dedupeScript once for batch on a single node: EVALSHA, and
// EVAL when Redis does not have the script. With a client that has
// Process (every go-redis client), its keys and tokens go as *string and
// the argument slice is reused, so that an operation allocates nothing
// here.
func (b *batcher) call(ctx context.Context, batch []*op) ([]any, error) {
	if b.proc == nil {
		keys := make([]string, len(batch))
		args := make([]any, 0, 1+3*len(batch))
		args = append(args, b.channel)
		for i, o := range batch {
			keys[i] = o.key
			args = append(args, o.kind, o.token, o.ttl)
		}
		return dedupeScript.Run(ctx, b.client, keys, args...).Slice()
	}
	args := append(b.args[:0], "evalsha", dedupeSHA, len(batch))
	for _, o := range batch {
		args = append(args, &o.key)
	}
	args = append(args, &b.channel)
	for _, o := range batch {
		args = append(args, o.kind, &o.token, o.ttl)
	}
	defer func() {
		clear(args)
		b.args = args[:0]
	}()
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	_ = b.proc.Process(ctx, cmd)
	v, err := cmd.Slice()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", dedupeLua
		cmd = redis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		_ = b.proc.Process(ctx, cmd)
		v, err = cmd.Slice()
	}
	return v, err
}
