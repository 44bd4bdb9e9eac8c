package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// localSends remembers what a Bucket's local fallback granted on each key
// of the store's layers, so that the store is charged with it when it is
// back (Bucket.chargeLocalSends). The store never saw those sends: without
// the charge, a key sent locally could go again through the store at once,
// within its spacing, as if the burst of every key touched during the
// outage were given twice, and a quota or budget spent locally could be
// spent once more.
//
// A token bucket's key holds what the layer's bucket would owe for this
// replica's sends alone, at the layer's full rate: the debt at the last
// send, less the refill since, never below zero. A quota's or budget's
// key holds what was used in its current window, until the window ends.
// A key that owes nothing is forgotten.
type localSends struct {
	mu   sync.Mutex
	keys map[localSendKey]localDebt
	// swept is the size of keys after its last sweep.
	swept int
}

type localSendKey struct {
	layer string
	key   string
	end   time.Time // a quota's or budget's window end; zero for a bucket
}

type localDebt struct {
	tokens float64
	at     time.Time // the last send
	rate   float64   // a bucket's refill; 0 for a quota or budget
}

// owed returns d's debt at now, for a key that ends (a window) at end.
func (d localDebt) owed(now, end time.Time) float64 {
	if !end.IsZero() {
		if !now.Before(end) {
			return 0
		}
		return d.tokens
	}
	return max(0, d.tokens-d.rate*now.Sub(d.at).Seconds())
}

// record adds a local send of cost tokens and price at now on every layer
// of layers that keeps a count (token buckets, quotas, budgets; not a
// shadow), each at the key keys gives it ("" for a layer without keys).
func (s *localSends) record(now time.Time, layers []Layer, keys map[string]string, cost int, price Amount) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range layers {
		if l.Shadow {
			continue
		}
		k := localSendKey{layer: l.Name}
		add, rate := float64(cost), 0.0
		switch {
		case l.IsBudget():
			add = float64(price)
		case l.IsQuota():
		case l.IsBucket() && l.Rate > 0:
			rate = l.Rate
		default:
			continue
		}
		if add <= 0 {
			continue
		}
		if rate == 0 {
			k.end = backend.QuotaWindows(l.Per, now, l.Location)[2]
		}
		if l.Keyed {
			if k.key = keys[l.Name]; k.key == "" {
				continue
			}
		}
		if s.keys == nil {
			s.keys = map[localSendKey]localDebt{}
		}
		s.keys[k] = localDebt{tokens: s.keys[k].owed(now, k.end) + add, at: now, rate: rate}
	}
	if len(s.keys) >= 2*max(s.swept, 512) {
		for k, d := range s.keys {
			if d.owed(now, k.end) == 0 {
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
		if t := d.owed(now, k.end); t > 0 {
			out = append(out, backend.LayerCharge{Layer: k.layer, Key: k.key, Tokens: t, At: d.at})
		}
	}
	s.keys, s.swept = nil, 0
	return out
}

// giveBack returns charges that the store did not take to s, as owed at
// now, beside what was recorded since.
func (s *localSends) giveBack(now time.Time, charges []backend.LayerCharge, layers []Layer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[localSendKey]localDebt{}
	}
	for _, c := range charges {
		k := localSendKey{layer: c.Layer, key: c.Key}
		for _, l := range layers {
			if l.Name != c.Layer {
				continue
			}
			if l.IsBucket() {
				s.keys[k] = localDebt{tokens: s.keys[k].owed(now, k.end) + c.Tokens, at: now, rate: l.Rate}
				continue
			}
			k.end = backend.QuotaWindows(l.Per, c.At, l.Location)[2]
			s.keys[k] = localDebt{tokens: s.keys[k].owed(now, k.end) + c.Tokens, at: c.At}
		}
	}
}

// chargeChunk is how many charges one ChargeLayers call of
// chargeLocalSends carries, each with its own deadline: the time a charge
// takes grows with the keys an outage touched (about 170 ms for 20,000
// on one Redis), and one deadline for all of them could fail every probe
// after a long outage.
const chargeChunk = 4096

// chargeLocalSends charges the store with what the local fallback granted
// on its layers' keys (localSends), when the store can take it
// (backend.LayerCharger); a store that cannot is not charged. It sends
// chargeChunk charges at a time, each batch given timeout. On an error the
// debts not yet charged stay, to be charged on the next probe, and the
// Bucket stays in its fallback.
func (b *Bucket) chargeLocalSends(timeout time.Duration) error {
	lf := b.layeredState()
	charges := lf.sends.take(b.clock.Now())
	if len(charges) == 0 {
		return nil
	}
	charger, ok := lf.store.(backend.LayerCharger)
	if !ok {
		return nil
	}
	for i := 0; i < len(charges); i += chargeChunk {
		batch := charges[i:min(i+chargeChunk, len(charges))]
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := charger.ChargeLayers(ctx, batch)
		cancel()
		if err != nil {
			lf.sends.giveBack(b.clock.Now(), charges[i:], lf.layers)
			return err
		}
	}
	b.log.Info("charged the bucket store's layers with the keys sent while limiting locally", "keys", len(charges))
	return nil
}
