package redisdedupe

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxBatch is the most script calls sent in one pipeline.
const maxBatch = 128

// call is one script call waiting in a batcher.
type call struct {
	script *redis.Script
	keys   []string
	args   []any
	res    any
	err    error
	done   chan struct{} // closed when res and err are set
	lead   chan struct{} // receives when this call's caller is to send the next batch
}

// batcher sends the script calls of concurrent callers together: while
// one pipeline is in flight, the calls that arrive queue, and the caller
// of the first of them sends them all (up to maxBatch) as the next
// pipeline when it returns. A lone call goes out at once. Each script is
// still atomic on its own. It is safe for concurrent use and has no
// goroutine of its own.
type batcher struct {
	client Client

	mu    sync.Mutex
	queue []*call
	busy  bool // a caller is sending a batch
}

// do runs script with keys and args, in a batch with the calls of other
// callers, and returns its reply.
func (b *batcher) do(script *redis.Script, keys []string, args ...any) (any, error) {
	c := &call{script: script, keys: keys, args: args, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	lead := !b.busy
	b.busy = true
	b.mu.Unlock()
	if lead {
		b.send()
	}
	for {
		select {
		case <-c.done:
			return c.res, c.err
		case <-c.lead:
			b.send()
		}
	}
}

// send sends the queued calls, up to maxBatch, as one pipeline, then
// hands the lead to the first call still queued.
func (b *batcher) send() {
	b.mu.Lock()
	n := min(len(b.queue), maxBatch)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	b.mu.Unlock()

	ctx := context.Background() // the client's timeouts bound it
	if len(batch) == 1 {
		c := batch[0]
		c.res, c.err = c.script.Run(ctx, b.client, c.keys, c.args...).Result()
	} else {
		pipe := b.client.Pipeline()
		cmds := make([]*redis.Cmd, len(batch))
		for i, c := range batch {
			cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx)
		for i, c := range batch {
			c.res, c.err = cmds[i].Result()
			if c.err != nil && strings.HasPrefix(c.err.Error(), "NOSCRIPT") {
				c.res, c.err = c.script.Run(ctx, b.client, c.keys, c.args...).Result()
			}
		}
	}
	for _, c := range batch {
		close(c.done)
	}

	b.mu.Lock()
	if len(b.queue) > 0 {
		b.queue[0].lead <- struct{}{}
	} else {
		b.busy = false
	}
	b.mu.Unlock()
}
