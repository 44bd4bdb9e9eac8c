package kit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
)

// laterFake is a DedupeStore with queued operations (laterStore) whose
// queue the test runs: each ClaimLater, MarkSentLater and ReleaseLater
// waits until Flush or run, and every call is logged.
type laterFake struct {
	mu      sync.Mutex
	log     []string
	queue   []func()
	claims  map[string]string // key: holder
	sent    map[string]bool
	claimAs consumer.DedupeState // answer of the next claims ahead, if set
	failAll bool                 // the queued operations fail
}

var errFake = errors.New("redis down")

func newLaterFake() *laterFake {
	return &laterFake{claims: map[string]string{}, sent: map[string]bool{}}
}

func (f *laterFake) logf(format string, args ...any) {
	f.log = append(f.log, fmt.Sprintf(format, args...))
}

func (f *laterFake) try(key, token string) consumer.DedupeState {
	switch h, held := f.claims[key]; {
	case f.sent[key]:
		return consumer.DedupeSent
	case !held || h == token:
		f.claims[key] = token
		return consumer.DedupeClaimed
	}
	return 0
}

func (f *laterFake) Claim(_ context.Context, key, token string, _ time.Duration) (consumer.DedupeState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logf("claim %s", key)
	if st := f.try(key, token); st != 0 {
		return st, nil
	}
	// Another token holds it: a store waits for its mark; the fake says
	// what that mark would.
	f.sent[key] = true
	delete(f.claims, key)
	return consumer.DedupeSent, nil
}

func (f *laterFake) MarkSent(_ context.Context, key, _ string, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logf("mark %s", key)
	delete(f.claims, key)
	f.sent[key] = true
	return nil
}

func (f *laterFake) Release(_ context.Context, key, token string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logf("release %s", key)
	if f.claims[key] == token {
		delete(f.claims, key)
	}
	return nil
}

func (f *laterFake) ClaimLater(key, token string, _ time.Duration, done func(consumer.DedupeState, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logf("queue claim %s", key)
	f.queue = append(f.queue, func() {
		if f.failAll {
			done(0, errFake)
			return
		}
		st := f.try(key, token)
		if f.claimAs != 0 {
			st = f.claimAs
		}
		done(st, nil)
	})
}

func (f *laterFake) MarkSentLater(key, _ string, _ time.Duration, done func(error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logf("queue mark %s", key)
	f.queue = append(f.queue, func() {
		if f.failAll {
			done(errFake)
			return
		}
		delete(f.claims, key)
		f.sent[key] = true
		done(nil)
	})
}

func (f *laterFake) ReleaseLater(key, token string, done func(error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logf("queue release %s", key)
	f.queue = append(f.queue, func() {
		if f.claims[key] == token {
			delete(f.claims, key)
		}
		done(nil)
	})
}

// Flush runs the queue, as the store's send would.
func (f *laterFake) Flush() {
	f.mu.Lock()
	f.logf("flush")
	f.mu.Unlock()
	f.run()
}

// run runs the queued operations (their done functions outside mu, as a
// store calls them from its sender).
func (f *laterFake) run() {
	f.mu.Lock()
	q := f.queue
	f.queue = nil
	f.mu.Unlock()
	for _, op := range q {
		op()
	}
}

// took returns the calls logged since the last took.
func (f *laterFake) took() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := strings.Join(f.log, ", ")
	f.log = nil
	return s
}

func aheadProcessor(t *testing.T, f *laterFake, obs *consumer.MessageObserver) (*Processor, *atomic.Int64, *time.Time) {
	t.Helper()
	var sends atomic.Int64
	p, err := NewProcessor(consumer.Options{
		Dedupe: &consumer.Dedupe{
			Store: f, Key: func(m consumer.Message) (string, error) { return m.Headers["id"], nil },
			SendTimeout: 10 * time.Second, ClaimTTL: 50 * time.Second,
		},
		Retry:    consumer.RetryPolicy{MaxAttempts: 1},
		Observer: obs,
	}, func(context.Context, consumer.Message) error { sends.Add(1); return nil }, MarksLater())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p.dedupe.now = func() time.Time { return now }
	return p, &sends, &now
}

func idMsg(id string) consumer.Message {
	return consumer.Message{Headers: map[string]string{"id": id}}
}

// TestClaimAheadSteps: a message claimed ahead makes no claim call at its
// turn (it flushes the queue when its claim is still in it), and is
// committed only once its queued mark ran (Marking.Then); a claim ahead
// that says sent ends the message deduplicated; one held by another token,
// or older than ClaimTTL − SendTimeout at the message's turn (fixed
// instants), is claimed again then; a message dropped, or abandoned before
// its claim step, releases its claim ahead.
func TestClaimAheadSteps(t *testing.T) {
	ctx := context.Background()
	f := newLaterFake()
	p, sends, now := aheadProcessor(t, f, nil)

	// Claimed ahead, flushed at its turn, marked later.
	a := p.ClaimAhead(idMsg("k1"))
	if a == nil {
		t.Fatal("no claim ahead with a queueing store")
	}
	out := p.ProcessAhead(ctx, idMsg("k1"), a)
	if got, want := f.took(), "queue claim k1, flush, queue mark k1"; got != want {
		t.Fatalf("calls %q, want %q", got, want)
	}
	if !out.Delivered() || sends.Load() != 1 || out.Marking == nil {
		t.Fatalf("%+v, %d sends; want delivered once, with a Marking", out, sends.Load())
	}
	var then atomic.Bool
	out.Marking.Then(func() { then.Store(true) })
	if then.Load() {
		t.Fatal("Then ran before the mark")
	}
	f.run()
	if !then.Load() || !f.sent["k1"] {
		t.Fatal("Then did not run once the mark ran")
	}

	// Claimed ahead and answered before its turn: no flush, no claim.
	a = p.ClaimAhead(idMsg("k2"))
	f.run()
	*now = now.Add(40*time.Second - time.Nanosecond) // still fresh
	out = p.ProcessAhead(ctx, idMsg("k2"), a)
	if got, want := f.took(), "queue claim k2, queue mark k2"; got != want || sends.Load() != 2 {
		t.Fatalf("calls %q, %d sends; want %q, 2", got, sends.Load(), want)
	}
	f.run()
	out.Marking.Then(func() {})

	// Stale at its turn (ClaimTTL − SendTimeout = 40 s): claimed again.
	a = p.ClaimAhead(idMsg("k3"))
	f.run()
	*now = now.Add(40 * time.Second)
	p.ProcessAhead(ctx, idMsg("k3"), a)
	if got, want := f.took(), "queue claim k3, claim k3, queue mark k3"; got != want {
		t.Fatalf("stale: calls %q, want %q", got, want)
	}
	f.run()

	// Already sent: deduplicated, not sent.
	a = p.ClaimAhead(idMsg("k1"))
	f.run()
	if out := p.ProcessAhead(ctx, idMsg("k1"), a); !out.Deduplicated || sends.Load() != 3 {
		t.Fatalf("copy of a sent key: %+v, %d sends; want deduplicated, 3", out, sends.Load())
	}
	f.took()

	// Held by another token: claimed at its turn, which waits for the
	// holder (the fake's Claim answers as after the holder's mark).
	f.claims["k4"] = "other"
	a = p.ClaimAhead(idMsg("k4"))
	f.run()
	if out := p.ProcessAhead(ctx, idMsg("k4"), a); !out.Deduplicated || sends.Load() != 3 {
		t.Fatalf("held: %+v, %d sends; want deduplicated after the claim at its turn, 3", out, sends.Load())
	}
	if got, want := f.took(), "queue claim k4, claim k4"; got != want {
		t.Fatalf("held: calls %q, want %q", got, want)
	}

	// Dropped: released after the claim, in the queue.
	a = p.ClaimAhead(idMsg("k5"))
	p.DropAhead(a)
	f.run()
	if got, want := f.took(), "queue claim k5, queue release k5"; got != want || f.claims["k5"] != "" {
		t.Fatalf("dropped: calls %q, want %q, no claim left", got, want)
	}

	// Abandoned before its claim step (the limiter's wait ended):
	// released.
	var sends2 atomic.Int64
	p2, err := NewProcessor(consumer.Options{
		Dedupe:  &consumer.Dedupe{Store: f, Key: func(m consumer.Message) (string, error) { return m.Headers["id"], nil }},
		Limiter: abandoning{},
	}, func(context.Context, consumer.Message) error { sends2.Add(1); return nil }, MarksLater())
	if err != nil {
		t.Fatal(err)
	}
	a = p2.ClaimAhead(idMsg("k6"))
	f.run()
	out = p2.ProcessAhead(ctx, idMsg("k6"), a)
	f.run()
	if got, want := f.took(), "queue claim k6, queue release k6"; !out.Abandoned || got != want || f.claims["k6"] != "" || sends2.Load() != 0 {
		t.Fatalf("abandoned: %+v, calls %q, claims %v; want abandoned, %q, k6 released", out, got, f.claims, want)
	}
}

// abandoning is a limiter whose wait ends as at a revocation.
type abandoning struct{}

func (abandoning) Wait(context.Context, int) error {
	return fmt.Errorf("revoked: %w", consumer.ErrAbandoned)
}

// TestClaimAheadStoreDown: a claim ahead that fails counts as a store
// failure, and the message's turn follows Dedupe.OnStoreError (local: a
// claim and mark in memory, the message sent); while the store counts as
// failing, nothing is claimed ahead; a queued mark that fails marks the
// key in memory, and its Marking still ends.
func TestClaimAheadStoreDown(t *testing.T) {
	ctx := context.Background()
	f := newLaterFake()
	var storeErrors atomic.Int64
	p, sends, _ := aheadProcessor(t, f, &consumer.MessageObserver{DedupeStoreError: func(error) { storeErrors.Add(1) }})
	f.failAll = true
	a := p.ClaimAhead(idMsg("k1"))
	out := p.ProcessAhead(ctx, idMsg("k1"), a)
	if !out.Delivered() || sends.Load() != 1 || storeErrors.Load() != 1 || out.Marking != nil {
		t.Fatalf("%+v, %d sends, %d store errors; want sent once under local, one error, marked in memory at once", out, sends.Load(), storeErrors.Load())
	}
	if a := p.ClaimAhead(idMsg("k2")); a != nil {
		t.Fatal("claimed ahead while the store counts as failing")
	}
	// A copy: deduplicated by the local store.
	if out := p.Process(ctx, idMsg("k1")); !out.Deduplicated || sends.Load() != 1 {
		t.Fatalf("copy: %+v, %d sends; want deduplicated in memory", out, sends.Load())
	}

	// Claimed ahead, then the queued mark fails: marked in memory, and
	// the Marking ends.
	f = newLaterFake()
	p, sends, _ = aheadProcessor(t, f, nil)
	a = p.ClaimAhead(idMsg("k3"))
	f.run()
	f.failAll = true
	out = p.ProcessAhead(ctx, idMsg("k3"), a)
	var then atomic.Bool
	out.Marking.Then(func() { then.Store(true) })
	f.run()
	if !then.Load() {
		t.Fatal("the Marking of a failed mark did not end")
	}
	if out := p.Process(ctx, idMsg("k3")); !out.Deduplicated || sends.Load() != 1 {
		t.Fatalf("copy after a failed mark: %+v, %d sends; want deduplicated in memory", out, sends.Load())
	}
}

// TestClaimAheadStolen: two copies claimed ahead, the first holding the
// key: when the second comes to its turn first (another lane), it takes
// the first's claim over instead of waiting for a message that may wait
// for its worker, and is sent; the first, at its turn, claims with a
// token of its own and ends deduplicated; a dropped message whose claim
// was taken over releases nothing.
func TestClaimAheadStolen(t *testing.T) {
	ctx := context.Background()
	f := newLaterFake()
	p, sends, _ := aheadProcessor(t, f, nil)
	a1, a2 := p.ClaimAhead(idMsg("k")), p.ClaimAhead(idMsg("k"))
	f.run()
	if a1.st != consumer.DedupeClaimed || a2.st != 0 {
		t.Fatalf("claims ahead: %v, %v; want the first claimed, the second held", a1.st, a2.st)
	}
	holder := f.claims["k"]
	out := p.ProcessAhead(ctx, idMsg("k"), a2)
	if !out.Delivered() || out.Deduplicated || sends.Load() != 1 {
		t.Fatalf("second copy first: %+v, %d sends; want sent at once", out, sends.Load())
	}
	if got, want := f.took(), "queue claim k, queue claim k, claim k, queue mark k"; got != want || f.claims["k"] != holder {
		t.Fatalf("calls %q, want %q (the holder's claim extended)", got, want)
	}
	f.run()
	if out := p.ProcessAhead(ctx, idMsg("k"), a1); !out.Deduplicated || sends.Load() != 1 {
		t.Fatalf("first copy after: %+v, %d sends; want deduplicated", out, sends.Load())
	}

	// Dropped after its claim was taken over: no release.
	b1, b2 := p.ClaimAhead(idMsg("j")), p.ClaimAhead(idMsg("j"))
	f.run()
	p.ProcessAhead(ctx, idMsg("j"), b2)
	f.took()
	p.DropAhead(b1)
	if got := f.took(); got != "" {
		t.Fatalf("dropping a claim taken over: calls %q, want none", got)
	}
	f.run()
}
