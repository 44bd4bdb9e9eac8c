package rabbitmq

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultAckDelay is the default of Config.AckDelay.
const DefaultAckDelay = time.Millisecond

// maxAckDelay bounds Config.AckDelay: a settled delivery waiting for its
// ack holds a place of the prefetch.
const maxAckDelay = time.Second

// maxAckGone bounds the deliveries an ackBatcher remembers as settled on
// their own above its lowest unsettled one (a delivery held for long by
// its handler); past it the batcher stops batching (off).
const maxAckGone = 1 << 16

// acknowledger is the part of an amqp.Channel an ackBatcher uses.
type acknowledger interface {
	Ack(tag uint64, multiple bool) error
}

// ackBatcher acks the settled deliveries of one channel together: an ack
// waits up to about delay, so that the acks of the deliveries settled
// meanwhile go out as one frame, an Ack with multiple set up to the
// highest of them, where every lower delivery tag is settled; a delivery
// settled above one still being handled is acked on its own after one to
// two delays. A delivery is acked only once it is settled, as without
// batching, and never twice: the broker closes the channel on an unknown
// tag.
//
// Delivery tags on a channel count every delivery from 1, so the batcher
// knows a tag is settled only when told: add for an ack to send, gone for
// a delivery settled by a call of its own (a nack, a requeue). A tag
// never told keeps the tags above it out of the multiple acks (they go
// out on their own), and past maxAckGone such tags the batcher acks
// every delivery on its own at once.
//
// An ack waits only while it keeps no delivery from a free handler: when
// the deliveries read from the channel and not settled on the broker fill
// its prefetch window (the broker sends no more until an ack) and no
// delivery waits for a handler (handlersFree), add sends every ack
// waiting at once, on the caller's goroutine. A consumer held back by a
// slow sink, whose prefetch is all in its handlers, thus acks each
// delivery as it settles, as a loop without batching does; one whose
// deliveries queue for its handlers, or that has more on the way, batches.
//
// Its methods are safe for concurrent use; run sends the batched acks,
// on one goroutine, until stop; flushes, wherever they run, go out one
// at a time.
type ackBatcher struct {
	ch    acknowledger
	delay time.Duration
	log   *slog.Logger
	// window is the channel's prefetch count (0: none known, an ack
	// always waits), and handlersFree reports whether no delivery waits
	// for a handler (nil: none ever does); both are set before the
	// batcher is used.
	window       uint64
	handlersFree func() bool
	// read is the highest delivery tag read from the channel (readTag).
	read atomic.Uint64
	// sendMu makes the flushes one at a time: a multiple ack must not
	// overtake the singles below its tag.
	sendMu sync.Mutex

	mu sync.Mutex
	// base is the lowest tag not known to be settled: every lower tag
	// is acked, nacked, or in the next multiple ack.
	base uint64
	// waiting holds the tags to ack, with the flush round they came in.
	waiting map[uint64]uint32
	// gone holds the tags at or above base settled on the broker already.
	gone    map[uint64]struct{}
	round   uint32
	off     bool // batching stopped: every ack goes out at once
	stopped bool
	singles []uint64 // flush's buffer, used by run only

	wake chan struct{} // an ack waits; capacity 1
	quit chan struct{} // closed by stop
	done chan struct{} // closed when run returned
}

// newAckBatcher returns the batcher of ch's acks, or nil when delay is
// negative (each delivery acked on its own at once).
func newAckBatcher(ch acknowledger, delay time.Duration, log *slog.Logger) *ackBatcher {
	if delay < 0 {
		return nil
	}
	return &ackBatcher{ch: ch, delay: delay, log: log, base: 1,
		waiting: make(map[uint64]uint32), gone: make(map[uint64]struct{}),
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
}

// add queues the ack of tag. It reports false when the batcher takes no
// more (stopped, or off): the caller acks on its own.
func (b *ackBatcher) add(tag uint64) bool {
	b.mu.Lock()
	if b.stopped || b.off {
		b.mu.Unlock()
		return false
	}
	b.waiting[tag] = b.round
	first := len(b.waiting) == 1
	starved := b.starvedLocked()
	b.mu.Unlock()
	if starved && (b.handlersFree == nil || b.handlersFree()) {
		b.flush(true)
		return true
	}
	if first {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// readTag records that the delivery of tag was read from the channel.
// Tags are read in order, by one goroutine.
func (b *ackBatcher) readTag(tag uint64) { b.read.Store(tag) }

// starvedLocked reports whether the deliveries read and not settled on
// the broker fill the prefetch window: every lower tag than base is
// settled, and so is each tag in gone. b.mu must be held.
func (b *ackBatcher) starvedLocked() bool {
	settled := b.base - 1 + uint64(len(b.gone))
	return b.window > 0 && b.read.Load() >= settled+b.window
}

// settled records that tag was settled on the broker by a call of its
// own, a nack or an ack without the batcher.
func (b *ackBatcher) settled(tag uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.off || tag < b.base {
		return
	}
	b.gone[tag] = struct{}{}
	if len(b.gone) > maxAckGone {
		b.off = true
		b.gone = nil
		b.log.Debug("acks no longer batched on this channel: a delivery stays unsettled for long", "lowest_unsettled_tag", b.base)
	}
}

// run sends the acks added, a delay after the first one waiting, until
// stop, when it sends those left.
func (b *ackBatcher) run() {
	defer close(b.done)
	timer := time.NewTimer(b.delay)
	timer.Stop()
	for {
		select {
		case <-b.wake:
		case <-b.quit:
			b.flush(true)
			return
		}
		for more := true; more; {
			timer.Reset(b.delay)
			select {
			case <-timer.C:
			case <-b.quit:
				timer.Stop()
				b.flush(true)
				return
			}
			more = b.flush(false)
		}
	}
}

// stop sends the acks left and ends run; later adds report false. It
// returns once run returned.
func (b *ackBatcher) stop() {
	b.mu.Lock()
	already := b.stopped
	b.stopped = true
	b.mu.Unlock()
	if !already {
		close(b.quit)
	}
	<-b.done
}

// flush acks the tags waiting: those from base up as one multiple ack,
// and the others that waited since the round before (all of them when
// all: at stop, and when an ack holds back a free handler) on their
// own. It reports whether any are left waiting.
func (b *ackBatcher) flush(all bool) (more bool) {
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	b.mu.Lock()
	b.round++
	var last uint64
	top := b.base
	for {
		if _, ok := b.waiting[top]; ok {
			delete(b.waiting, top)
			last = top
		} else if _, ok := b.gone[top]; ok {
			delete(b.gone, top)
		} else {
			break
		}
		top++
	}
	b.base = top
	singles := b.singles[:0]
	for tag, round := range b.waiting {
		if all || b.off || round+1 < b.round {
			singles = append(singles, tag)
			delete(b.waiting, tag)
			if !b.off {
				b.gone[tag] = struct{}{}
			}
		}
	}
	more = len(b.waiting) > 0
	b.mu.Unlock()
	// sendMu is held: a later multiple ack covers these singles only
	// once they went out.
	if last != 0 {
		if err := b.ch.Ack(last, true); err != nil {
			b.log.Warn("ack failed; the broker will redeliver the messages", "up_to_delivery_tag", last, "err", err.Error())
		}
	}
	// On a closed channel every ack fails: one line for the flush.
	failed, firstTag, firstErr := 0, uint64(0), error(nil)
	for _, tag := range singles {
		if err := b.ch.Ack(tag, false); err != nil {
			if failed++; failed == 1 {
				firstTag, firstErr = tag, err
			}
		}
	}
	if failed > 0 {
		b.log.Warn("ack failed; the broker will redeliver the messages", "delivery_tag", firstTag, "failed", failed, "err", firstErr.Error())
	}
	b.singles = singles
	return more
}
