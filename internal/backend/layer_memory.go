package backend

import (
	"context"
	"fmt"
	"math"
	"time"
)

// LayeredMemory is a LayeredStore in this process: a Memory store for the
// shared bucket plus the state of every layer, decided under one lock with
// the same arithmetic, in the same order, as the Redis layers script, so
// that both pass the same step tests. It is what a Bucket's local fallback
// uses for layers, and what a single replica or a test can use. The shared
// bucket's warm-up (Memory.SetWarmup) ramps layered takes as it ramps plain
// ones.
//
// A key's state is dropped once its bucket is full again or its quota
// window has ended (a missing key means exactly that), so memory grows only
// with the keys in use.
//
// A LayeredMemory is safe for concurrent use.
type LayeredMemory struct {
	*Memory
	layers []Layer
	index  map[string]int
	// Guarded by Memory.mu.
	buckets []map[string]*memLayerBucket
	quotas  []map[string]*memLayerQuota
	ops     int
	// fair is nil without fair shares (fair.go); fc holds each class's
	// tenants, guarded by Memory.mu.
	fair *Fair
	fc   [NumPriorities]memFairClass
	// slots holds each concurrency layer's slots: key → holder → the
	// end of its lease (µs).
	slots []map[string]map[string]int64
	// shadow is the state of the shadow shared bucket
	// (LayerRequest.ShadowShared), nil while full.
	shadow *memLayerBucket
	// created is the instant (µs) of the store's first write, 0 before:
	// every state it holds was made since (PaidHeld). A state dropped when
	// full again held no slot still paid.
	created int64
}

// stampLocked sets m.created to now if the store has written nothing yet.
// m.mu must be held.
func (m *LayeredMemory) stampLocked(now int64) {
	if m.created == 0 {
		m.created = now
	}
}

type memLayerBucket struct {
	tokens float64
	ts     int64 // µs
	// last is the latest instant (µs) a message was charged to go out at
	// on this key, 0 for none: DelayLayersAt refuses to move one back
	// past it.
	last int64
}

// lastOf returns b's last send instant, 0 for a missing state.
func lastOf(b *memLayerBucket) int64 {
	if b == nil {
		return 0
	}
	return b.last
}

type memLayerQuota struct {
	end  int64 // µs: the end of the window counted
	used int64 // tokens, or micro-units of a budget
}

// NewLayeredMemory returns a LayeredStore that decides shared (the shared
// bucket) and layers together. shared must not be used on its own
// afterwards except through the returned store. The layers are validated
// (see ValidateLayers) and copied.
func NewLayeredMemory(shared *Memory, layers []Layer) (*LayeredMemory, error) {
	if shared == nil {
		return nil, &ParamError{Param: "shared", Msg: "must not be nil"}
	}
	layers = append([]Layer(nil), layers...)
	if err := ValidateLayers(layers); err != nil {
		return nil, err
	}
	m := &LayeredMemory{Memory: shared, layers: layers, index: map[string]int{}}
	m.buckets = make([]map[string]*memLayerBucket, len(layers))
	m.quotas = make([]map[string]*memLayerQuota, len(layers))
	m.slots = make([]map[string]map[string]int64, len(layers))
	for i, l := range layers {
		m.index[l.Name] = i
		switch {
		case l.IsConcurrency():
			m.slots[i] = map[string]map[string]int64{}
		case l.counted():
			m.quotas[i] = map[string]*memLayerQuota{}
		case l.IsBucket():
			m.buckets[i] = map[string]*memLayerBucket{}
		}
	}
	return m, nil
}

// Layers implements LayeredStore.
func (m *LayeredMemory) Layers() []Layer { return append([]Layer(nil), m.layers...) }

// TakeLayers implements LayeredStore.
func (m *LayeredMemory) TakeLayers(_ context.Context, req LayerRequest) (LayerResult, error) {
	return m.TakeLayersAt(m.now(), req)
}

// RefundLayers implements LayeredStore.
func (m *LayeredMemory) RefundLayers(_ context.Context, req LayerRequest, res LayerResult) error {
	return m.RefundLayersAt(m.now(), req, res)
}

// LayerKeys returns the key of each layer for req, in the order of the
// layers: "" for a layer that is not keyed. It returns an error wrapping
// ErrMissingKey, naming the layer, for a keyed layer without a key.
func LayerKeys(layers []Layer, req LayerRequest) ([]string, error) {
	keys := make([]string, len(layers))
	for i, l := range layers {
		if !l.Keyed {
			continue
		}
		k := req.Keys[l.Name]
		if k == "" {
			return nil, fmt.Errorf("layer %q: %w", l.Name, ErrMissingKey)
		}
		keys[i] = k
	}
	return keys, nil
}

// advanceLayer refills a layer bucket's state up to now, like
// Memory.advance without a pause.
func advanceLayer(b *memLayerBucket, now int64, l Layer) (tokens float64, ts int64) {
	if b == nil {
		return float64(l.Burst), now
	}
	tokens, ts = b.tokens, b.ts
	if now > ts {
		tokens += float64(now-ts) * l.Rate / 1e6
		ts = now
	}
	return math.Min(tokens, float64(l.Burst)), ts
}

// sendCharge returns a layer bucket's tokens, as of ts, after a request of
// cost that goes out at send (µs, at or after ts) took from it: the tokens
// it holds at send, never more than its burst, less the cost, or for a
// layer passed on a paid slot less the excess of a late slot
// (PaidCharge). Charging at send rather than at the decision matters when
// the request waits: the refill the bucket would have had beyond its burst
// before send is not there to be spent again, so the next request of the
// key goes out no closer than the layer's spacing after this one.
func sendCharge(tokens float64, ts, send int64, cost float64, paid bool, l Layer) float64 {
	ahead := float64(max(send-ts, 0)) * l.Rate / 1e6
	at := math.Min(float64(l.Burst), tokens+ahead)
	charge := cost
	if paid {
		charge = PaidCharge(at, cost, float64(l.Burst))
	}
	return at - charge - ahead
}

// TakeLayersAt is TakeLayers at an explicit instant.
func (m *LayeredMemory) TakeLayersAt(t time.Time, req LayerRequest) (LayerResult, error) {
	if req.Cost < 1 {
		return LayerResult{}, fmt.Errorf("cost %d: %w", req.Cost, ErrInvalidCost)
	}
	keys, err := LayerKeys(m.layers, req)
	if err != nil {
		return LayerResult{}, err
	}
	if req.Holder == "" && HasConcurrency(m.layers) {
		return LayerResult{}, ErrMissingHolder
	}
	res, pushes, err := m.takeLayersAt(t, req, keys)
	if pushes != nil {
		m.announce(pushes)
	}
	return res, err
}

// takeLayersAt is TakeLayersAt under the lock. It returns the pushes to
// announce.
func (m *LayeredMemory) takeLayersAt(t time.Time, req LayerRequest, keys []string) (LayerResult, []Push, error) {
	now := t.UnixMicro()
	cost := float64(req.Cost)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stampLocked(now)
	m.sweep(now)

	var res LayerResult
	res.At = time.UnixMicro(now)
	res.Class = req.Priority
	var (
		sAfter float64 // the shared bucket's real tokens after the take
		sTS    int64
		wait0  int64
		pr     prio // the shared bucket's classes (priority.go)
		c      = Rank(req.Priority)
		pushed float64
		q1     float64
		sh     = req.MinShare.byRank()
		sRate  float64 // the shared bucket's refill rate at now (warmup.go)
		wts    int64   // the shared bucket's ramp start, saved with a grant
	)
	if !req.SkipShared {
		var tokens, visible, need float64
		tokens, sTS, sRate, wts, pr = m.takeLoad(now)
		pushed, visible, q1, need = pr.class(tokens, c, cost, sh, m.burst)
		res.Pushed = pr.p[c]
		res.Rate, res.Burst, res.Remaining = sRate, m.burst, tokens
		if sTS > now {
			res.Rate = 0
		}
		if req.Cost > m.burst {
			return res, nil, fmt.Errorf("cost %d, burst %d: %w", req.Cost, m.burst, ErrCostExceedsBurst)
		}
		if need > 0 {
			res.Floor = true
			res.Wait = time.Duration(min(sTS-now+waitUS(need, sRate), maxWaitUS)) * time.Microsecond
			return res, nil, nil
		}
		sAfter = tokens - cost
		wait0 = sTS - now
		if v := visible - cost; v < 0 {
			wait0 = min(wait0+waitUS(-v, sRate), maxWaitUS)
		}
		wait0 = max(wait0, 0)
	}

	type layerState struct {
		tokens float64 // bucket: after the refill
		ts     int64
		end    int64 // quota, budget: the current window's end
		used   int64
		wait   int64
		paid   bool // bucket: passed on a paid slot
		// never is set for a shadow layer that can never grant the
		// cost (an enforced one fails the request).
		never bool
	}
	// The message goes out when the shared bucket's reservation is due, at
	// send = now + wait0, and every layer is decided and charged at that
	// instant (see sendCharge): a layer that has no room by then makes
	// the request come back when it has, charging nothing.
	send := now + wait0
	st := make([]layerState, len(m.layers))
	paid := PaidLayers(m.layers, keys, req.Paid, time.UnixMicro(send))
	if paid != nil {
		for i, s := range PaidSlots(m.layers, keys, req.Paid) {
			if paid[i] && !PaidHeld(s, lastOf(m.buckets[i][keys[i]]), m.created) {
				paid[i] = false // a slot the layer no longer holds
			}
		}
	}
	for i, l := range m.layers {
		s := &st[i]
		if paid != nil && paid[i] {
			// Paid for: no wait, and only the excess of a late slot.
			s.tokens, s.ts = advanceLayer(m.buckets[i][keys[i]], now, l)
			s.paid = true
			continue
		}
		if l.Shadow && !l.IsWindow() && (l.IsBudget() && req.Price > l.Budget || !l.IsBudget() && req.Cost > max(l.Quota, l.Burst)) {
			s.never = true
			continue
		}
		if l.IsConcurrency() {
			s.wait = slotWait(m.slots[i][keys[i]], req.Holder, now, l)
			continue
		}
		if l.IsWindow() {
			spans, err := WindowSpans(l, keys[i], req.Priority, t)
			if err != nil && !l.Shadow { // a shadow window never refuses: open
				return res, nil, err
			}
			s.wait, _ = WindowWait(spans, send, now) // spans around now always hold send
			continue
		}
		if l.counted() {
			c := l.charge(req)
			if c > l.limit() {
				if l.IsBudget() {
					return res, nil, PriceError(l, req.Price)
				}
				return res, nil, CostError(l, req.Cost)
			}
			_, end := QuotaWindow(l.Per, time.UnixMicro(send), l.Location)
			s.end = end.UnixMicro()
			if q := m.quotas[i][keys[i]]; q != nil && q.end == s.end {
				s.used = q.used
			}
			if s.used+c > l.limit() {
				s.wait = s.end - now
			}
			continue
		}
		if req.Cost > l.Burst {
			return res, nil, CostError(l, req.Cost)
		}
		s.tokens, s.ts = advanceLayer(m.buckets[i][keys[i]], now, l)
		s.wait = s.ts - now
		if after := s.tokens - cost; after < 0 {
			s.wait = min(s.wait+waitUS(-after, l.Rate), maxWaitUS)
		}
		s.wait = max(s.wait, 0)
	}

	// A layer that must not wait this long refuses; a dead_letter layer
	// wins over a delay one, and among delay layers the longest wait.
	refused := -1
	for i, l := range m.layers {
		if l.Shadow || l.OnExceed == ActionWait || st[i].wait <= l.MaxWait.Microseconds() {
			continue
		}
		if l.OnExceed == ActionDeadLetter {
			if refused < 0 || m.layers[refused].OnExceed != ActionDeadLetter {
				refused = i
			}
			continue
		}
		if refused < 0 || (m.layers[refused].OnExceed == ActionDelay && st[i].wait > st[refused].wait) {
			refused = i
		}
	}
	if refused >= 0 {
		l := m.layers[refused]
		w := time.Duration(st[refused].wait) * time.Microsecond
		res.Wait, res.Limiting = w, l.Name
		if !ReservesOnRefusal(l, st[refused].wait) {
			res.Exceeded = ExceededError(l, res.At, w)
			return res, nil, nil
		}
		// A delay layer books the message's slot on itself alone.
		s := &st[refused]
		b := m.buckets[refused][keys[refused]]
		m.buckets[refused][keys[refused]] = &memLayerBucket{tokens: s.tokens - cost, ts: s.ts, last: max(lastOf(b), now+st[refused].wait)}
		res.Exceeded = ReservedError(l, keys[refused], res.At, w)
		return res, nil, nil
	}

	// A layer with no room at send makes the request come back when it
	// has room, the longest such wait; a quota also waits for its next
	// window: neither is reserved ahead. Else a shared wait beyond the
	// horizon comes back when it fits.
	wait, limiting := wait0, -1
	for i, l := range m.layers {
		if !l.Shadow && st[i].wait > wait {
			wait, limiting = st[i].wait, i
		}
	}
	if limiting >= 0 {
		res.Limiting = m.layers[limiting].Name
		res.Wait = time.Duration(wait) * time.Microsecond
		return res, nil, nil
	}
	// Fair shares (fair.go): a request that would queue books only while
	// its tenant holds less than its share of the horizon.
	var ft *memFairTurn
	if m.fair != nil && req.Tenant != "" && !req.SkipShared {
		ft = m.fairTurn(now, c, req.Tenant)
		res.FairActive = m.fc[c].n
		if wait0 > 0 {
			if fw := ft.wait(m.fair, sRate, cost, now); fw > 0 {
				res.Limiting = FairLayer
				res.Wait = time.Duration(fw) * time.Microsecond
				res.FairSpacing = time.Duration(fairSpacing(ft.h, cost, ft.st.last, now)) * time.Microsecond
				return res, nil, nil
			}
		} else {
			ft = nil // granted at once: it holds nothing in the queue
		}
	}
	var horizon int64
	if req.MaxWait > 0 {
		horizon = req.MaxWait.Microseconds()
		if !req.SkipShared {
			horizon = max(horizon, waitUS(cost, sRate))
		}
	}
	if !req.SkipShared && wait > horizon {
		res.Wait = time.Duration(wait-horizon) * time.Microsecond
		return res, nil, nil
	}

	got := req.Cost
	var pushes []Push
	if !req.SkipShared {
		if wait == 0 && req.Extra > 0 && sAfter >= 1 {
			k := min(req.Extra, int(math.Floor(sAfter)))
			sAfter -= float64(k)
			got += k
		}
		moved := pr.grant(c, pushed, q1, sh, m.burst)
		m.store(sAfter, sTS, pr)
		m.wts = wts
		res.Remaining = sAfter
		if moved != 0 && len(m.watchers) > 0 {
			pushes = pr.pushes(moved, pushed, res.At)
		}
	}
	if req.ShadowShared {
		res.Shadow = append(res.Shadow, m.shadowShared(now, send, cost, wait))
	}
	for i, l := range m.layers {
		if l.Shadow {
			d := ShadowDecision{Layer: l.Name, Action: shadowAction(l, st[i].never, st[i].wait, wait)}
			if !st[i].never {
				d.Wait = time.Duration(st[i].wait) * time.Microsecond
			}
			res.Shadow = append(res.Shadow, d)
			if d.Exceeded() {
				continue // charged only when it would have granted
			}
		}
		if l.IsConcurrency() {
			held := m.slots[i][keys[i]]
			if held == nil {
				held = map[string]int64{}
				m.slots[i][keys[i]] = held
			}
			held[req.Holder] = send + l.Lease.Microseconds()
			continue
		}
		if l.IsWindow() {
			continue
		}
		if l.counted() {
			if c := l.charge(req); c > 0 {
				m.quotas[i][keys[i]] = &memLayerQuota{end: st[i].end, used: st[i].used + c}
			}
			continue
		}
		b := m.buckets[i][keys[i]]
		m.buckets[i][keys[i]] = &memLayerBucket{tokens: sendCharge(st[i].tokens, st[i].ts, send, cost, st[i].paid, l), ts: st[i].ts, last: max(lastOf(b), send)}
	}
	if ft != nil {
		m.fairGrant(c, ft, cost, now, send)
		res.FairActive = m.fc[c].n
	}
	res.Granted, res.Tokens = true, got
	res.Wait = time.Duration(wait) * time.Microsecond
	for i, l := range m.layers {
		if !l.Shadow {
			res.LayersDue = max(res.LayersDue, time.Duration(st[i].wait)*time.Microsecond)
		}
	}
	return res, pushes, nil
}

// shadowShared decides the shadow shared bucket (LayerRequest.ShadowShared)
// for a request of cost granted at now to go out wait µs later, at send, as
// a shadow layer with OnExceed wait at the shared bucket's rate and burst,
// and charges it when it would have granted. The Redis layers script
// decides alike. Called with m.mu held.
func (m *LayeredMemory) shadowShared(now, send int64, cost float64, wait int64) ShadowDecision {
	l := Layer{Rate: m.rate, Burst: m.burst, OnExceed: ActionWait}
	if cost > float64(l.Burst) {
		return ShadowDecision{Layer: SharedShadow, Action: shadowAction(l, true, 0, wait)}
	}
	tokens, ts := advanceLayer(m.shadow, now, l)
	lw := ts - now
	if after := tokens - cost; after < 0 {
		lw = min(lw+waitUS(-after, l.Rate), maxWaitUS)
	}
	lw = max(lw, 0)
	d := ShadowDecision{Layer: SharedShadow, Action: shadowAction(l, false, lw, wait), Wait: time.Duration(lw) * time.Microsecond}
	if !d.Exceeded() {
		m.shadow = &memLayerBucket{tokens: sendCharge(tokens, ts, send, cost, false, l), ts: ts, last: max(lastOf(m.shadow), send)}
	}
	return d
}

// shadowAction returns what shadow layer l would have done with a request
// granted to go out wait µs after the decision, the layer having room
// lw µs after it: "" (granted), ActionWait, or its OnExceed when lw is
// above its MaxWait; ActionDeadLetter for a cost it can never grant
// (never). The Redis layers script decides alike (shadow_action).
func shadowAction(l Layer, never bool, lw, wait int64) Action {
	switch {
	case never:
		return ActionDeadLetter
	case l.OnExceed != ActionWait && lw > l.MaxWait.Microseconds():
		return l.OnExceed
	case lw > wait:
		return ActionWait
	}
	return ""
}

// RefundLayersAt is RefundLayers at an explicit instant.
func (m *LayeredMemory) RefundLayersAt(t time.Time, req LayerRequest, res LayerResult) error {
	if !res.Granted || req.Cost < 1 {
		return nil
	}
	keys, err := LayerKeys(m.layers, req)
	if err != nil {
		return err
	}
	now := t.UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stampLocked(now)
	if !req.SkipShared {
		cur, ts, pr := m.refundLoad(now) // along a ramp in progress (warmup.go)
		pr.refund(Rank(res.Class), float64(req.Cost))
		m.store(math.Min(float64(m.burst), cur+float64(req.Cost)), ts, pr)
	}
	send := res.At.Add(res.Wait)                       // when the take charged the layers
	paid := PaidLayers(m.layers, keys, req.Paid, send) // as the take decided
	for i, l := range m.layers {
		if (paid != nil && paid[i]) || l.Shadow || l.IsWindow() {
			continue // not charged by the take, a shadow layer or a window
		}
		if l.IsConcurrency() {
			m.releaseLocked(i, keys[i], req.Holder)
			continue
		}
		if l.counted() {
			_, end := QuotaWindow(l.Per, send, l.Location)
			if q := m.quotas[i][keys[i]]; q != nil && q.end == end.UnixMicro() {
				q.used = max(0, q.used-l.charge(req))
			}
			continue
		}
		b := m.buckets[i][keys[i]]
		tokens, ts := advanceLayer(b, now, l)
		m.buckets[i][keys[i]] = &memLayerBucket{tokens: math.Min(float64(l.Burst), tokens+float64(req.Cost)), ts: ts, last: lastOf(b)}
	}
	return nil
}

// DelayLayers implements LayeredStore.
func (m *LayeredMemory) DelayLayers(_ context.Context, req LayerRequest, res LayerResult, from time.Time, by time.Duration) (bool, error) {
	return m.DelayLayersAt(m.now(), req, res, from, by)
}

// DelayLayersAt is DelayLayers at an explicit instant.
func (m *LayeredMemory) DelayLayersAt(t time.Time, req LayerRequest, res LayerResult, from time.Time, by time.Duration) (bool, error) {
	if !res.Granted || by <= 0 || req.Cost < 1 {
		return true, nil
	}
	keys, err := LayerKeys(m.layers, req)
	if err != nil {
		return false, err
	}
	now, fromUS, toUS := t.UnixMicro(), from.UnixMicro(), from.Add(by).UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stampLocked(now)
	paid := PaidLayers(m.layers, keys, req.Paid, res.At.Add(res.Wait)) // as the take decided
	delayed := func(i int, l Layer) bool { return l.IsBucket() && !l.Shadow && (paid == nil || !paid[i]) }
	charge := make([]float64, len(m.layers))
	for i, l := range m.layers {
		if !delayed(i, l) {
			continue
		}
		b := m.buckets[i][keys[i]]
		tokens, ts := advanceLayer(b, now, l)
		charge[i] = DelayChargeAt(l, req.Cost, by, tokens, time.Duration(toUS-ts)*time.Microsecond)
		if last := lastOf(b); last > fromUS {
			// A message of the key charged for after this one's first
			// instant: the move is possible only if the layer still
			// holds the debit at that message's instant.
			at := math.Min(float64(l.Burst), tokens+float64(max(last-ts, 0))*l.Rate/1e6)
			if at-charge[i] < 0 {
				return false, nil // decide again
			}
		}
	}
	for i, l := range m.layers {
		if !delayed(i, l) {
			continue
		}
		b := m.buckets[i][keys[i]]
		tokens, ts := advanceLayer(b, now, l)
		m.buckets[i][keys[i]] = &memLayerBucket{tokens: tokens - charge[i], ts: ts, last: max(lastOf(b), toUS)}
	}
	return true, nil
}

// ChargeLayers implements LayerCharger.
func (m *LayeredMemory) ChargeLayers(_ context.Context, charges []LayerCharge) error {
	m.ChargeLayersAt(m.now(), charges)
	return nil
}

// ChargeLayersAt is ChargeLayers at an explicit instant.
func (m *LayeredMemory) ChargeLayersAt(t time.Time, charges []LayerCharge) {
	now := t.UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stampLocked(now)
	for _, c := range charges {
		i, ok := m.index[c.Layer]
		if !ok || c.Tokens <= 0 {
			continue
		}
		l := m.layers[i]
		counted, charged := Charged(l)
		if !charged {
			continue
		}
		key := c.Key
		if !l.Keyed {
			key = ""
		}
		if counted {
			start, e := ChargeWindow(l, c.At)
			end := e.UnixMicro()
			if now < start.UnixMicro() || now >= end {
				continue // not the store's current window
			}
			q := m.quotas[i][key]
			if q == nil || q.end != end {
				q = &memLayerQuota{end: end}
				m.quotas[i][key] = q
			}
			q.used += int64(math.Round(c.Tokens))
			continue
		}
		b := m.buckets[i][key]
		tokens, ts := advanceLayer(b, now, l)
		m.buckets[i][key] = &memLayerBucket{tokens: tokens - c.Tokens, ts: ts, last: lastOf(b)}
	}
}

// sweep drops the states that a missing key means anyway: full buckets and
// ended quota windows. It walks every state once per as many calls as there
// are states, so its cost per call stays constant. m.mu must be held.
func (m *LayeredMemory) sweep(now int64) {
	m.ops++
	n := 0
	for i := range m.layers {
		n += len(m.buckets[i]) + len(m.quotas[i]) + len(m.slots[i])
	}
	for r := range m.fc {
		n += len(m.fc[r].tenants)
	}
	if m.ops < max(n, 64) {
		return
	}
	m.ops = 0
	if m.fair != nil {
		m.fairSweep(now)
	}
	for i, l := range m.layers {
		for k, b := range m.buckets[i] {
			if tokens, ts := advanceLayer(b, now, l); ts <= now && tokens >= float64(l.Burst) {
				delete(m.buckets[i], k)
			}
		}
		for k, q := range m.quotas[i] {
			if q.end <= now || q.used == 0 {
				delete(m.quotas[i], k)
			}
		}
		for k, held := range m.slots[i] {
			pruneSlots(held, now)
			if len(held) == 0 {
				delete(m.slots[i], k)
			}
		}
	}
}

// pruneSlots drops the slots whose lease ended at or before now.
func pruneSlots(held map[string]int64, now int64) {
	for h, end := range held {
		if end <= now {
			delete(held, h)
		}
	}
}

// slotWait returns how long a request of holder waits at now for a slot of
// concurrency layer l whose key holds held (µs): 0 when holder holds one
// already or a slot is free, else until the earliest lease ends. It drops
// the ended leases.
func slotWait(held map[string]int64, holder string, now int64, l Layer) int64 {
	pruneSlots(held, now)
	if _, ok := held[holder]; ok || len(held) < l.Concurrency {
		return 0
	}
	earliest := int64(math.MaxInt64)
	for _, end := range held {
		earliest = min(earliest, end)
	}
	return max(earliest-now, 0)
}

// ReleaseSlots implements SlotStore: it gives back each slot held.
func (m *LayeredMemory) ReleaseSlots(_ context.Context, slots []SlotRelease) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range slots {
		if i, ok := m.index[s.Layer]; ok && m.layers[i].IsConcurrency() {
			m.releaseLocked(i, s.Key, s.Holder)
		}
	}
	return nil
}

// releaseLocked gives back holder's slot of key on concurrency layer i.
// m.mu must be held.
func (m *LayeredMemory) releaseLocked(i int, key, holder string) {
	held := m.slots[i][key]
	delete(held, holder)
	if len(held) == 0 {
		delete(m.slots[i], key)
	}
}

func (m *LayeredMemory) layer(name string) (int, error) {
	i, ok := m.index[name]
	if !ok {
		return 0, &ParamError{Param: "Layer", Msg: "no such layer", Value: name}
	}
	return i, nil
}

// LayerStatus returns the state of one key of a layer ("" for a layer that
// is not keyed).
func (m *LayeredMemory) LayerStatus(_ context.Context, layer, key string) (LayerState, error) {
	return m.LayerStatusAt(m.now(), layer, key)
}

// LayerStatusAt is LayerStatus at an explicit instant.
func (m *LayeredMemory) LayerStatusAt(t time.Time, layer, key string) (LayerState, error) {
	i, err := m.layer(layer)
	if err != nil {
		return LayerState{}, err
	}
	l := m.layers[i]
	now := t.UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	st := LayerState{Layer: layer, Key: key, At: time.UnixMicro(now)}
	if l.IsConcurrency() {
		held := m.slots[i][key]
		pruneSlots(held, now)
		st.Used = len(held)
		st.Full = st.Used == 0
		return st, nil
	}
	if l.IsWindow() {
		spans, err := WindowSpans(l, key, PriorityNormal, t)
		if err != nil {
			return st, err
		}
		st.Open, st.Full = WindowState(spans, now)
		return st, nil
	}
	if l.counted() {
		_, end := QuotaWindow(l.Per, t, l.Location)
		st.WindowEnd = end
		if q := m.quotas[i][key]; q != nil && q.end == end.UnixMicro() {
			st.setUsed(l, q.used)
		}
		st.Full = st.Used == 0 && st.Spent == 0
		return st, nil
	}
	b := m.buckets[i][key]
	st.Tokens, _ = advanceLayer(b, now, l)
	st.Full = st.Tokens >= float64(l.Burst)
	return st, nil
}

// ResetLayer forgets the state of one key of a layer: a full bucket, an
// unused quota.
func (m *LayeredMemory) ResetLayer(_ context.Context, layer, key string) error {
	i, err := m.layer(layer)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.buckets[i], key)
	delete(m.quotas[i], key)
	delete(m.slots[i], key)
	return nil
}

// LayerKeyCount returns the number of keys of a layer that hold state. It
// may count keys whose state has just become the same as none.
func (m *LayeredMemory) LayerKeyCount(_ context.Context, layer string) (int, error) {
	i, err := m.layer(layer)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.buckets[i]) + len(m.quotas[i]) + len(m.slots[i]), nil
}

var (
	_ LayeredStore = (*LayeredMemory)(nil)
	_ SlotStore    = (*LayeredMemory)(nil)
)
