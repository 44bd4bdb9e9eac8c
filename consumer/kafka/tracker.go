package kafka

import (
	"encoding/base64"
	"math/bits"
	"strings"
)

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
// offset added before, and returns its sequence number for finish. For an
// offset added before and not yet behind the commit position, it returns
// the sequence number it gave then: the delay topic's reader adds its
// copies as it reads them, ahead, and hands each on when due (dueReader).
func (t *offsetTracker) add(off int64) uint64 {
	if t.fetched && off < t.next {
		if seq, ok := t.seqOf(off); ok {
			return seq
		}
	}
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

// seqOf returns the sequence number of off, among the messages at or
// after the commit position, by binary search: their offsets increase
// with their sequence numbers.
func (t *offsetTracker) seqOf(off int64) (uint64, bool) {
	mask := uint64(len(t.offs) - 1)
	lo, hi := t.head, t.tail
	for lo < hi {
		mid := lo + (hi-lo)/2
		if t.offs[mid&mask] < off {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < t.tail && t.offs[lo&mask] == off {
		return lo, true
	}
	return 0, false
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

// finishedPrefix marks the commit metadata that lists the messages that
// finished after the committed offset (OrderKey, OrderNone), so that the
// partition's next owner skips them instead of handling them again.
const finishedPrefix = "throttle-finished:v1:"

// maxFinishedSpan bounds the offsets after the commit position that the
// metadata can list (one bit each): 8192 bits are 1,366 characters in
// base64, well below the brokers' default limit of 4096
// (offset.metadata.max.bytes). Finished messages beyond it are handled
// again by the next owner.
const maxFinishedSpan = 8192

// finishedMetadata returns the commit metadata listing the messages that
// finished at or after pos, the commit position: a bitset over the offsets
// pos, pos+1, ..., in base64 after finishedPrefix. It returns "" when none
// did.
func (t *offsetTracker) finishedMetadata(pos int64) string {
	var bits []byte
	mask := uint64(len(t.offs) - 1)
	for seq := t.head; seq != t.tail; seq++ {
		s := seq & mask
		if t.done[s/64]&(1<<(s%64)) == 0 {
			continue
		}
		i := t.offs[s] - pos
		if i < 0 || i >= maxFinishedSpan {
			continue
		}
		for int64(len(bits)) <= i/8 {
			bits = append(bits, 0)
		}
		bits[i/8] |= 1 << (i % 8)
	}
	if len(bits) == 0 {
		return ""
	}
	return finishedPrefix + base64.RawStdEncoding.EncodeToString(bits)
}

// finishedSet is the set of offsets a previous owner finished after the
// committed offset, read from the commit metadata. The zero value is the
// empty set.
type finishedSet struct {
	base int64
	bits []byte
}

// parseFinished reads the metadata committed with offset base. Metadata
// that another client wrote, or that does not parse, gives the empty set:
// those messages are then handled again, which is safe.
func parseFinished(base int64, metadata string) finishedSet {
	rest, ok := strings.CutPrefix(metadata, finishedPrefix)
	if !ok {
		return finishedSet{}
	}
	bits, err := base64.RawStdEncoding.DecodeString(rest)
	if err != nil || len(bits) > maxFinishedSpan/8 {
		return finishedSet{}
	}
	return finishedSet{base: base, bits: bits}
}

// has reports whether off is in the set.
func (f finishedSet) has(off int64) bool {
	i := off - f.base
	if i < 0 || i/8 >= int64(len(f.bits)) {
		return false
	}
	return f.bits[i/8]&(1<<(i%8)) != 0
}

// len returns the number of offsets in the set.
func (f finishedSet) len() int {
	n := 0
	for _, b := range f.bits {
		n += bits.OnesCount8(b)
	}
	return n
}
