package kit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/limiter"
)

// sendLog is a sink that counts its sends by message body.
type sendLog struct {
	mu    sync.Mutex
	sends map[string]int
	fail  func(body string, n int) error // n: the body's sends before this one
}

func (s *sendLog) handler(ctx context.Context, m consumer.Message) error {
	s.mu.Lock()
	n := s.sends[string(m.Body)]
	s.sends[string(m.Body)]++
	fail := s.fail
	s.mu.Unlock()
	if fail != nil {
		return fail(string(m.Body), n)
	}
	return nil
}

func (s *sendLog) count(body string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sends[body]
}

type dedupeCounts struct{ deduplicated, noKey, storeErrSkip, storeErrors atomic.Int64 }

func (c *dedupeCounts) observer() *consumer.MessageObserver {
	return &consumer.MessageObserver{
		Deduplicated: func(consumer.Message) { c.deduplicated.Add(1) },
		DedupeSkipped: func(_ consumer.Message, reason string) {
			switch reason {
			case consumer.DedupeSkipNoKey:
				c.noKey.Add(1)
			case consumer.DedupeSkipStoreError:
				c.storeErrSkip.Add(1)
			}
		},
		DedupeStoreError: func(error) { c.storeErrors.Add(1) },
	}
}

func headerKey(m consumer.Message) (string, error) { return m.Headers["message-id"], nil }

func newDedupeProcessor(t *testing.T, sink *sendLog, d *consumer.Dedupe, c *dedupeCounts) *kit.Processor {
	t.Helper()
	o := consumer.Options{
		Dedupe: d,
		Retry:  consumer.RetryPolicy{MaxAttempts: 2, Backoff: time.Millisecond, MaxBackoff: time.Millisecond},
	}
	if c != nil {
		o.Observer = c.observer()
	}
	p, err := kit.NewProcessor(o, sink.handler)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func msgWithID(body, id string) consumer.Message {
	return consumer.Message{Body: []byte(body), Headers: map[string]string{"message-id": id}}
}

// TestDedupeCopiesSentOnce: 20 messages, each published twice, handled
// by two processors (two replicas) sharing a store, all at once: each is
// sent once, and each second copy ends Deduplicated, delivered for the
// backend. Without Options.Dedupe every message is sent twice.
func TestDedupeCopiesSentOnce(t *testing.T) {
	for _, dedupe := range []bool{true, false} {
		sink := &sendLog{sends: map[string]int{}}
		var d *consumer.Dedupe
		if dedupe {
			d = &consumer.Dedupe{Store: consumer.NewLocalDedupeStore(), Key: headerKey}
		}
		var c dedupeCounts
		replicas := []*kit.Processor{newDedupeProcessor(t, sink, d, &c), newDedupeProcessor(t, sink, d, &c)}
		var wg sync.WaitGroup
		var undelivered atomic.Int64
		for i := range 20 {
			for r := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := string(rune('a' + i))
					if out := replicas[r].Process(context.Background(), msgWithID(body, "id-"+body)); !out.Delivered() {
						undelivered.Add(1)
					}
				}()
			}
		}
		wg.Wait()
		dup := 0
		for i := range 20 {
			if n := sink.count(string(rune('a' + i))); n > 1 {
				dup++
			} else if n == 0 {
				t.Fatalf("dedupe %v: message %d never sent", dedupe, i)
			}
		}
		switch {
		case undelivered.Load() != 0:
			t.Fatalf("dedupe %v: %d copies not delivered", dedupe, undelivered.Load())
		case dedupe && (dup != 0 || c.deduplicated.Load() != 20):
			t.Fatalf("with dedupe: %d messages sent twice, %d deduplicated; want 0 and 20", dup, c.deduplicated.Load())
		case !dedupe && dup != 20:
			t.Fatalf("without dedupe: %d messages sent twice, want 20 (the test would not see a defect)", dup)
		}
	}
}

// TestDedupeFailedSendReleases: a message that failed for good releases
// its claim, so that a later copy is sent at once (not after the claim's
// TTL); a message sent marks its key, so that a copy a minute later is
// not sent.
func TestDedupeFailedSendReleases(t *testing.T) {
	sink := &sendLog{sends: map[string]int{}, fail: func(body string, n int) error {
		if body == "bad" && n < 2 {
			return errors.New("503")
		}
		return nil
	}}
	var c dedupeCounts
	p := newDedupeProcessor(t, sink, &consumer.Dedupe{Key: headerKey, ClaimTTL: time.Hour}, &c)
	ctx := context.Background()
	if out := p.Process(ctx, msgWithID("bad", "x")); out.Err == nil || out.Attempts != 2 {
		t.Fatalf("first copy: %+v, want failed after 2 attempts (to dead-letter)", out)
	}
	start := time.Now()
	if out := p.Process(ctx, msgWithID("bad", "x")); !out.Delivered() || out.Deduplicated {
		t.Fatalf("second copy: %+v, want sent", out)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the second copy waited %v for a released claim", d)
	}
	if out := p.Process(ctx, msgWithID("bad", "x")); !out.Deduplicated || sink.count("bad") != 3 {
		t.Fatalf("third copy: %+v, %d sends; want deduplicated after 3 sends (2 failed, 1 ok)", out, sink.count("bad"))
	}
}

// TestDedupeWaitsForTheHolder: a copy that finds another's claim waits:
// woken by the holder's mark at once (not at the claim's TTL of an hour)
// and not sent; when a holder dies, its claim's TTL passes and the copy
// is sent, once.
func TestDedupeWaitsForTheHolder(t *testing.T) {
	store := consumer.NewLocalDedupeStore()
	sink := &sendLog{sends: map[string]int{}}
	p := newDedupeProcessor(t, sink, &consumer.Dedupe{Store: store, Key: headerKey}, nil)
	ctx := context.Background()

	if st, err := store.Claim(ctx, "held", "other-replica", time.Hour); st != consumer.DedupeClaimed || err != nil {
		t.Fatal(st, err)
	}
	done := make(chan kit.Outcome)
	go func() { done <- p.Process(ctx, msgWithID("m1", "held")) }()
	select {
	case out := <-done:
		t.Fatalf("returned %+v while the claim is held", out)
	case <-time.After(50 * time.Millisecond):
	}
	_ = store.MarkSent(ctx, "held", "other-replica", time.Hour)
	select {
	case out := <-done:
		if !out.Deduplicated || sink.count("m1") != 0 {
			t.Fatalf("after the holder's mark: %+v, %d sends; want deduplicated, none", out, sink.count("m1"))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the mark did not wake the waiting copy")
	}

	// A holder that dies leaves its claim to expire.
	const ttl = 300 * time.Millisecond
	if st, _ := store.Claim(ctx, "dead", "dead-replica", ttl); st != consumer.DedupeClaimed {
		t.Fatal(st)
	}
	start := time.Now()
	if out := p.Process(ctx, msgWithID("m2", "dead")); !out.Delivered() || out.Deduplicated || sink.count("m2") != 1 {
		t.Fatalf("after the dead holder's claim: %+v, %d sends; want sent once", out, sink.count("m2"))
	}
	if d := time.Since(start); d < ttl-50*time.Millisecond {
		t.Fatalf("sent after %v, before the claim's TTL %v", d, ttl)
	}
}

// failingStore fails while down is set, else uses the local store.
type failingStore struct {
	consumer.DedupeStore
	down atomic.Bool
}

var errDown = errors.New("redis down")

func (f *failingStore) Claim(ctx context.Context, key, token string, ttl time.Duration) (consumer.DedupeState, error) {
	if f.down.Load() {
		return 0, errDown
	}
	return f.DedupeStore.Claim(ctx, key, token, ttl)
}

func (f *failingStore) MarkSent(ctx context.Context, key, token string, w time.Duration) error {
	if f.down.Load() {
		return errDown
	}
	return f.DedupeStore.MarkSent(ctx, key, token, w)
}

// TestDedupeStoreDown runs each on_store_error policy with the store
// down: local dedupes within the replica, open sends every copy (counted
// as skipped), closed sends nothing until the store answers.
func TestDedupeStoreDown(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []limiter.Mode{limiter.ModeLocal, limiter.ModeOpen, limiter.ModeClosed} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			store := &failingStore{DedupeStore: consumer.NewLocalDedupeStore()}
			store.down.Store(true)
			sink := &sendLog{sends: map[string]int{}}
			var c dedupeCounts
			p := newDedupeProcessor(t, sink, &consumer.Dedupe{Store: store, Key: headerKey, OnStoreError: mode}, &c)
			if mode == limiter.ModeClosed {
				done := make(chan kit.Outcome)
				go func() { done <- p.Process(ctx, msgWithID("m", "k")) }()
				select {
				case out := <-done:
					t.Fatalf("closed, store down: %+v", out)
				case <-time.After(100 * time.Millisecond):
				}
				if sink.count("m") != 0 {
					t.Fatal("closed: sent while the store is down")
				}
				store.down.Store(false)
				if out := <-done; !out.Delivered() || sink.count("m") != 1 {
					t.Fatalf("closed, store back: %+v, %d sends", out, sink.count("m"))
				}
				return
			}
			for range 2 {
				if out := p.Process(ctx, msgWithID("m", "k")); !out.Delivered() {
					t.Fatalf("%+v", out)
				}
			}
			want := map[limiter.Mode]int{limiter.ModeLocal: 1, limiter.ModeOpen: 2}[mode]
			if n := sink.count("m"); n != want || c.storeErrors.Load() == 0 {
				t.Fatalf("%d sends, %d store errors; want %d sends and errors counted", n, c.storeErrors.Load(), want)
			}
			if mode == limiter.ModeOpen && c.storeErrSkip.Load() != 2 {
				t.Fatalf("open: %d skipped, want 2", c.storeErrSkip.Load())
			}
		})
	}
}

// TestDedupeNoKey: a message whose key is empty is sent without dedupe
// and counted; with RequireKey it fails permanently with ErrNoDedupeKey.
func TestDedupeNoKey(t *testing.T) {
	ctx := context.Background()
	sink := &sendLog{sends: map[string]int{}}
	var c dedupeCounts
	p := newDedupeProcessor(t, sink, &consumer.Dedupe{Key: headerKey}, &c)
	for range 2 {
		if out := p.Process(ctx, msgWithID("m", "")); !out.Delivered() {
			t.Fatalf("%+v", out)
		}
	}
	if sink.count("m") != 2 || c.noKey.Load() != 2 {
		t.Fatalf("%d sends, %d counted without a key; want 2 and 2", sink.count("m"), c.noKey.Load())
	}
	p = newDedupeProcessor(t, sink, &consumer.Dedupe{Key: headerKey, RequireKey: true}, &c)
	out := p.Process(ctx, msgWithID("r", ""))
	if !consumer.IsPermanent(out.Err) || !errors.Is(out.Err, consumer.ErrNoDedupeKey) || sink.count("r") != 0 {
		t.Fatalf("RequireKey: %+v, %d sends; want a permanent ErrNoDedupeKey, none", out, sink.count("r"))
	}
}

// TestDedupeConfigErrors: a Dedupe without a key function, or with a
// negative window or an unknown policy, is refused naming the field.
func TestDedupeConfigErrors(t *testing.T) {
	_, err := kit.NewProcessor(consumer.Options{Dedupe: &consumer.Dedupe{Window: -1, OnStoreError: "maybe"}},
		func(context.Context, consumer.Message) error { return nil })
	var fields []string
	for _, fe := range consumer.FieldErrors(err) {
		fields = append(fields, fe.Field)
	}
	if !errors.Is(err, consumer.ErrInvalidConfig) || len(fields) != 3 {
		t.Fatalf("err %v, fields %v; want Dedupe.Key, Dedupe.Window, Dedupe.OnStoreError", err, fields)
	}
}
