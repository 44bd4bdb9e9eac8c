package kafka

// offsetTracker follows the messages of one partition that were fetched and
// have not finished, and gives the offset a commit may name: the end of the
// longest prefix of finished messages (the design of Confluent's Parallel
// Consumer). Messages may finish in any order; the commit position only
// moves past a message once it and every message fetched before it
// finished, so a crash never skips an unfinished message.
//
// Offsets are added in fetch order, which is increasing offset order; gaps
// between them (compacted records, transaction markers) are fine, since a
// commit names the next offset to read, not a count.
//
// The window is a ring of offsets and a bitset of finished slots. It grows
// by doubling when more messages are unfinished than it holds, and never
// shrinks, so once it fits the partition's in-flight bound, add and finish
// allocate nothing.
//
// An offsetTracker is not safe for concurrent use; its partition's mutex
// guards it.
type offsetTracker struct {
	offs []int64  // ring of offsets by sequence number; len is a power of two
	done []uint64 // bitset over the slots of offs
	head uint64   // sequence number of the oldest unfinished message
	tail uint64   // sequence number the next added message gets
	next int64    // offset after the last added message; valid when fetched
	// first is the offset of the first added message; valid when fetched.
	first int64
	// fetched reports whether any message was added.
	fetched bool
}

// minTrackerWindow is the initial size of a tracker's ring.
const minTrackerWindow = 64

func newOffsetTracker() *offsetTracker {
	return &offsetTracker{
		offs: make([]int64, minTrackerWindow),
		done: make([]uint64, minTrackerWindow/64),
	}
}

// add records a fetched message at offset off, which must be above every
// offset added before, and returns its sequence number for finish.
func (t *offsetTracker) add(off int64) uint64 {
	if t.tail-t.head == uint64(len(t.offs)) {
		t.grow()
	}
	seq := t.tail
	slot := seq & uint64(len(t.offs)-1)
	t.offs[slot] = off
	t.done[slot/64] &^= 1 << (slot % 64)
	t.tail++
	t.next = off + 1
	if !t.fetched {
		t.first, t.fetched = off, true
	}
	return seq
}

// grow doubles the ring, keeping every unfinished entry at its sequence
// number's slot.
func (t *offsetTracker) grow() {
	n := 2 * len(t.offs)
	offs := make([]int64, n)
	done := make([]uint64, n/64)
	oldMask, newMask := uint64(len(t.offs)-1), uint64(n-1)
	for seq := t.head; seq != t.tail; seq++ {
		o, s := seq&oldMask, seq&newMask
		offs[s] = t.offs[o]
		if t.done[o/64]&(1<<(o%64)) != 0 {
			done[s/64] |= 1 << (s % 64)
		}
	}
	t.offs, t.done = offs, done
}

// finish records that the message with sequence number seq finished
// (delivered or dead-lettered) and reports whether the commit position
// moved. Finishing a message twice, or one already behind the position,
// changes nothing.
func (t *offsetTracker) finish(seq uint64) bool {
	if seq < t.head || seq >= t.tail {
		return false
	}
	mask := uint64(len(t.offs) - 1)
	slot := seq & mask
	t.done[slot/64] |= 1 << (slot % 64)
	if seq != t.head {
		return false
	}
	for t.head != t.tail {
		s := t.head & mask
		if t.done[s/64]&(1<<(s%64)) == 0 {
			break
		}
		t.head++
	}
	return true
}

// position returns the offset to commit: the offset of the oldest
// unfinished message, or the offset after the last fetched one when all
// finished. ok is false until the first fetched message finished: there is
// nothing to commit before.
func (t *offsetTracker) position() (off int64, ok bool) {
	if !t.fetched {
		return 0, false
	}
	off = t.next
	if t.head != t.tail {
		off = t.offs[t.head&uint64(len(t.offs)-1)]
	}
	return off, off != t.first
}

// window returns the number of fetched messages at or after the commit
// position: the unfinished ones and those that finished out of order after
// an unfinished one.
func (t *offsetTracker) window() int { return int(t.tail - t.head) }
