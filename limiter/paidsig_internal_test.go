package limiter

import (
	"testing"
	"time"
)

// TestPaidSlotVerify: a slot passes verify only with the signature of its
// own fields under the same bucket and secret; any field changed, the
// signature missing, altered or made with another secret or bucket fails.
func TestPaidSlotVerify(t *testing.T) {
	k := &paidKey{bucket: "sms", secret: []byte("0123456789abcdef0123456789abcdef")}
	due := time.Date(2026, 12, 1, 10, 0, 2, 50_000_000, time.UTC)
	s := PaidSlot{Layer: "per-recipient", Key: "+15550100", Due: due, Booked: due.Add(-2 * time.Second)}
	s.Sig = k.sign(s)
	if !k.verify(s) {
		t.Fatal("the genuine slot fails to verify")
	}
	older := PaidSlot{Layer: s.Layer, Key: s.Key, Due: due} // signed by an older version
	older.Sig = k.sign(older)
	if !k.verify(older) || older.Sig == s.Sig {
		t.Error("a slot without its booking instant fails to verify, or is signed as one with it")
	}
	local := s
	local.Due = due.In(time.FixedZone("x", 3600)) // the same instant
	if !k.verify(local) {
		t.Error("the genuine slot, its Due in another zone, fails to verify")
	}
	for _, tt := range []struct {
		name string
		k    *paidKey
		edit func(*PaidSlot)
	}{
		{"due a nanosecond earlier", k, func(s *PaidSlot) { s.Due = s.Due.Add(-time.Nanosecond) }},
		{"due an hour earlier", k, func(s *PaidSlot) { s.Due = s.Due.Add(-time.Hour) }},
		{"booked later (as if its state were younger)", k, func(s *PaidSlot) { s.Booked = s.Booked.Add(time.Hour) }},
		{"booked dropped", k, func(s *PaidSlot) { s.Booked = time.Time{} }},
		{"another key", k, func(s *PaidSlot) { s.Key = "+15550101" }},
		{"another layer", k, func(s *PaidSlot) { s.Layer = "per-sender" }},
		{"layer and key shifted", k, func(s *PaidSlot) { s.Layer, s.Key = "per-recipient+", "15550100" }},
		{"no signature", k, func(s *PaidSlot) { s.Sig = "" }},
		{"signature not base64", k, func(s *PaidSlot) { s.Sig = "!!" + s.Sig[2:] }},
		{"signature cut short", k, func(s *PaidSlot) { s.Sig = s.Sig[:20] }},
		{"signature altered", k, func(s *PaidSlot) {
			b := []byte(s.Sig)
			b[5] ^= 1
			s.Sig = string(b)
		}},
		{"another bucket", &paidKey{bucket: "push", secret: k.secret}, func(*PaidSlot) {}},
		{"another secret", &paidKey{bucket: "sms", secret: []byte("0123456789abcdef0123456789abcdeF")}, func(*PaidSlot) {}},
		{"no secret", nil, func(*PaidSlot) {}},
	} {
		forged := s
		tt.edit(&forged)
		if tt.k.verify(forged) {
			t.Errorf("%s: %+v verifies", tt.name, forged)
		}
	}
}

// BenchmarkPaidSlot measures what signing a booked slot and verifying a
// returned one cost a WaitN (no store call: the secret is kept).
func BenchmarkPaidSlot(b *testing.B) {
	k := &paidKey{bucket: "sms", secret: randomSecret()}
	s := PaidSlot{Layer: "per-recipient", Key: "+15550100", Due: time.Now()}
	b.Run("sign", func(b *testing.B) {
		for b.Loop() {
			_ = k.sign(s)
		}
	})
	s.Sig = k.sign(s)
	b.Run("verify", func(b *testing.B) {
		for b.Loop() {
			if !k.verify(s) {
				b.Fatal("genuine slot refused")
			}
		}
	})
}
