package redislimiter

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// maxBatch bounds the Takes sent in one pipeline, so that a flight's
// request and replies stay small. Callers beyond it go in the next batch.
const maxBatch = 128

// refundTimeout bounds the refund of tokens granted to callers that gave up
// while their batch was in flight.
const refundTimeout = time.Second

// batcher combines the concurrent Takes of one Store into pipelines, with
// no timer: at most one batch is in flight at a time. A Take that finds
// none in flight is sent at once, alone, on its caller's context. A Take
// that arrives while one is in flight joins the queue. When a flight
// returns, its sender hands the lead to the head of the queue, which sends
// everything queued (up to maxBatch) as one pipeline and, on return, hands
// the lead on in turn. No caller sends more than the one batch it is in, so
// none is held up serving the others' load.
//
// A batcher is safe for concurrent use.
type batcher struct {
	s *Store

	mu sync.Mutex
	// flushing is true while a batch is in flight or the head of the queue
	// has been told to send the next one. When it is false the queue is
	// empty.
	flushing bool
	queue    []*pending

	// batch and cmds are the leader's buffers. Only one caller leads at a
	// time, and the lead passes on under mu.
	batch []*pending
	cmds  []*redis.Cmd
}

// pendingState is where a queued Take is. It changes only under
// batcher.mu.
type pendingState uint8

const (
	queued  pendingState = iota // in the queue, not sent
	leading                     // head of the queue, told to send the next batch
	sent                        // in the batch in flight
	done                        // res and err are set
)

// pending is one queued Take. Its caller owns it, except that once the
// caller gives up on a sent Take the leader of its batch does, and recycles
// it.
type pending struct {
	req       backend.TakeRequest
	res       backend.TakeResult
	err       error
	state     pendingState
	abandoned bool // the caller's ctx ended while the Take was in flight
	// ready is signalled once, when state becomes leading or done. It has
	// room for that one signal, so that the signaller never blocks.
	ready chan struct{}
}

var pendingPool = sync.Pool{New: func() any { return &pending{ready: make(chan struct{}, 1)} }}

// release recycles p. Its ready channel must be empty.
func (p *pending) release() {
	*p = pending{ready: p.ready}
	pendingPool.Put(p)
}

// take is Store.Take with batching. req.Cost is valid.
func (b *batcher) take(ctx context.Context, req backend.TakeRequest) (backend.TakeResult, error) {
	b.mu.Lock()
	if !b.flushing {
		// Nothing in flight: send at once, alone, exactly as without
		// batching.
		b.flushing = true
		b.mu.Unlock()
		res, err := b.s.take(ctx, 0, req)
		b.mu.Lock()
		b.handOffLocked()
		b.mu.Unlock()
		return res, err
	}
	p := pendingPool.Get().(*pending)
	p.req = req
	b.queue = append(b.queue, p)
	b.mu.Unlock()

	select {
	case <-p.ready:
	case <-ctx.Done():
		return b.abandon(ctx, p)
	}
	if p.state == leading {
		return b.lead(ctx, p)
	}
	res, err := p.res, p.err
	p.release()
	return res, err
}

// abandon handles a caller whose ctx ended while it waited for p.
func (b *batcher) abandon(ctx context.Context, p *pending) (backend.TakeResult, error) {
	b.mu.Lock()
	switch p.state {
	case sent:
		// The leader refunds what the batch grants and recycles p.
		p.abandoned = true
		b.mu.Unlock()
		return backend.TakeResult{}, ctx.Err()
	case done:
		// The answer came as ctx ended: report it, as a call that
		// returned would.
		b.mu.Unlock()
		<-p.ready
		res, err := p.res, p.err
		p.release()
		return res, err
	case leading:
		b.removeLocked(p)
		b.handOffLocked()
		b.mu.Unlock()
		<-p.ready
	default: // queued
		b.removeLocked(p)
		b.mu.Unlock()
	}
	p.release()
	return backend.TakeResult{}, ctx.Err()
}

// lead sends the next batch, which starts with p, the head of the queue,
// hands the answers out and passes the lead on.
func (b *batcher) lead(ctx context.Context, p *pending) (backend.TakeResult, error) {
	b.mu.Lock()
	if err := ctx.Err(); err != nil {
		b.removeLocked(p)
		b.handOffLocked()
		b.mu.Unlock()
		p.release()
		return backend.TakeResult{}, err
	}
	n := min(len(b.queue), maxBatch)
	batch := append(b.batch[:0], b.queue[:n]...)
	m := copy(b.queue, b.queue[n:])
	clear(b.queue[m:])
	b.queue = b.queue[:m]
	for _, q := range batch {
		q.state = sent
	}
	b.mu.Unlock()

	if n == 1 {
		p.res, p.err = b.s.take(ctx, 0, p.req)
	} else {
		// The batch carries other callers' Takes: the leader giving up
		// must not fail them. The client's timeouts bound the flight.
		b.send(context.WithoutCancel(ctx), batch)
	}

	var refund [limiter.NumPriorities]int // by the class whose queue holds them
	b.mu.Lock()
	for _, q := range batch {
		switch {
		case q == p:
		case q.abandoned:
			if q.err == nil && q.res.Granted {
				refund[q.res.Class] += q.res.Tokens
			}
			q.release()
		default:
			q.state = done
			q.ready <- struct{}{}
		}
	}
	clear(batch)
	b.batch = batch[:0]
	b.handOffLocked()
	b.mu.Unlock()

	for class, n := range refund {
		if n == 0 {
			continue
		}
		// Best effort, like the Bucket's refund of a cancelled
		// reservation: if it fails the tokens stay taken until the bucket
		// refills.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
		_ = b.s.RefundClass(rctx, n, limiter.Priority(class))
		cancel()
	}
	res, err := p.res, p.err
	p.release()
	return res, err
}

// send runs the take script for every pending Take of batch in one
// pipeline and sets their answers. Takes that hit NOSCRIPT (Redis lost its
// script cache) did not run; they are sent again with EVAL, which also
// loads the script for the next EVALSHA.
func (b *batcher) send(ctx context.Context, batch []*pending) {
	s := b.s
	pipe := s.client.Pipeline()
	cmds := b.cmds[:0]
	for _, q := range batch {
		cmd := takeEvalSha(ctx, s, q.req, 0)
		_ = pipe.Process(ctx, cmd) // only queues it
		cmds = append(cmds, cmd)
	}
	_, err := pipe.Exec(ctx)
	if err != nil {
		retry := false
		for i, c := range cmds {
			if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				cmds[i] = takeScript.Eval(ctx, pipe, s.stateKeys, s.takeArgs(batch[i].req, 0)...)
				retry = true
			}
		}
		if retry {
			_, err = pipe.Exec(ctx)
		}
	}
	for i, q := range batch {
		if err != nil && cmds[i].Err() == nil && cmds[i].Val() == nil {
			// Never answered: a hook failed the pipeline without setting
			// each command's error.
			cmds[i].SetErr(err)
		}
		q.res, q.err = s.takeResult(q.req, cmds[i])
	}
	clear(cmds)
	b.cmds = cmds[:0]
}

// takeEvalSha returns the EVALSHA of takeScript for req at nowUS (0: Redis
// TIME), as takeScript.EvalSha would build it but with one allocation for
// the arguments instead of five.
func takeEvalSha(ctx context.Context, s *Store, req backend.TakeRequest, nowUS int64) *redis.Cmd {
	args := make([]any, 0, len(s.takeHead)+takeArgc)
	args = append(args, s.takeHead...)
	args = s.appendTakeArgs(args, req, nowUS)
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// removeLocked takes p out of the queue.
func (b *batcher) removeLocked(p *pending) {
	for i, q := range b.queue {
		if q == p {
			copy(b.queue[i:], b.queue[i+1:])
			b.queue[len(b.queue)-1] = nil
			b.queue = b.queue[:len(b.queue)-1]
			return
		}
	}
}

// handOffLocked passes the lead to the head of the queue, or ends the
// flush if nobody is waiting.
func (b *batcher) handOffLocked() {
	if len(b.queue) == 0 {
		b.flushing = false
		return
	}
	q := b.queue[0]
	q.state = leading
	q.ready <- struct{}{}
}
