package redislimiter

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/throttlehq/throttle/limiter"
)

// TestPaidSecret: the first replica to offer a secret keeps it, in the
// bucket's slot; the others get that one; another bucket has its own. A
// bucket that holds only its secret is not listed by Buckets.
func TestPaidSecret(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	name := uniqueBucket(t, c)
	a, b := newStore(t, c, name, 10, 10), newStore(t, c, name, 10, 10)
	x, y := bytes.Repeat([]byte{'x'}, 32), bytes.Repeat([]byte{'y'}, 32)
	bucket, got, err := a.PaidSecret(ctx, x)
	if err != nil || bucket != name || !bytes.Equal(got, x) {
		t.Fatalf("first PaidSecret = %q, %d bytes (its own: %v), %v; want the bucket's name and the candidate", bucket, len(got), bytes.Equal(got, x), err)
	}
	if _, got, err := b.PaidSecret(ctx, y); err != nil || !bytes.Equal(got, x) {
		t.Errorf("second replica's PaidSecret: the first's %v, %v; want the first's", bytes.Equal(got, x), err)
	}
	if ttl := c.PTTL(ctx, a.paidSecretKey()).Val(); ttl >= 0 {
		t.Errorf("the secret's key has a TTL of %v, want none", ttl)
	}
	other := newStore(t, c, uniqueBucket(t, c), 10, 10)
	if _, got, err := other.PaidSecret(ctx, y); err != nil || !bytes.Equal(got, y) {
		t.Errorf("another bucket's PaidSecret: its own candidate %v, %v; want its own", bytes.Equal(got, y), err)
	}
	names, err := Buckets(ctx, c, "")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, name) {
		t.Errorf("Buckets lists %s, which holds only its paid secret", name)
	}
	if _, _, err := a.PaidSecret(ctx, nil); err == nil {
		t.Error("PaidSecret with no candidate: no error")
	}
}

// TestPaidSlotAcrossReplicas: two replicas of a bucket in Redis with a
// delay layer of 1/h sign with the secret they share: the slot one books
// passes the layer at the other, while a slot a producer made (unsigned,
// or with a signature of another secret) is refused there.
func TestPaidSlotAcrossReplicas(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	layers := []limiter.Layer{{Name: "per-key", Keyed: true, Rate: 1.0 / 3600, Burst: 1, OnExceed: limiter.ActionDelay}}
	a := newLayered(t, c, 1e6, 1e6, layers)
	b, err := newStore(t, c, a.cfg.Bucket, 1e6, 1e6).WithLayers(layers)
	if err != nil {
		t.Fatal(err)
	}
	replica := func(s limiter.Store) *limiter.Bucket {
		bk, err := limiter.New(s, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { bk.Close() })
		return bk
	}
	ra, rb := replica(a), replica(b)
	req := func(paid ...limiter.PaidSlot) limiter.Request {
		return limiter.Request{Cost: 1, Keys: map[string]string{"per-key": "k"}, Paid: paid}
	}
	if err := ra.WaitN(ctx, req()); err != nil {
		t.Fatal(err)
	}
	var le *limiter.LimitError
	if err := ra.WaitN(ctx, req()); !errors.As(err, &le) || !le.Reserved || le.Sig == "" {
		t.Fatalf("a spent key: %v, want a refusal with a signed slot", err)
	}
	slot := le.Slot()
	forged := slot
	forged.Sig = ""
	if err := rb.WaitN(ctx, req(forged)); !errors.Is(err, limiter.ErrLimitExceeded) {
		t.Errorf("replica b, an unsigned slot: %v, want the layer's refusal", err)
	}
	// Signed with another secret: a replica of another bucket (whose
	// layer has the same name) booked it.
	o := replica(newLayered(t, c, 1e6, 1e6, layers))
	_ = o.WaitN(ctx, req())
	if err := o.WaitN(ctx, req()); !errors.As(err, &le) || le.Sig == "" {
		t.Fatalf("another bucket's spent key: %v, want a signed slot", err)
	}
	foreign := le.Slot()
	foreign.Due = slot.Due
	if err := rb.WaitN(ctx, req(foreign)); !errors.Is(err, limiter.ErrLimitExceeded) {
		t.Errorf("replica b, a slot of another bucket's secret: %v, want the layer's refusal", err)
	}
	if got := rb.Stats().PaidRefused; got != 2 {
		t.Errorf("replica b refused %d slots, want 2", got)
	}
	if err := rb.WaitN(ctx, req(slot)); err != nil {
		t.Errorf("replica b, the slot replica a booked: %v, want it through", err)
	}
}
