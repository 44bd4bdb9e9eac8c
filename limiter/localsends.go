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
// of layers that a store charges (backend.Charged: token buckets, quotas,
// budgets), each at the key keys gives it ("" for a layer without keys).
func (s *localSends) record(now time.Time, layers []Layer, keys map[string]string, cost int, price Amount) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range layers {
		counted, charged := backend.Charged(l)
		if !charged {
			continue
		}
		k := localSendKey{layer: l.Name}
		add, rate := float64(cost), l.Rate
		if counted {
			if l.IsBudget() {
				add = float64(price)
			}
			_, k.end = backend.ChargeWindow(l, now)
			rate = 0
		}
		if l.Keyed {
			if k.key = keys[l.Name]; k.key == "" {
				continue
			}
		}
		if add > 0 {
			s.addLocked(k, localDebt{tokens: add, at: now, rate: rate}, now)
		}
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

// addLocked adds d to what key k owes at now; s.mu is held.
func (s *localSends) addLocked(k localSendKey, d localDebt, now time.Time) {
	if s.keys == nil {
		s.keys = map[localSendKey]localDebt{}
	}
	d.tokens += s.keys[k].owed(now, k.end)
	s.keys[k] = d
}

// localOwed is a key's debt as take found it.
type localOwed struct {
	key  localSendKey
	debt localDebt
}

// take empties s and returns what each key owes at now, as of now.
func (s *localSends) take(now time.Time) []localOwed {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []localOwed
	for k, d := range s.keys {
		if t := d.owed(now, k.end); t > 0 {
			out = append(out, localOwed{key: k, debt: localDebt{tokens: t, at: now, rate: d.rate}})
		}
	}
	s.keys, s.swept = nil, 0
	return out
}

// giveBack returns to s what take returned at taken and the store did not
// take, beside what was recorded since.
func (s *localSends) giveBack(taken time.Time, owed []localOwed) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range owed {
		s.addLocked(o.key, o.debt, taken)
	}
}

// chargeChunk is how many charges one ChargeLayers call of
// chargeLocalSends carries, each with its own deadline (chargeTimeout): the
// time a charge takes grows with the keys an outage touched (156 to 188 ms
// for 20,000 on one Redis), and one deadline for all of them could fail
// every probe after a long outage.
const chargeChunk = 4096

// chargeTimeout is how long a chunk of chargeLocalSends may take: the
// probe interval, at least 5 s.
func (b *Bucket) chargeTimeout() time.Duration { return max(b.opts.ProbeInterval, 5*time.Second) }

// chargeLocalSends charges the store with what the local fallback granted
// on its layers' keys (localSends), when the store can take it
// (backend.LayerCharger); a store that cannot is not charged. It sends
// chargeChunk charges at a time. On an error the debts not yet charged
// stay, to be charged on the next probe, and the Bucket stays in its
// fallback.
func (b *Bucket) chargeLocalSends() error {
	lf := b.layeredState()
	taken := b.clock.Now()
	owed := lf.sends.take(taken)
	if len(owed) == 0 {
		return nil
	}
	charger, ok := lf.store.(backend.LayerCharger)
	if !ok {
		return nil
	}
	charges := make([]backend.LayerCharge, len(owed))
	for i, o := range owed {
		charges[i] = backend.LayerCharge{Layer: o.key.layer, Key: o.key.key, Tokens: o.debt.tokens, At: o.debt.at}
	}
	for i := 0; i < len(charges); i += chargeChunk {
		ctx, cancel := context.WithTimeout(context.Background(), b.chargeTimeout())
		err := charger.ChargeLayers(ctx, charges[i:min(i+chargeChunk, len(charges))])
		cancel()
		if err != nil {
			lf.sends.giveBack(taken, owed[i:])
			return err
		}
	}
	b.log.Info("charged the bucket store's layers with the keys sent while limiting locally", "keys", len(charges))
	return nil
}
