package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// localSends remembers what a Bucket's local fallback granted on each key
// of the store's token-bucket layers, so that the store is charged with it
// when it is back (Bucket.chargeLocalSends). The store never saw those
// sends: without the charge, a key sent locally could go again through the
// store at once, within its spacing, as if the burst of every key touched
// during the outage were given twice.
//
// Each key holds what the layer's bucket would owe for this replica's
// sends alone, at the layer's full rate: the debt at the last send, less
// the refill since, never below zero. A key whose debt has refilled is
// forgotten.
type localSends struct {
	mu   sync.Mutex
	keys map[localSendKey]localDebt
	// swept is the size of keys after its last sweep.
	swept int
}

type localSendKey struct {
	layer string
	key   string
}

type localDebt struct {
	tokens float64
	at     time.Time
	rate   float64
}

// owed returns d's debt at now.
func (d localDebt) owed(now time.Time) float64 {
	return max(0, d.tokens-d.rate*now.Sub(d.at).Seconds())
}

// record adds a local send of cost at now on every token-bucket layer of
// layers, each at the key keys gives it ("" for a layer without keys).
func (s *localSends) record(now time.Time, layers []Layer, keys map[string]string, cost int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range layers {
		if !l.IsBucket() || l.Shadow || l.Rate <= 0 {
			continue
		}
		k := localSendKey{layer: l.Name}
		if l.Keyed {
			if k.key = keys[l.Name]; k.key == "" {
				continue
			}
		}
		if s.keys == nil {
			s.keys = map[localSendKey]localDebt{}
		}
		s.keys[k] = localDebt{tokens: s.keys[k].owed(now) + float64(cost), at: now, rate: l.Rate}
	}
	if len(s.keys) >= 2*max(s.swept, 512) {
		for k, d := range s.keys {
			if d.owed(now) == 0 {
				delete(s.keys, k)
			}
		}
		s.swept = len(s.keys)
	}
}

// take empties s and returns the debts still owed at now.
func (s *localSends) take(now time.Time) []backend.LayerCharge {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []backend.LayerCharge
	for k, d := range s.keys {
		if t := d.owed(now); t > 0 {
			out = append(out, backend.LayerCharge{Layer: k.layer, Key: k.key, Tokens: t})
		}
	}
	s.keys, s.swept = nil, 0
	return out
}

// giveBack returns charges that the store did not take to s, as owed at
// now, beside what was recorded since.
func (s *localSends) giveBack(now time.Time, charges []backend.LayerCharge, layers []Layer) {
	rates := map[string]float64{}
	for _, l := range layers {
		rates[l.Name] = l.Rate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[localSendKey]localDebt{}
	}
	for _, c := range charges {
		k := localSendKey{layer: c.Layer, key: c.Key}
		s.keys[k] = localDebt{tokens: s.keys[k].owed(now) + c.Tokens, at: now, rate: rates[c.Layer]}
	}
}

// chargeLocalSends charges the store with what the local fallback granted
// on its layers' keys (localSends), when the store can take it
// (backend.LayerCharger); a store that cannot is not charged. On an error
// the debts stay, to be charged on the next probe, and the Bucket stays in
// its fallback.
func (b *Bucket) chargeLocalSends(ctx context.Context) error {
	lf := b.layeredState()
	now := b.clock.Now()
	charges := lf.sends.take(now)
	if len(charges) == 0 {
		return nil
	}
	charger, ok := lf.store.(backend.LayerCharger)
	if !ok {
		return nil
	}
	if err := charger.ChargeLayers(ctx, charges); err != nil {
		lf.sends.giveBack(b.clock.Now(), charges, lf.layers)
		return err
	}
	b.log.Info("charged the bucket store's layers with the keys sent while limiting locally", "keys", len(charges))
	return nil
}
