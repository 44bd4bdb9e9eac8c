package redisdedupe_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/redisdedupe"
	"github.com/throttlehq/throttle/internal/testenv"
)

func newStore(t *testing.T) (*redisdedupe.Store, *redis.Client) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	s, err := redisdedupe.New(c, redisdedupe.Config{Prefix: testenv.Name(t, "dd") + ":", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, c
}

// TestStoreSteps: the scripts' decisions, and the keys' TTLs on Redis.
func TestStoreSteps(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := testenv.Context(t, 10*time.Second)
	claim := func(token string) consumer.DedupeState {
		t.Helper()
		st, err := s.Claim(ctx, "k", token, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := claim("a"); st != consumer.DedupeClaimed {
		t.Fatalf("first claim: %v", st)
	}
	if st := claim("a"); st != consumer.DedupeClaimed {
		t.Fatalf("the holder's claim again: %v", st)
	}
	if ttl := c.PTTL(ctx, s.Key("k")).Val(); ttl <= 50*time.Second || ttl > time.Minute {
		t.Fatalf("claim TTL %v, want about a minute", ttl)
	}
	if err := s.Release(ctx, "k", "b"); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, s.Key("k")).Val(); v != "ca" {
		t.Fatalf("after another token's release: %q, want ca", v)
	}
	if err := s.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, s.Key("k")).Val(); n != 0 {
		t.Fatal("the holder's release left the key")
	}
	if st := claim("b"); st != consumer.DedupeClaimed {
		t.Fatalf("claim after release: %v", st)
	}
	if err := s.MarkSent(ctx, "k", "b", time.Hour); err != nil {
		t.Fatal(err)
	}
	if st := claim("c"); st != consumer.DedupeSent {
		t.Fatalf("claim after mark: %v", st)
	}
	if ttl := c.PTTL(ctx, s.Key("k")).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("mark TTL %v, want the window, an hour", ttl)
	}
}

// TestStoreWaitsExactly: a claim held by another token waits for the
// holder's mark (Pub/Sub: woken within moments, not at the TTL of a
// minute), for its release (then claims), and, for a holder that died,
// for the claim's remaining TTL.
func TestStoreWaitsExactly(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := testenv.Context(t, 20*time.Second)
	for _, end := range []string{"mark", "release", "expire"} {
		key := "w-" + end
		ttl := time.Minute
		if end == "expire" {
			ttl = 400 * time.Millisecond
		}
		if st, err := s.Claim(ctx, key, "holder", ttl); st != consumer.DedupeClaimed || err != nil {
			t.Fatal(st, err)
		}
		type res struct {
			st  consumer.DedupeState
			err error
			at  time.Time
		}
		done := make(chan res, 1)
		start := time.Now()
		go func() {
			st, err := s.Claim(ctx, key, "waiter", time.Minute)
			done <- res{st, err, time.Now()}
		}()
		select {
		case r := <-done:
			t.Fatalf("%s: returned %v %v while held", end, r.st, r.err)
		case <-time.After(100 * time.Millisecond):
		}
		acted := time.Now()
		switch end {
		case "mark":
			_ = s.MarkSent(ctx, key, "holder", time.Minute)
		case "release":
			_ = s.Release(ctx, key, "holder")
		}
		r := <-done
		want := map[string]consumer.DedupeState{"mark": consumer.DedupeSent, "release": consumer.DedupeClaimed, "expire": consumer.DedupeClaimed}[end]
		if r.err != nil || r.st != want {
			t.Fatalf("%s: %v %v, want %v", end, r.st, r.err, want)
		}
		switch lat := r.at.Sub(acted); {
		case end != "expire" && lat > 2*time.Second:
			t.Fatalf("%s: woken %v after it, want at once (Pub/Sub)", end, lat)
		case end == "expire" && r.at.Sub(start) < ttl-50*time.Millisecond:
			t.Fatalf("expire: claimed after %v, before the TTL %v", r.at.Sub(start), ttl)
		}
		t.Logf("%s: woken after %v", end, r.at.Sub(acted))
	}
}

// TestStoreBytesPerKey measures the memory of the keys marked sent
// (MEMORY USAGE), for docs/dedupe.md.
func TestStoreBytesPerKey(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := testenv.Context(t, 10*time.Second)
	var total int64
	const n = 100
	for i := range n {
		key := fmt.Sprintf("%08x-4e2b-4c1d-9a3f-%012x", i, i) // a UUID message-id, 36 bytes
		if st, err := s.Claim(ctx, key, "0123456789ab.1z", time.Minute); st != consumer.DedupeClaimed || err != nil {
			t.Fatal(st, err)
		}
		if err := s.MarkSent(ctx, key, "", time.Hour); err != nil {
			t.Fatal(err)
		}
		total += c.MemoryUsage(ctx, s.Key(key)).Val()
	}
	t.Logf("a key marked sent (36-byte message-id, key %d bytes): %d B by MEMORY USAGE", len(s.Key("x"))-1+36, total/n)
	if total/n > 200 {
		t.Fatalf("%d B per key", total/n)
	}
}

// TestStoreBatchesConcurrentCalls: 200 callers claiming and marking at
// once, their calls sent together in pipelines, each get their own
// answer: every key claimed once and then found sent.
func TestStoreBatchesConcurrentCalls(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := testenv.Context(t, 20*time.Second)
	const n = 200
	errs := make(chan error, 2*n)
	for i := range n {
		go func() {
			key := fmt.Sprintf("b-%d", i%(n/2)) // two callers a key
			st, err := s.Claim(ctx, key, fmt.Sprintf("t%d", i), time.Minute)
			switch {
			case err != nil:
				errs <- err
			case st == consumer.DedupeClaimed:
				errs <- s.MarkSent(ctx, key, "", time.Minute)
			default:
				errs <- nil
			}
			if st, err := s.Claim(ctx, key, "late", time.Minute); err != nil || st != consumer.DedupeSent {
				errs <- fmt.Errorf("key %s after its send: %v %v", key, st, err)
				return
			}
			errs <- nil
		}()
	}
	for range 2 * n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
