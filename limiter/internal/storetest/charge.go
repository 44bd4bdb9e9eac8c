package storetest

import (
	"math"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// ChargeClockedStore is a layered store that takes charges
// (backend.LayerCharger) at explicit instants.
type ChargeClockedStore interface {
	LayeredClockedStore
	ChargeLayersAt(now time.Time, charges []backend.LayerCharge) error
}

// ChargeFactory returns a new store as LayeredFactory does.
type ChargeFactory func(t *testing.T, rate float64, burst int, layers []limiter.Layer) ChargeClockedStore

// RunChargeLayers checks ChargeLayers: a charge takes its tokens from its
// key's token bucket as of now, below zero if need be, or adds them to its
// quota's or budget's use in the window holding its At while that window
// lasts; charges of one key add up, a layer without keys is charged
// whatever the key, and a charge of an ended window, a shadow layer or no
// layer changes nothing.
func RunChargeLayers(t *testing.T, newStore ChargeFactory) {
	layers := []limiter.Layer{
		{Name: "per-key", Keyed: true, Rate: 1, Burst: 2, OnExceed: limiter.ActionDeadLetter},
		{Name: "account", Rate: 10, Burst: 5},
		{Name: "daily", Quota: 100, Per: limiter.PerDay},
		{Name: "spend", Keyed: true, Budget: 1_000_000, Per: limiter.PerDay},
		{Name: "watch", Keyed: true, Rate: 1, Burst: 1, Shadow: true},
	}
	s := newStore(t, 100, 10, layers)
	keys := map[string]string{"per-key": "a", "watch": "a", "spend": "acme"}
	if _, err := s.TakeLayersAt(Base, backend.LayerRequest{Cost: 1, Keys: keys}); err != nil {
		t.Fatal(err)
	}
	err := s.ChargeLayersAt(Base.Add(100*time.Millisecond), []backend.LayerCharge{
		{Layer: "per-key", Key: "a", Tokens: 1.5},
		{Layer: "per-key", Key: "a", Tokens: 0.5},
		{Layer: "per-key", Key: "b", Tokens: 1},
		{Layer: "account", Key: "ignored", Tokens: 3},
		{Layer: "daily", Tokens: 5, At: Base},
		{Layer: "daily", Tokens: 7, At: Base.Add(-24 * time.Hour)}, // yesterday's: ended
		{Layer: "spend", Key: "acme", Tokens: 250_000, At: Base},
		{Layer: "spend", Key: "acme", Tokens: 50_000, At: Base},
		{Layer: "watch", Key: "a", Tokens: 1},
		{Layer: "no-such-layer", Key: "a", Tokens: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	at := Base.Add(100 * time.Millisecond)
	for _, w := range []struct {
		layer, key string
		tokens     float64
		used       int
		spent      limiter.Amount
	}{
		{"per-key", "a", 2 - 1 + 0.1 - 2, 0, 0}, // refilled to 1.1 (of 2) when charged 2
		{"per-key", "b", 1, 0, 0},
		{"per-key", "c", 2, 0, 0},
		{"account", "", 5 - 3, 0, 0}, // full again when charged
		{"daily", "", 0, 1 + 5, 0},   // the take's, and today's charge
		{"spend", "acme", 0, 0, 300_000},
		{"spend", "other", 0, 0, 0},
		{"watch", "a", 0.1, 0, 0}, // as the take left it
	} {
		st, err := s.LayerStatusAt(at, w.layer, w.key)
		if err != nil {
			t.Fatalf("%s %q: %v", w.layer, w.key, err)
		}
		if math.Abs(st.Tokens-w.tokens) > 0.002 || st.Used != w.used || st.Spent != w.spent {
			t.Errorf("%s %q after the charges: tokens %v, used %d, spent %d; want %v, %d, %d", w.layer, w.key, st.Tokens, st.Used, st.Spent, w.tokens, w.used, w.spent)
		}
	}
	// A charged key refills at its rate from there: a takes its next
	// token 0.9 s later, not before.
	res, err := s.TakeLayersAt(at.Add(800*time.Millisecond), backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": "a", "watch": "x", "spend": "acme"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Exceeded == nil || res.Exceeded.Layer != "per-key" {
		t.Errorf("take of a 0.8 s after the charge: %+v, want refused by per-key (it holds -0.1)", res)
	}
	res, err = s.TakeLayersAt(at.Add(1900*time.Millisecond), backend.LayerRequest{Cost: 1, Keys: map[string]string{"per-key": "a", "watch": "x", "spend": "acme"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Granted || res.Exceeded != nil {
		t.Errorf("take of a 1.9 s after the charge: %+v, want granted (it holds 1)", res)
	}
}
