// Package topk counts the heaviest keys of a stream in bounded memory, over
// a recent window, and merges the lists that several counters report. A
// replica uses it for the keys its layers refused most and its tenants'
// tokens (limiter heartbeats); 'bucket status', 'bucket watch' and the
// console merge the replicas' lists.
//
// The counts are those of the space-saving algorithm (Metwally, Agrawal
// and El Abbadi, 2005): a summary of capacity c keeps at most c keys; a
// new key, when it is full, takes the place of the smallest, with that
// count plus its own. So a key's count may be over by at most the
// smallest count of the summary, and every key counted more than
// total/c is kept.
package topk

import (
	"cmp"
	"slices"
	"sync"
	"time"
	"unicode/utf8"
)

// Entry is a key and its count.
type Entry struct {
	Key   string
	Count int64
}

// MaxKey is the longest key kept, in bytes: a longer one is cut (Clip), so
// that a heartbeat carrying the lists stays small whatever a key template
// renders.
const MaxKey = 96

// Clip returns key cut to at most MaxKey bytes, on a rune boundary, with
// "…" at the end when it was cut.
func Clip(key string) string {
	if len(key) <= MaxKey {
		return key
	}
	n := MaxKey - len("…")
	for n > 0 && !utf8.RuneStart(key[n]) {
		n--
	}
	return key[:n] + "…"
}

// summary is one space-saving summary: at most capacity keys.
type summary struct {
	counts map[string]int64
	total  int64
}

func (s *summary) add(key string, n int64, capacity int) {
	s.total += n
	if _, ok := s.counts[key]; ok || len(s.counts) < capacity {
		if s.counts == nil {
			s.counts = make(map[string]int64, capacity)
		}
		s.counts[key] += n
		return
	}
	minKey, minN := "", int64(-1)
	for k, c := range s.counts {
		if minN < 0 || c < minN || (c == minN && k < minKey) {
			minKey, minN = k, c
		}
	}
	delete(s.counts, minKey)
	s.counts[key] = minN + n
}

// Window counts keys over the last span, in slots: a ring of space-saving
// summaries, each counting one span/slots of time, the oldest dropped as
// time moves on. It is safe for concurrent use.
type Window struct {
	mu       sync.Mutex
	width    time.Duration // of a slot
	capacity int
	slots    []summary
	cur      int       // the slot counting now
	curStart time.Time // when it started; zero before the first Add
}

// NewWindow returns a Window over span (at least one slot width), in slots
// slots, each keeping at most capacity keys.
func NewWindow(span time.Duration, slots, capacity int) *Window {
	slots, capacity = max(1, slots), max(1, capacity)
	return &Window{width: max(time.Nanosecond, span/time.Duration(slots)), capacity: capacity, slots: make([]summary, slots)}
}

// advance moves the ring to the slot that holds now, clearing the slots
// it passes.
func (w *Window) advance(now time.Time) {
	if w.curStart.IsZero() {
		w.curStart = now
		return
	}
	steps := int(now.Sub(w.curStart) / w.width)
	if steps <= 0 {
		return
	}
	if steps >= len(w.slots) {
		clear(w.slots)
	} else {
		for range steps {
			w.cur = (w.cur + 1) % len(w.slots)
			w.slots[w.cur] = summary{}
		}
	}
	w.curStart = w.curStart.Add(time.Duration(steps) * w.width)
}

// Add counts n for key at now (a time no earlier than the last Add's).
func (w *Window) Add(now time.Time, key string, n int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advance(now)
	w.slots[w.cur].add(key, n, w.capacity)
}

// Top returns the k keys with the largest counts over the window as of
// now, largest first (ties by key), and the total counted over the
// window, every key included.
func (w *Window) Top(now time.Time, k int) ([]Entry, int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.curStart.IsZero() {
		return nil, 0
	}
	w.advance(now)
	sums := map[string]int64{}
	var total int64
	for _, s := range w.slots {
		total += s.total
		for key, c := range s.counts {
			sums[key] += c
		}
	}
	return Of(sums, k), total
}

// Of returns the k entries of counts with the largest counts, largest
// first, ties by key; none for k < 1.
func Of[N int | int64](counts map[string]N, k int) []Entry {
	if k < 1 || len(counts) == 0 {
		return nil
	}
	out := make([]Entry, 0, len(counts))
	for key, c := range counts {
		out = append(out, Entry{Key: key, Count: int64(c)})
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return out[:min(k, len(out))]
}

// Merge sums lists of counts by key (the lists several replicas reported)
// and returns the k largest, as Of does.
func Merge[N int | int64](lists []map[string]N, k int) []Entry {
	sums := map[string]int64{}
	for _, l := range lists {
		for key, c := range l {
			sums[key] += int64(c)
		}
	}
	return Of(sums, k)
}
