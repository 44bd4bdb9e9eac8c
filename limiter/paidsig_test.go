package limiter_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
)

// secretStore is a layeredClocked that keeps a paid-slot secret as Redis
// does (limiter.PaidSecretStore): the first candidate offered, until the
// test replaces or breaks it.
type secretStore struct {
	*layeredClocked
	mu     sync.Mutex
	secret []byte
	err    error
	reads  int
}

func (s *secretStore) PaidSecret(_ context.Context, candidate []byte) (string, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if s.err != nil {
		return "", nil, s.err
	}
	if s.secret == nil {
		s.secret = slices.Clone(candidate)
	}
	return "sms", s.secret, nil
}

func (s *secretStore) set(secret []byte, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secret, s.err = secret, err
}

// twoDelayLayers are two keyed delay layers of 1/h, burst 1: a key's
// second request is refused, with a slot booked an hour ahead.
var twoDelayLayers = []limiter.Layer{
	{Name: "per-key", Keyed: true, Rate: 1.0 / 3600, Burst: 1, OnExceed: limiter.ActionDelay},
	{Name: "per-sender", Keyed: true, Rate: 1.0 / 3600, Burst: 1, OnExceed: limiter.ActionDelay},
}

// bookSlot makes b's layer per-key refuse key (spent by an earlier
// request), with a slot booked, and returns the slot as the message
// carries it back.
func bookSlot(t *testing.T, b *limiter.Bucket, key, sender string) limiter.PaidSlot {
	t.Helper()
	err := b.WaitN(context.Background(), limiter.Request{Cost: 1, Keys: map[string]string{"per-key": key, "per-sender": sender}})
	var le *limiter.LimitError
	if !errors.As(err, &le) || !le.Reserved || le.Layer != "per-key" {
		t.Fatalf("WaitN on a spent key = %v, want per-key's refusal with a slot booked", err)
	}
	return le.Slot()
}

// TestPaidSlotSigned: a slot that WaitN booked carries the Bucket's
// signature and passes its layer when it comes back; the same slot with
// its due instant, key or layer changed, or without its signature, is
// refused (counted by Bucket.PaidRefused and Observer.PaidRefused), and
// its layer decides as if the message named no slot: the message would
// have passed on it.
func TestPaidSlotSigned(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var mu sync.Mutex
	var refused []string
	obs := &limiter.Observer{PaidRefused: func(layer string) { mu.Lock(); refused = append(refused, layer); mu.Unlock() }}
	b := newLayeredBucket(t, clk, newLayeredClocked(t, clk, 1e6, 1e6, 1, twoDelayLayers...), obs)
	ctx := context.Background()
	take := func(key, sender string, paid ...limiter.PaidSlot) error {
		return b.WaitN(ctx, limiter.Request{Cost: 1, Keys: map[string]string{"per-key": key, "per-sender": sender}, Paid: paid})
	}
	// Spend key k, sender s and key k2 (each layer's burst of 1).
	for _, ks := range [][2]string{{"k", "s"}, {"k2", "s2"}} {
		if err := take(ks[0], ks[1]); err != nil {
			t.Fatal(err)
		}
	}
	slot := bookSlot(t, b, "k", "s3")
	if slot.Sig == "" {
		t.Fatalf("booked slot %+v carries no signature", slot)
	}
	for _, tt := range []struct {
		name        string
		key, sender string
		edit        func(*limiter.PaidSlot)
		layer       string // the layer that refuses
	}{
		{"due an hour earlier", "k", "s4", func(s *limiter.PaidSlot) { s.Due = s.Due.Add(-time.Hour) }, "per-key"},
		{"due a microsecond earlier", "k", "s5", func(s *limiter.PaidSlot) { s.Due = s.Due.Add(-time.Microsecond) }, "per-key"},
		{"another key", "k2", "s6", func(s *limiter.PaidSlot) { s.Key = "k2" }, "per-key"},
		{"another layer", "k3", "s", func(s *limiter.PaidSlot) { s.Layer, s.Key = "per-sender", "s" }, "per-sender"},
		{"no signature", "k", "s7", func(s *limiter.PaidSlot) { s.Sig = "" }, "per-key"},
	} {
		forged := slot
		tt.edit(&forged)
		before := b.PaidRefused()
		err := take(tt.key, tt.sender, forged)
		var le *limiter.LimitError
		if !errors.As(err, &le) || le.Layer != tt.layer {
			t.Errorf("%s: WaitN with %+v = %v, want %s's refusal", tt.name, forged, err, tt.layer)
		}
		if got := b.PaidRefused() - before; got != 1 {
			t.Errorf("%s: PaidRefused counted %d, want 1", tt.name, got)
		}
	}
	before := b.PaidRefused()
	if err := take("k", "s8", slot); err != nil {
		t.Errorf("WaitN with the genuine slot = %v, want it through", err)
	}
	if got := b.PaidRefused() - before; got != 0 {
		t.Errorf("the genuine slot counted %d refused, want 0", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"per-key", "per-key", "per-key", "per-sender", "per-key"}; !slices.Equal(refused, want) {
		t.Errorf("Observer.PaidRefused got %v, want %v", refused, want)
	}
}

// TestPaidSlotSecretOfTheStore: the Buckets of two replicas on a store
// that keeps the secret (limiter.PaidSecretStore) read it once each and
// pass each other's slots. A replica whose secret the store no longer
// keeps (deleted, and made again by a replica that started since) has its
// slots refused, never passed; it reads the secret again after a slot
// with a signature failed to verify, at most every 5 s, and then passes
// the others' slots. A store that fails to give the secret leaves the
// slot unsigned: it books its layer again when it comes back.
func TestPaidSlotSecretOfTheStore(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := &secretStore{layeredClocked: newLayeredClocked(t, clk, 1e6, 1e6, 1, twoDelayLayers...)}
	a, b := newLayeredBucket(t, clk, store), newLayeredBucket(t, clk, store)
	ctx := context.Background()
	take := func(bk *limiter.Bucket, key, sender string, paid ...limiter.PaidSlot) error {
		return bk.WaitN(ctx, limiter.Request{Cost: 1, Keys: map[string]string{"per-key": key, "per-sender": sender}, Paid: paid})
	}
	if err := take(a, "k", "s0"); err != nil {
		t.Fatal(err)
	}
	if store.reads != 0 {
		t.Errorf("%d reads of the secret before any slot, want 0", store.reads)
	}
	fromA := bookSlot(t, a, "k", "s1")
	fromB := bookSlot(t, b, "k", "s2")
	if err := take(b, "k", "s3", fromA); err != nil {
		t.Errorf("replica b, a's slot: %v, want it through", err)
	}
	if err := take(a, "k", "s4", fromB); err != nil {
		t.Errorf("replica a, b's slot: %v, want it through", err)
	}
	if store.reads != 2 {
		t.Errorf("%d reads of the secret, want one per replica", store.reads)
	}

	// The store lost the secret; a replica that starts now makes another.
	store.set(nil, nil)
	c := newLayeredBucket(t, clk, store)
	fromC := bookSlot(t, c, "k", "s5")
	if err := take(a, "k", "s6", fromC); !errors.Is(err, limiter.ErrLimitExceeded) || a.PaidRefused() != 1 {
		t.Errorf("replica a, c's slot under a new secret: %v (%d refused), want per-key's refusal", err, a.PaidRefused())
	}
	clk.Advance(5 * time.Second)
	if err := take(a, "k", "s7", fromC); err != nil {
		t.Errorf("replica a, 5 s later, c's slot: %v, want it through: a read the new secret", err)
	}
	if err := take(c, "k", "s8", fromA); !errors.Is(err, limiter.ErrLimitExceeded) {
		t.Errorf("replica c, a's slot under the old secret: %v, want per-key's refusal", err)
	}

	// The store fails: nothing is signed, nothing passes.
	store.set(nil, errors.New("connection refused"))
	d := newLayeredBucket(t, clk, store)
	fromD := bookSlot(t, d, "k", "s9")
	if fromD.Sig != "" {
		t.Errorf("a replica without a secret signed %+v", fromD)
	}
	if err := take(d, "k", "s10", fromD); !errors.Is(err, limiter.ErrLimitExceeded) || d.PaidRefused() != 1 {
		t.Errorf("replica d, its own unsigned slot: %v (%d refused), want per-key's refusal", err, d.PaidRefused())
	}
}

// TestPaidSlotForfeitCounted: a per-key delay layer of 5/s, burst 1. Key
// k's first message goes out at 0; the next two are refused with slots
// booked at +200 and +400 ms. The one of +200 comes back on its slot at
// +300, later than the slot's lateness (25 ms): its layer refuses it, and
// books it again at +600. The slot counts as forfeit (Stats.PaidForfeit,
// Observer.PaidForfeit with its layer); one back on time passes and
// counts nothing.
func TestPaidSlotForfeitCounted(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var mu sync.Mutex
	var forfeit []string
	obs := &limiter.Observer{PaidForfeit: func(layer string) { mu.Lock(); forfeit = append(forfeit, layer); mu.Unlock() }}
	layer := limiter.Layer{Name: "per-key", Keyed: true, Rate: 5, Burst: 1, OnExceed: limiter.ActionDelay}
	b := newLayeredBucket(t, clk, newLayeredClocked(t, clk, 1e6, 1e6, 1, layer), obs)
	ctx := context.Background()
	req := func(paid ...limiter.PaidSlot) limiter.Request {
		return limiter.Request{Cost: 1, Keys: map[string]string{"per-key": "k"}, Paid: paid}
	}
	if err := b.WaitN(ctx, req()); err != nil {
		t.Fatal(err)
	}
	var slots []limiter.PaidSlot
	for range 2 {
		var le *limiter.LimitError
		if err := b.WaitN(ctx, req()); !errors.As(err, &le) || !le.Reserved {
			t.Fatalf("WaitN on a spent key = %v, want a slot booked", err)
		}
		slots = append(slots, le.Slot())
	}
	clk.Advance(300 * time.Millisecond) // 100 ms past the first slot
	var le *limiter.LimitError
	if err := b.WaitN(ctx, req(slots[0])); !errors.As(err, &le) || le.Layer != "per-key" {
		t.Fatalf("WaitN on a slot 100 ms late = %v, want per-key's refusal", err)
	}
	if got := b.Stats().PaidForfeit; got != 1 {
		t.Errorf("Stats().PaidForfeit = %d after a slot 100 ms late, want 1", got)
	}
	clk.Advance(slots[1].Due.Sub(clk.Now()))
	if err := b.WaitN(ctx, req(slots[1])); err != nil {
		t.Errorf("WaitN on its slot = %v, want it through", err)
	}
	if got := b.Stats().PaidForfeit; got != 1 {
		t.Errorf("Stats().PaidForfeit = %d after a slot on time, want still 1", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(forfeit, []string{"per-key"}) {
		t.Errorf("Observer.PaidForfeit got %v, want [per-key]", forfeit)
	}
}
