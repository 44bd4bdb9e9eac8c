package kafka

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/dispatch"
	"github.com/throttlehq/throttle/consumer/internal/grant"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
)

// partitionReader is what a partition's fetcher needs from a kafka-go
// Reader.
type partitionReader interface {
	FetchMessage(ctx context.Context) (kafkago.Message, error)
}

// generation is one generation of the consumer group, as runGeneration
// needs it.
type generation struct {
	id int32
	// partitions are this member's partitions of the topic and of the
	// delay topic (Options.SetAside), by topic and partition, and the
	// offsets to start from (kafka-go's FirstOffset or LastOffset when the
	// group has no committed offset).
	partitions []assignment
	// commit commits offsets in this generation.
	commit commitFunc
	// skips lists, by partition, the messages the previous owners finished
	// after the committed offset (OrderKey, OrderNone).
	skips map[topicPartition]finishedSet
	// open returns the reader of a partition at offset, and the function
	// that closes it.
	open func(tp topicPartition, offset int64) (partitionReader, func())
	// shutdown is closed when Run's context ends. The generation then
	// drains as at a revocation, while it is still live (its heartbeats
	// go on), and closes drained; the caller then leaves the group, which
	// ends the generation's context.
	shutdown <-chan struct{}
	// drained is closed by runGeneration after its final commit.
	drained chan struct{}
}

// topicPartition names a partition of the topic or of the delay topic.
type topicPartition struct {
	topic     string
	partition int
}

// assignment is a partition that a generation owns and the offset to
// start reading it from.
type assignment struct {
	topicPartition
	offset int64
}

// outcome is how a worker left a message.
type outcome int

const (
	// finished: delivered, dead-lettered or set aside; it may be
	// committed.
	finished outcome = iota
	// dropped: not started when its partition was revoked.
	dropped
	// abandoned: started and not finished by the drain deadline.
	abandoned
)

// genRun is the state of one generation while runGeneration runs it.
type genRun struct {
	c *Consumer
	// hctx is the context of handlers, dead-letter writes and commits: it
	// ends at the drain deadline. rctx ends when the generation ends (the
	// partitions are revoked) or Run's context ends; fetching and the
	// first limiter wait of each message stop then.
	hctx, rctx context.Context
	// slots bounds the messages fetched and not finished, by class
	// (dispatch.Slots): a message of a higher class is read while lower
	// ones fill the window. Each partition takes its slots as the source
	// partState.index, up to partitionShare, and a freed slot goes to the
	// partition holding the fewest: one partition's backlog, or its stuck
	// message, does not fill the window while the handlers of the others
	// find nothing queued.
	slots *dispatch.Slots
	sched *scheduler
	com   *committer
	dl    *deadLetterer
	// delay writes the messages set aside to the delay topic; nil when
	// the consumer does not set aside (the handler waits instead).
	delay *deadLetterer
	// dropped counts the messages fetched and not started when the
	// partitions were revoked; skipped those not handled because the
	// previous owner had finished them; otherGroup the copies of the
	// delay topic skipped because another group set them aside.
	dropped, skipped, otherGroup atomic.Int64
	// marks counts the delivered messages whose dedupe mark is under way
	// (kit.MarksLater): they finish once marked, before the final commit.
	marks sync.WaitGroup
	// claimAhead: the messages' dedupe claims are made as they are
	// fetched (kit.Processor.ClaimAhead), only where every lane's next
	// message always gets a worker (aheadSafe).
	claimAhead bool
}

// aheadSafe reports whether the dedupe claims of fetched messages may be
// made ahead of their turn: only when the next message of every lane
// (a partition, or a key) always gets a worker, so that a claim made
// ahead never waits for a worker that a message waiting for it holds,
// on this replica or, crossed, on another (which would stall both until
// the claim's TTL). That holds with OrderPartition and at least a worker
// per partition owned, or under the other orderings with no queue (every
// message fetched has a worker), and without classes (whose reserve may
// keep a lower class's message from starting).
func aheadSafe(ordering consumer.Ordering, workers, queue, partitions int, classes bool) bool {
	if classes {
		return false
	}
	if ordering == consumer.OrderPartition {
		return workers >= partitions
	}
	return queue == 0
}

// runGeneration consumes the partitions of one generation until it ends
// (gctx) or Run's context ends, then revokes them: it stops fetching,
// drops the messages not started (a cancelled limiter wait gives its
// tokens back), lets the handlers in flight finish within DrainTimeout,
// and commits what finished before it returns, so before the member
// rejoins.
func (c *Consumer) runGeneration(gctx context.Context, g *generation, dl, delay *deadLetterer) {
	defer func() {
		<-gctx.Done() // kafka-go ends the generation when this returns
	}()
	hctx, cancelHandlers := context.WithCancel(context.Background())
	defer cancelHandlers()
	rctx, revoke := context.WithCancel(hctx)
	defer revoke()

	parts := make([]*partState, len(g.partitions))
	var ids, delayIDs []int
	for i, a := range g.partitions {
		parts[i] = newPartState(a.topicPartition)
		parts[i].index = i
		parts[i].skip = g.skips[a.topicPartition]
		if a.topic == c.cfg.DelayTopic && delay != nil {
			parts[i].delay = true
			delayIDs = append(delayIDs, a.partition)
		} else {
			ids = append(ids, a.partition)
		}
	}
	log := c.log.With("topic", c.cfg.Topic, "group", c.cfg.Group, "generation", g.id)
	if delay != nil {
		log.Info("partitions assigned", "partitions", ids, "delay_topic", c.cfg.DelayTopic, "delay_partitions", delayIDs)
	} else {
		log.Info("partitions assigned", "partitions", ids)
	}
	c.stats.setAssigned(len(parts))

	workers, queue := c.cfg.Concurrency, c.cfg.QueueSize
	classes := c.proc.Classes()
	r := &genRun{c: c, hctx: hctx, rctx: rctx, dl: dl, delay: delay,
		slots:      dispatch.NewSlots(dispatch.NewRule(workers+queue, classes), partitionShare(c.cfg.Ordering, workers+queue, len(parts))),
		claimAhead: aheadSafe(c.cfg.Ordering, workers, queue, len(parts), classes)}
	r.com = newCommitter(g.commit, parts, c.cfg.Ordering != consumer.OrderPartition, log)
	r.sched = newScheduler(c.cfg.Ordering, workers, classes, r.newWorker)

	comCtx, stopCommitter := context.WithCancel(hctx)
	defer stopCommitter()
	comDone := make(chan struct{})
	go func() {
		defer close(comDone)
		r.com.run(comCtx)
	}()

	var fetching sync.WaitGroup
	closers := make([]func(), len(parts))
	for i, p := range parts {
		rd, closeReader := g.open(p.topicPartition, g.partitions[i].offset)
		if p.delay {
			rd = r.dueOrder(p, rd) // copies in the order they are due
		}
		closers[i] = closeReader
		fetching.Add(1)
		go func() {
			defer fetching.Done()
			r.fetch(p, rd)
		}()
	}

	reason := "rebalance"
	select {
	case <-gctx.Done():
	case <-g.shutdown:
		reason = "shutdown"
	}
	start := time.Now()
	revoke()
	fetching.Wait()
	var closing sync.WaitGroup
	for _, closeReader := range closers {
		closing.Go(closeReader)
	}
	for _, w := range r.sched.stop() {
		c.proc.DropAhead(w.ahead)
		r.slots.Release(w.class, w.p.index)
		r.dropped.Add(1)
	}

	drained := make(chan struct{})
	go func() {
		r.sched.wait()
		close(drained)
	}()
	drain := c.cfg.DrainTimeout
	if reason == "rebalance" {
		// The group waits RebalanceTimeout for the members to rejoin and
		// then goes on without the late ones, whose commits it refuses:
		// leave time for the final commit.
		drain = min(drain, c.gc.RebalanceTimeout*4/5)
	}
	timer := time.NewTimer(drain)
	select {
	case <-drained:
	case <-timer.C:
		log.Warn(kit.LogDrainTimeout, "drain_timeout", drain.String())
		cancelHandlers()
		<-drained
	}
	timer.Stop()
	r.marks.Wait() // each mark is bounded by its own timeout

	stopCommitter()
	<-comDone
	fctx, cancel := context.WithTimeout(context.Background(), c.cfg.CommitTimeout)
	committed, err := r.com.flush(fctx)
	cancel()
	closing.Wait()
	n := r.dropped.Load()
	c.stats.revoked(n)
	args := []any{"partitions", ids}
	if delay != nil {
		args = append(args, "delay_partitions", delayIDs, "skipped_other_group", r.otherGroup.Load())
	}
	args = append(args, "reason", reason, "dropped", n, "skipped", r.skipped.Load(),
		"committed", formatOffsets(c.cfg.Topic, committed), "took", time.Since(start).Round(time.Millisecond).String())
	if err != nil {
		log.Warn("partitions revoked; the final commit failed, messages finished since the last commit will be redelivered",
			append(args, "err", err)...)
	} else {
		log.Info("partitions revoked", args...)
	}
	close(g.drained)
}

// partitionShare returns the most fetch slots one of n partitions may hold
// in a window of window slots: under OrderPartition, whose partitions run
// one message at a time, its share of the window, and at least 2 (the
// message running and the next one, queued); under the other orderings,
// which run a partition's messages side by side, the whole window.
func partitionShare(o consumer.Ordering, window, n int) int {
	if o != consumer.OrderPartition || n == 0 {
		return 0
	}
	return max(2, (window+n-1)/n)
}

// fetch reads the messages of one partition and queues them until the
// partition is revoked. It blocks while every slot is taken.
func (r *genRun) fetch(p *partState, rd partitionReader) {
	c := r.c
	failures := 0
	for {
		m, err := rd.FetchMessage(r.rctx)
		if err != nil {
			if r.rctx.Err() != nil {
				return
			}
			if isFatal(err) {
				c.fail(fatalError(fmt.Sprintf("fetching from topic %q partition %d", p.topic, p.partition), err))
				return
			}
			delay := backoff.Delay(failures)
			failures++
			c.log.Warn("fetching message failed; retrying",
				"topic", p.topic, "partition", p.partition, "err", err, "retry_in", delay.String())
			if kit.Sleep(r.rctx, delay) != nil {
				return
			}
			continue
		}
		failures = 0
		if p.skip.has(m.Offset) {
			// Finished by the previous owner, after its committed offset.
			r.skipped.Add(1)
			r.finishUnhandled(p, m.Offset)
			continue
		}
		if p.delay && r.skipOtherGroup(p, m) {
			continue
		}
		if p.delay && !r.waitDue(p, m) {
			r.dropped.Add(1)
			return
		}
		w := work{m: m, msg: ToMessage(m), p: p}
		if !p.delay {
			// Only a copy that the group set aside carries slots it paid
			// for: a producer cannot pass a layer with the header.
			delete(w.msg.Headers, setaside.HeaderPaid)
		}
		w.class = dispatch.ClassOf(c.proc.Class(w.msg))
		if r.slots.Acquire(r.rctx, w.class, p.index) != nil {
			r.dropped.Add(1)
			return
		}
		p.mu.Lock()
		w.seq = p.tracker.add(m.Offset)
		p.mu.Unlock()
		if c.cfg.Ordering == consumer.OrderKey {
			w.key, w.keyErr = c.proc.Key(w.msg)
		}
		if w.keyErr == nil && r.claimAhead {
			// In the partition's order, so that a message never waits for
			// a claim made ahead by one queued behind it.
			w.ahead = c.proc.ClaimAhead(w.msg)
		}
		kit.ObserveReceived(c.cfg.Observer, w.msg)
		if !r.sched.enqueue(w) {
			c.proc.DropAhead(w.ahead)
			r.slots.Release(w.class, p.index)
			r.dropped.Add(1)
			return
		}
	}
}

// newWorker returns the function a worker goroutine handles messages
// with, and the function that releases the worker's contexts when it
// ends. Each worker derives contexts of its own from the handlers' and
// the revocation's, which end with them: the contexts a message derives
// (a request's timeout, a limiter wait) then register with their worker's,
// instead of all workers' with one, under its lock.
func (r *genRun) newWorker() (func(work), func()) {
	hctx, cancelHandler := context.WithCancel(r.hctx)
	revoke, cancelRevoke := context.WithCancel(r.rctx)
	gate := &firstWait{revoke: revoke}
	ctx := context.WithValue(hctx, firstWaitKey{}, gate)
	done := func() {
		cancelRevoke()
		cancelHandler()
	}
	return func(w work) {
		if r.rctx.Err() != nil {
			r.c.proc.DropAhead(w.ahead)
			r.slots.Release(w.class, w.p.index)
			r.dropped.Add(1) // revoked before it started
			return
		}
		gate.started, gate.dropped = false, false
		res, marking := r.c.handle(ctx, w, r.dl, r.delay, gate)
		switch {
		case res == finished && marking != nil:
			// Committed once its dedupe mark is written; the worker goes
			// on meanwhile. The callback captures a copy, so that w
			// itself stays on the stack for the messages without a
			// mark.
			marked := w
			r.marks.Add(1)
			marking.Then(func() {
				r.finish(marked)
				r.marks.Done()
			})
		case res == finished:
			r.finish(w)
		case res == dropped:
			r.dropped.Add(1)
		}
		r.slots.Release(w.class, w.p.index)
	}, done
}

// finish marks w finished in its partition's tracker, so that the commit
// moves past it.
func (r *genRun) finish(w work) {
	w.p.mu.Lock()
	moved := w.p.tracker.finish(w.seq)
	w.p.mu.Unlock()
	if moved {
		r.com.wake()
	}
}

// firstWait is a worker's record of the message it handles, which
// revocableLimiter and markStarted find in the context. The first limiter
// wait of a message, before its handler was ever called, ends when the
// partition is revoked: the message is then dropped, not started, and the
// cancelled wait gives back the tokens it reserved. Later waits, before
// the retries of a started message, end only at the drain deadline.
//
// A firstWait belongs to one worker goroutine.
type firstWait struct {
	// revoke ends when the partitions are revoked. It is derived from the
	// handlers' context, so it also ends at the drain deadline.
	revoke context.Context
	// started is set once the handler was called for the message.
	started bool
	// dropped is set when the revocation ended the first wait.
	dropped bool
}

type firstWaitKey struct{}

// revocableLimiter is the limiter the Processor waits on: the configured
// one, with the first wait of a message ended by a revocation (firstWait).
type revocableLimiter struct{ l consumer.Limiter }

func (r revocableLimiter) Wait(ctx context.Context, cost int) error {
	// grant.Wait: for the throttle wait span, a *limiter.Bucket says
	// which layer set the wait.
	return r.wait(ctx, func(ctx context.Context) error { return grant.Wait(ctx, r.l, cost) })
}

// WaitMessage implements consumer.MessageLimiter (limits keyed by the
// message), with the same rule for the first wait, when the configured
// limiter does; else it is Wait.
func (r revocableLimiter) WaitMessage(ctx context.Context, msg consumer.Message, cost int) error {
	ml, ok := r.l.(consumer.MessageLimiter)
	if !ok {
		return r.Wait(ctx, cost)
	}
	return r.wait(ctx, func(ctx context.Context) error { return ml.WaitMessage(ctx, msg, cost) })
}

// AcquireMessage implements consumer.SlotLimiter (concurrency layers),
// with the same rule for the first wait, when the configured limiter
// does; else it is WaitMessage, with a release that does nothing.
func (r revocableLimiter) AcquireMessage(ctx context.Context, msg consumer.Message, cost int) (func(), error) {
	sl, ok := r.l.(consumer.SlotLimiter)
	if !ok {
		return func() {}, r.WaitMessage(ctx, msg, cost)
	}
	release := func() {}
	err := r.wait(ctx, func(ctx context.Context) error {
		rel, err := sl.AcquireMessage(ctx, msg, cost)
		if rel != nil {
			release = rel
		}
		return err
	})
	return release, err
}

// wait runs wait on ctx, or, for the first wait of a message, on the
// revocation's context.
func (r revocableLimiter) wait(ctx context.Context, wait func(context.Context) error) error {
	f, _ := ctx.Value(firstWaitKey{}).(*firstWait)
	if f == nil || f.started {
		return wait(ctx)
	}
	rctx := f.revoke
	if trace.SpanFromContext(ctx).IsRecording() {
		// The throttle wait span asks the limiter, through ctx's values,
		// which layer set the wait.
		rctx = withValues{Context: f.revoke, values: ctx}
	}
	err := wait(rctx)
	if err != nil && f.revoke.Err() != nil && ctx.Err() == nil {
		f.dropped = true
		return fmt.Errorf("partition revoked before the message started: %w", consumer.ErrAbandoned)
	}
	return err
}

// withValues is a context with the deadline and cancellation of its
// Context and the values of values.
type withValues struct {
	context.Context
	values context.Context
}

func (c withValues) Value(key any) any { return c.values.Value(key) }

// markStarted wraps the user's handler to record, in the worker's
// firstWait, that the message started.
func markStarted(h consumer.Handler) consumer.Handler {
	return func(ctx context.Context, msg consumer.Message) error {
		if f, ok := ctx.Value(firstWaitKey{}).(*firstWait); ok {
			f.started = true
		}
		return h(ctx, msg)
	}
}

// finishUnhandled marks offset of p finished without handling it, so that
// the commit moves past it.
func (r *genRun) finishUnhandled(p *partState, offset int64) {
	p.mu.Lock()
	p.tracker.finish(p.tracker.add(offset))
	p.mu.Unlock()
	r.com.wake()
}

// handle runs the retry policy for w, then dead-letters it or sets it
// aside (delay) when needed. A message set aside while delay is nil (the
// consumer sets aside but has no delay topic) waits out the delay here and
// is handled again. A delivered message whose dedupe mark is under way
// comes with its kit.Marking: it is committed once marked.
func (c *Consumer) handle(ctx context.Context, w work, dl, delay *deadLetterer, gate *firstWait) (outcome, *kit.Marking) {
	m := w.m
	ctx, span := c.proc.StartSpan(ctx, w.msg)
	defer span.End()
	out := c.proc.KeyFailed(w.keyErr)
	if w.keyErr == nil {
		msg := w.msg
		out = c.proc.ProcessAhead(ctx, msg, w.ahead)
		for out.SetAside > 0 && delay == nil {
			// Before its handler ran, a message waits as for its first
			// limiter wait: the revocation ends the wait (see firstWait).
			wctx := ctx
			if !gate.started {
				wctx = gate.revoke
			}
			if kit.Sleep(wctx, out.SetAside) != nil {
				if ctx.Err() == nil && !gate.started {
					return dropped, nil
				}
				out.Abandoned, out.SetAside = true, 0
				break
			}
			msg = out.Returned(msg) // with the headers it would have been set aside with
			out = c.proc.Process(ctx, msg)
		}
	}
	if out.Abandoned {
		if gate.dropped {
			return dropped, nil
		}
		c.log.Warn(kit.LogAbandoned, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
			"attempts", out.Attempts, "err", out.Err)
		return abandoned, nil
	}
	if out.SetAside > 0 {
		return c.setAside(ctx, w, out, delay), nil
	}
	if out.Err == nil {
		return finished, out.Marking
	}
	if err := dl.send(ctx, m, out.DeadLetterHeaders(c.origin(m))); err != nil {
		c.log.Warn(kit.LogWriteAbandoned, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
			kit.KeyDestination, dl.topic, "err", err)
		kit.SpanAbandoned(ctx, out.Attempts)
		return abandoned, nil
	}
	c.proc.DeadLettered(ctx, w.msg, out, positionAttrs(m, dl.topic)...)
	return finished, nil
}
