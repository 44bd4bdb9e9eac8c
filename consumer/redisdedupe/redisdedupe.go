// Package redisdedupe is the consumer.DedupeStore of every replica of a
// fleet: the claims and marks of consumer.Options.Dedupe in Redis, one key
// per message key, expiring, and a Pub/Sub channel that wakes the
// replicas waiting for a claim.
//
// # Keys
//
// A message key KEY of the namespace NAMESPACE is the string
// PREFIX dedupe:NAMESPACE:{KEY} (no space between PREFIX and dedupe), in
// the Cluster slot of its own hash tag, so that the keys spread over the
// masters. Its value is "c" or "w" and the claiming token while claimed
// (w: a replica waits for it), with the claim's TTL; "s" once sent, for
// the window. Every key expires: the memory is the keys sent within one
// window (docs/dedupe.md gives the bytes per key as measured).
//
// # Calls
//
// Each Claim, MarkSent and Release is one operation of one script
// (lua/dedupe.lua, EVALSHA, falling back to EVAL), with the TTLs on
// Redis's clock. The operations of concurrent callers go out together:
// while one call is in flight, those that arrive queue and are sent as
// the next one (up to 128 operations), one script call on a single node
// (decided in turn, atomically), or on a Cluster, whose keys are in many
// slots, a pipeline of one call per operation; so that a busy replica
// makes far fewer calls than messages. A lone operation is sent at once.
// ClaimLater, MarkSentLater and ReleaseLater queue an operation without
// waiting for it: it goes out within a couple of milliseconds with the
// others (at once when 128 are queued, on Flush, or with the next call of
// Claim, MarkSent or Release), and a function gets its answer; the Kafka
// consumer claims its messages ahead with them as it fetches them, and
// queues its marks. A Claim that
// finds another token's claim marks it waited for and waits for the mark
// or release, which publishes the key on PREFIX dedupe:NAMESPACE, or for
// the claim's remaining TTL, whichever comes first, then claims again. The
// Store opens its one Pub/Sub connection at its first wait; go-redis
// resubscribes after a failure, and the waiters claim again then, since a
// notification may have been lost.
package redisdedupe

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/consumer"
)

// DefaultPrefix is the default of Config.Prefix, the limiter's own.
const DefaultPrefix = "throttle:"

// Config configures a Store.
type Config struct {
	// Prefix starts every key and the channel. Default DefaultPrefix.
	Prefix string
	// Namespace separates the keys of independent fleets sharing a
	// Redis: a message key is deduped within its namespace. Required;
	// the binary uses the bucket's name (limit.bucket).
	Namespace string
}

// Client is what a Store needs of a go-redis client: a single node,
// Sentinel or Cluster client (redis.UniversalClient) satisfies it.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var (
	//go:embed lua/dedupe.lua
	dedupeLua string

	dedupeScript = redis.NewScript(dedupeLua)
	dedupeSHA    = dedupeScript.Hash()
)

// Store is a consumer.DedupeStore in Redis. It is safe for concurrent
// use. Close stops its Pub/Sub connection.
type Store struct {
	client  Client
	batch   *batcher
	prefix  string // of the keys: PREFIX dedupe:NAMESPACE:
	channel string

	mu      sync.Mutex
	ps      *redis.PubSub // nil until the first wait
	ready   chan struct{} // closed at the first subscription
	done    chan struct{} // closed when the reader returned
	closed  bool
	waiters map[string]map[chan struct{}]struct{}
	msArgs  map[time.Duration]any
}

// New returns a Store of cfg on client.
func New(client Client, cfg Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redisdedupe: the client is nil", consumer.ErrInvalidConfig)
	}
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("%w: %w", consumer.ErrInvalidConfig, &consumer.FieldError{Field: "Namespace", Err: errors.New("is required")})
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	base := cfg.Prefix + "dedupe:" + cfg.Namespace
	return &Store{client: client, batch: newBatcher(client, base), prefix: base + ":", channel: base,
		waiters: map[string]map[chan struct{}]struct{}{}, msArgs: map[time.Duration]any{}}, nil
}

// Key returns the Redis key of the message key key.
func (s *Store) Key(key string) string { return s.prefix + "{" + key + "}" }

// Channel returns the Pub/Sub channel of the marks and releases that a
// Claim waits for.
func (s *Store) Channel() string { return s.channel }

// claimOnce runs the claim script: the state, or 0 and the held claim's
// remaining TTL.
func (s *Store) claimOnce(ctx context.Context, rkey, token string, ttl time.Duration) (consumer.DedupeState, time.Duration, error) {
	v, err := s.batch.do(kindClaim, rkey, token, s.msArg(ttl))
	return claimReply(v, err)
}

// claimReply reads the reply of a claim: the state, or 0 and the held
// claim's remaining TTL.
func claimReply(v any, err error) (consumer.DedupeState, time.Duration, error) {
	if err != nil {
		return 0, 0, fmt.Errorf("redisdedupe: claim: %w", err)
	}
	if v, ok := v.(int64); ok {
		switch {
		case v == 0:
			return consumer.DedupeClaimed, 0, nil
		case v == 1:
			return consumer.DedupeSent, 0, nil
		case v >= 2:
			// 4 + the remaining TTL; below 4, PTTL's -1 (no TTL, written
			// by something else) or -2 (gone meanwhile): ask again soon.
			return 0, max(time.Duration(v-4)*time.Millisecond, time.Millisecond), nil
		}
	}
	return 0, 0, fmt.Errorf("redisdedupe: claim: unexpected reply %v", v)
}

// Claim implements consumer.DedupeStore: one script call, and, while
// another token holds the key, a wait for its mark or release (Pub/Sub)
// or its TTL, then one more call.
func (s *Store) Claim(ctx context.Context, key, token string, ttl time.Duration) (consumer.DedupeState, error) {
	rkey := s.Key(key)
	st, wait, err := s.claimOnce(ctx, rkey, token, ttl)
	if err != nil || st != 0 {
		return st, err
	}
	ch, err := s.watch(ctx, rkey)
	if err != nil {
		return 0, err
	}
	defer s.unwatch(rkey, ch)
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		// Claim again now that a mark or release wakes ch: one made
		// between the first claim and the subscription is not missed.
		if st, wait, err = s.claimOnce(ctx, rkey, token, ttl); err != nil || st != 0 {
			return st, err
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-ch:
		case <-t.C:
		}
	}
}

// MarkSent implements consumer.DedupeStore.
func (s *Store) MarkSent(ctx context.Context, key, _ string, window time.Duration) error {
	if _, err := s.batch.do(kindMark, s.Key(key), "", s.msArg(window)); err != nil {
		return fmt.Errorf("redisdedupe: mark: %w", err)
	}
	return nil
}

// Release implements consumer.DedupeStore.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if _, err := s.batch.do(kindRelease, s.Key(key), token, noTTL); err != nil {
		return fmt.Errorf("redisdedupe: release: %w", err)
	}
	return nil
}

// ClaimLater claims key for token, for ttl, as one try of Claim that
// does not wait: it calls done with DedupeClaimed, DedupeSent, or 0 while
// another token holds the key (the caller claims again at its turn, with
// Claim, which waits). The claim goes out within a couple of milliseconds,
// with the other operations queued meanwhile, in the order they were
// queued: a consumer claims the keys of the messages it fetched ahead of
// their turn, so that few calls carry many claims. done is called once,
// from another goroutine, and must not block. The client's timeouts bound
// the call.
func (s *Store) ClaimLater(key, token string, ttl time.Duration, done func(consumer.DedupeState, error)) {
	o := opPool.Get().(*op)
	o.kind, o.key, o.token, o.ttl, o.claimed = kindClaim, s.Key(key), token, s.msArg(ttl), done
	s.batch.laterOp(o)
}

// MarkSentLater is MarkSent, sent with the other operations queued within
// a couple of milliseconds (as ClaimLater): it calls done with its error
// once the key is marked. done is called once, from another goroutine, and
// must not block.
func (s *Store) MarkSentLater(key, token string, window time.Duration, done func(error)) {
	o := opPool.Get().(*op)
	o.kind, o.key, o.ttl, o.ended, o.what = kindMark, s.Key(key), s.msArg(window), done, "mark"
	s.batch.laterOp(o)
}

// ReleaseLater is Release, sent with the other operations queued within a
// couple of milliseconds (as ClaimLater), after those queued before it
// (a ClaimLater of the same token): it calls done with its error. done is
// called once, from another goroutine, and must not block.
func (s *Store) ReleaseLater(key, token string, done func(error)) {
	o := opPool.Get().(*op)
	o.kind, o.key, o.token, o.ttl, o.ended, o.what = kindRelease, s.Key(key), token, noTTL, done, "release"
	s.batch.laterOp(o)
}

// Flush sends the operations that ClaimLater, MarkSentLater and
// ReleaseLater queued now, from the caller's goroutine, or, while a call
// is in flight, right after it: a consumer calls it when a message whose
// claim is still queued comes to its turn.
func (s *Store) Flush() { s.batch.flush() }

// Close closes the Store's Pub/Sub connection, if open, and waits for its
// reader. A Claim waiting meanwhile waits for its claim's TTL. Close is
// idempotent and returns nil.
func (s *Store) Close() error {
	s.mu.Lock()
	ps, done, was := s.ps, s.done, s.closed
	s.closed = true
	s.mu.Unlock()
	if ps != nil && !was {
		_ = ps.Close()
		<-done
	}
	return nil
}

// watch registers a waiter of rkey, opening the Pub/Sub connection at the
// first one, and waits (until ctx ends) for its first subscription.
func (s *Store) watch(ctx context.Context, rkey string) (chan struct{}, error) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	if s.waiters[rkey] == nil {
		s.waiters[rkey] = map[chan struct{}]struct{}{}
	}
	s.waiters[rkey][ch] = struct{}{}
	if s.ps == nil && !s.closed {
		s.ps = s.client.Subscribe(context.Background(), s.channel)
		s.ready, s.done = make(chan struct{}), make(chan struct{})
		go s.read(s.ps, s.ready, s.done)
	}
	ready := s.ready
	s.mu.Unlock()
	if ready == nil { // closed
		return ch, nil
	}
	select {
	case <-ready:
		return ch, nil
	case <-ctx.Done():
		s.unwatch(rkey, ch)
		return nil, ctx.Err()
	}
}

func (s *Store) unwatch(rkey string, ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.waiters[rkey], ch)
	if len(s.waiters[rkey]) == 0 {
		delete(s.waiters, rkey)
	}
}

// read is the Pub/Sub reader: it wakes the waiters of each key published,
// and every waiter after a resubscription. It returns when ps is closed.
func (s *Store) read(ps *redis.PubSub, ready, done chan struct{}) {
	defer close(done)
	first := true
	for {
		msg, err := ps.Receive(context.Background())
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if first {
				first = false
				close(ready)
			} else {
				s.wake("")
			}
		case *redis.Message:
			s.wake(m.Payload)
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond) // go-redis reconnects at the next Receive
		}
	}
}

// wake wakes the waiters of rkey, or every waiter for "".
func (s *Store) wake(rkey string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	notify := func(ws map[chan struct{}]struct{}) {
		for ch := range ws {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	if rkey != "" {
		notify(s.waiters[rkey])
		return
	}
	for _, ws := range s.waiters {
		notify(ws)
	}
}

func ms(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}

// noTTL is the TTL argument of a release.
var noTTL any = ""

// msArg returns ms(d) as a script argument, boxed once for the few TTLs a
// Store is given (the claim's and the window).
func (s *Store) msArg(d time.Duration) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.msArgs[d]; ok {
		return v
	}
	var v any = ms(d)
	if len(s.msArgs) < 8 {
		s.msArgs[d] = v
	}
	return v
}
