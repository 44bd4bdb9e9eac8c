package kit

import "sync"

// KeyQueue serializes work by key: at most one worker handles a key at a
// time, in the order the key's items were pushed, while other keys proceed.
// The zero value is ready to use; a KeyQueue must not be copied after
// first use. It is safe for concurrent use.
//
// The protocol: Push an item; when Push returns true, the caller owns the
// key and handles the item, then calls Next for the key until it returns
// false, handling each item it returns. When Push returns false the item
// was queued behind the key's owner, which will get it from Next.
type KeyQueue[T any] struct {
	mu   sync.Mutex
	keys map[string]*keyItems[T]
	n    int // queued items, owners' current items excluded
}

type keyItems[T any] struct {
	items []T
	head  int
}

// Push queues v for key and reports whether the caller became the key's
// owner, in which case v is not queued: the caller handles it.
func (q *KeyQueue[T]) Push(key string, v T) (owner bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.keys == nil {
		q.keys = make(map[string]*keyItems[T])
	}
	k, busy := q.keys[key]
	if !busy {
		q.keys[key] = &keyItems[T]{}
		return true
	}
	k.items = append(k.items, v)
	q.n++
	return false
}

// Next returns the next item queued for key, for its owner. When none is
// left it releases the key and returns false: the next Push of the key
// makes a new owner.
func (q *KeyQueue[T]) Next(key string) (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var zero T
	k := q.keys[key]
	if k == nil || k.head == len(k.items) {
		delete(q.keys, key)
		return zero, false
	}
	v := k.items[k.head]
	k.items[k.head] = zero
	k.head++
	q.n--
	if k.head == len(k.items) {
		k.items, k.head = k.items[:0], 0
	}
	return v, true
}

// Len returns the number of keys that have an owner and the number of
// items queued behind the owners.
func (q *KeyQueue[T]) Len() (keys, queued int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.keys), q.n
}
