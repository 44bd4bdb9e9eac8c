package redisdedupe

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxBatch is the most operations sent in one call.
const maxBatch = 128

// op is one claim, mark or release waiting in a batcher: kind 'c', 'm' or
// 'r', its key, token and TTL (ms), as lua/dedupe.lua reads them.
type op struct {
	kind  string
	key   string
	token string
	ttl   string
	res   any
	err   error
	done  chan struct{} // closed when res and err are set
	lead  chan struct{} // receives when this op's caller is to send the next batch
}

// batcher sends the operations of concurrent callers together: while one
// call is in flight, the operations that arrive queue, and the caller of
// the first of them sends them all (up to maxBatch) when it returns, as
// one call of dedupeScript on a single Redis node, or, on a Cluster (where
// the keys are in many slots), as one pipeline of a call per operation. A
// lone operation goes out at once. It is safe for concurrent use and has
// no goroutine of its own.
type batcher struct {
	client  Client
	channel string
	cluster bool

	mu    sync.Mutex
	queue []*op
	busy  bool // a caller is sending a batch
}

func newBatcher(client Client, channel string) *batcher {
	var cluster bool
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		cluster = true
	}
	return &batcher{client: client, channel: channel, cluster: cluster}
}

// do runs the operation kind on key, in a batch with the operations of
// other callers, and returns its reply.
func (b *batcher) do(kind, key, token, ttl string) (any, error) {
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
		keys := make([]string, len(batch))
		args := make([]any, 0, 1+3*len(batch))
		args = append(args, b.channel)
		for i, o := range batch {
			keys[i] = o.key
			args = append(args, o.kind, o.token, o.ttl)
		}
		v, err := dedupeScript.Run(ctx, b.client, keys, args...).Slice()
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
		close(o.done)
	}

	b.mu.Lock()
	if len(b.queue) > 0 {
		b.queue[0].lead <- struct{}{}
	} else {
		b.busy = false
	}
	b.mu.Unlock()
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
