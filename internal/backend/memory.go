package backend

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Memory is a Store that keeps one bucket in this process. It implements the
// same algorithm as the Redis store's script, in the same microsecond units
// and the same order of operations, so the two pass the same step tests. Use
// it for a single replica, in tests, and as the local fallback while Redis is
// down.
//
// A Memory store is safe for concurrent use.
type Memory struct {
	mu       sync.Mutex
	watchers map[*watcher]struct{}
	now      func() time.Time
	rate     float64
	burst    int
	tokens   float64
	ts       int64 // µs; the bucket is paused while ts is after now
	init     bool
	pausedBy string        // who set the pause ending at ts
	changed  int64         // µs: the last change of settings (State.Changed), 0 for none
	ad       adaptiveCurve // adaptive.go: the adaptive rate, when on
	warm     int64         // warmup.go: the warm-up period (µs), 0 = none
	wts      int64         // warmup.go: the start of the last ramp (µs)
	pr       prio          // priority.go: the classes' queues and counters
}

// NewMemory returns a full in-process bucket that refills at rate tokens per
// second up to burst; a burst of 0 means DefaultBurst(rate). It returns a
// *ParamError when rate or burst is out of range (see ValidateRate and
// ValidateBurst).
func NewMemory(rate float64, burst int) (*Memory, error) {
	if err := ValidateRate(rate); err != nil {
		return nil, err
	}
	if burst == 0 {
		burst = DefaultBurst(rate)
	}
	if err := ValidateBurst(burst); err != nil {
		return nil, err
	}
	return &Memory{now: time.Now, rate: rate, burst: burst}, nil
}

// maxWaitUS caps every wait a store computes, in microseconds (about 31
// years), so that no tiny rate or huge debt overflows a time.Duration. The
// Redis scripts cap their replies the same way.
const maxWaitUS = 1e15

// waitUS returns ceil(tokens·1e6/rate) microseconds, capped at maxWaitUS.
func waitUS(tokens, rate float64) int64 {
	return int64(math.Min(math.Ceil(tokens*1e6/rate), maxWaitUS))
}

// Take implements Store.
func (m *Memory) Take(_ context.Context, req TakeRequest) (TakeResult, error) {
	return m.TakeAt(m.now(), req)
}

// Refund implements Store.
func (m *Memory) Refund(_ context.Context, tokens int) error {
	m.RefundAt(m.now(), tokens)
	return nil
}

// RefundPast implements PastRefunder.
func (m *Memory) RefundPast(_ context.Context, tokens int) error {
	m.RefundPastAt(m.now(), tokens)
	return nil
}

// RefundClass implements ClassRefunder.
func (m *Memory) RefundClass(_ context.Context, tokens int, class Priority) error {
	m.RefundClassAt(m.now(), tokens, class)
	return nil
}

// Pause implements Store.
func (m *Memory) Pause(_ context.Context, d time.Duration) error {
	m.PauseAt(m.now(), d)
	m.notify()
	return nil
}

// Status implements Store.
func (m *Memory) Status(_ context.Context) (State, error) {
	return m.StatusAt(m.now()), nil
}

// Watch implements Notifier: changed is called after each SetRate and
// Pause, and pushed (unless nil) for each Push a take announces, until ctx
// ends.
func (m *Memory) Watch(ctx context.Context, changed func(), pushed func(Push)) {
	m.mu.Lock()
	if m.watchers == nil {
		m.watchers = map[*watcher]struct{}{}
	}
	w := &watcher{changed: changed, pushed: pushed}
	m.watchers[w] = struct{}{}
	m.mu.Unlock()
	<-ctx.Done()
	m.mu.Lock()
	delete(m.watchers, w)
	m.mu.Unlock()
}

// watcher is one Watch call's callbacks.
type watcher struct {
	changed func()
	pushed  func(Push)
}

// announce calls the watchers' pushed with each push; m.mu must not be
// held.
func (m *Memory) announce(pushes []Push) {
	m.mu.Lock()
	fns := make([]func(Push), 0, len(m.watchers))
	for w := range m.watchers {
		if w.pushed != nil {
			fns = append(fns, w.pushed)
		}
	}
	m.mu.Unlock()
	for _, f := range fns {
		for _, p := range pushes {
			f(p)
		}
	}
}

// notify calls the watchers' changed; m.mu must not be held.
func (m *Memory) notify() {
	m.mu.Lock()
	fns := make([]func(), 0, len(m.watchers))
	for w := range m.watchers {
		fns = append(fns, w.changed)
	}
	m.mu.Unlock()
	for _, f := range fns {
		f()
	}
}

// Limits implements Store.
func (m *Memory) Limits() (float64, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rate, m.burst
}

// advance returns the tokens and timestamp at now: it refills for the time
// since the last update, unless the bucket is paused until a later instant,
// and never holds more than burst.
func (m *Memory) advance(now int64) (tokens float64, ts int64) {
	if !m.init {
		return float64(m.burst), now
	}
	tokens, ts = m.tokens, m.ts
	if now > ts {
		tokens += m.ad.refill(m.rate, ts, now)
		ts = now
	}
	return math.Min(tokens, float64(m.burst)), ts
}

func (m *Memory) save(tokens float64, ts int64) {
	m.tokens, m.ts, m.init = tokens, ts, true
}

// load is advance with the priority state after the refill, as the Redis
// scripts' load; store saves both. m.mu is held.
func (m *Memory) load(now int64) (tokens float64, ts int64, pr prio) {
	tokens, ts = m.advance(now)
	return tokens, ts, m.loaded(tokens)
}

// loaded returns the priority state after a refill from the stored tokens
// to tokens. m.mu is held.
func (m *Memory) loaded(tokens float64) prio {
	pr := m.pr
	t0 := math.NaN()
	if m.init {
		t0 = m.tokens
	}
	pr.refilled(t0, tokens, m.burst)
	return pr
}

// store saves the tokens, timestamp and priority state. m.mu is held.
func (m *Memory) store(tokens float64, ts int64, pr prio) {
	pr.refilled(math.NaN(), tokens, m.burst)
	m.pr = pr
	m.save(tokens, ts)
}

// TakeAt is Take at an explicit instant, for deterministic tests and
// simulations. An instant earlier than the last one refills nothing.
func (m *Memory) TakeAt(t time.Time, req TakeRequest) (TakeResult, error) {
	if req.Cost < 1 {
		return TakeResult{}, fmt.Errorf("cost %d: %w", req.Cost, ErrInvalidCost)
	}
	res, pushes, err := m.takeAt(t.UnixMicro(), req)
	if pushes != nil {
		m.announce(pushes)
	}
	return res, err
}

// takeAt is TakeAt under the lock. It returns the pushes to announce.
func (m *Memory) takeAt(now int64, req TakeRequest) (TakeResult, []Push, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	tokens, ts, rate, wts := m.takeAdvance(now) // adaptive.go, warmup.go
	pr := m.loaded(tokens)
	// charge is what the take costs the bucket: its cost, plus the refill
	// the bucket loses to its cap before the end of a hold (holdLoss).
	cost := float64(req.Cost)
	charge := cost + holdLoss(tokens, ts, now, req.Hold, rate, m.burst)
	sh := req.MinShare.byRank()
	c := Rank(req.Priority)
	pushed, visible, q1, need := pr.class(tokens, c, charge, sh, m.burst)
	res := TakeResult{Rate: rate, Burst: m.burst, Remaining: tokens, At: time.UnixMicro(now), Class: PriorityOfRank(c), Pushed: pr.p[c]}
	if ts > now {
		res.Rate = 0
	}
	if req.Cost > m.burst {
		return res, nil, fmt.Errorf("cost %d, burst %d: %w", req.Cost, m.burst, ErrCostExceedsBurst)
	}
	if need > 0 {
		res.Floor = true
		res.Wait = time.Duration(min(ts-now+waitUS(need, rate), maxWaitUS)) * time.Microsecond
		return res, nil, nil
	}
	after := visible - charge
	wait := ts - now
	if after < 0 {
		wait = min(wait+waitUS(-after, rate), maxWaitUS)
	}
	got, left := req.Cost, tokens-charge // left: the real tokens after the take
	if wait <= 0 {
		wait = 0
		if req.Extra > 0 && left >= 1 {
			k := min(req.Extra, int(math.Floor(left)))
			left -= float64(k)
			got += k
		}
	} else {
		var horizon int64
		if req.MaxWait > 0 {
			horizon = max(req.MaxWait.Microseconds(), waitUS(cost, rate))
		}
		if wait > horizon {
			res.Wait = time.Duration(wait-horizon) * time.Microsecond
			return res, nil, nil
		}
	}
	moved := pr.grant(c, pushed, q1, sh, m.burst)
	m.store(left, ts, pr)
	m.wts = wts
	res.Granted, res.Tokens, res.Remaining = true, got, left
	res.Wait = time.Duration(wait) * time.Microsecond
	var pushes []Push
	if moved != 0 && len(m.watchers) > 0 {
		pushes = pr.pushes(moved, pushed, res.At)
	}
	return res, pushes, nil
}

// holdLoss returns the refill a bucket holding tokens at ts (µs; the
// refill starts at ts, later than now while paused) loses to its cap of
// burst by the end of a hold from now: charged as of now+hold, a take
// costs the bucket this much more than at now (TakeRequest.Hold). It is
// the send_charge of the Redis scripts (take.lua) for a take at the
// configured rate.
func holdLoss(tokens float64, ts, now int64, hold time.Duration, rate float64, burst int) float64 {
	if hold <= 0 {
		return 0
	}
	ahead := float64(now+hold.Microseconds()-ts) * rate / 1e6
	return max(0, tokens+max(0, ahead)-float64(burst))
}

// RefundAt is Refund at an explicit instant.
func (m *Memory) RefundAt(t time.Time, tokens int) {
	m.RefundClassAt(t, tokens, PriorityHigh)
}

// RefundPastAt is RefundPast at an explicit instant: the tokens go back,
// up to burst, only while no reservation is queued (the bucket holds 0
// tokens or more); else they are dropped.
func (m *Memory) RefundPastAt(t time.Time, tokens int) {
	m.refund(t, tokens, PriorityHigh, true)
}

// RefundClassAt is RefundClass at an explicit instant. A refund of class
// PriorityHigh is a refund of no class: it repays the front of the queue.
func (m *Memory) RefundClassAt(t time.Time, tokens int, class Priority) {
	m.refund(t, tokens, class, false)
}

// refund puts tokens back at t, up to burst, and takes them off class's
// queue; past drops them while a reservation is queued (RefundPastAt), as
// refund.lua does.
func (m *Memory) refund(t time.Time, tokens int, class Priority, past bool) {
	if tokens <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ts, pr := m.refundLoad(t.UnixMicro()) // along a ramp in progress (warmup.go)
	if past && cur < 0 {
		return
	}
	cur = math.Min(float64(m.burst), cur+float64(tokens))
	pr.refund(Rank(class), float64(tokens))
	m.store(cur, ts, pr)
}

// Drain implements Store.
func (m *Memory) Drain(_ context.Context, debt int) error {
	m.DrainAt(m.now(), debt)
	return nil
}

// DrainAt is Drain at an explicit instant.
func (m *Memory) DrainAt(t time.Time, debt int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	tokens, ts, pr := m.load(t.UnixMicro())
	left := math.Min(tokens, -float64(max(debt, 0)))
	pr.drained(tokens, left)
	m.store(left, ts, pr)
}

// PauseBy implements AttributedPauser.
func (m *Memory) PauseBy(_ context.Context, d time.Duration, by string) error {
	m.PauseByAt(m.now(), d, by)
	m.notify()
	return nil
}

// PauseAt is Pause at an explicit instant.
func (m *Memory) PauseAt(t time.Time, d time.Duration) { m.PauseByAt(t, d, "") }

// PauseByAt is PauseBy at an explicit instant.
func (m *Memory) PauseByAt(t time.Time, d time.Duration, by string) {
	if d <= 0 {
		return
	}
	now := t.UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	tokens, ts, pr := m.load(now)
	if until := now + d.Microseconds(); until > ts {
		ts = until
		m.pausedBy = by
	}
	m.store(math.Min(tokens, 0), ts, pr)
	m.changed = now
}

// StatusAt is Status at an explicit instant.
func (m *Memory) StatusAt(t time.Time) State {
	now := t.UnixMicro()
	m.mu.Lock()
	defer m.mu.Unlock()
	tokens, ts, pr := m.load(now)
	st := State{
		Tokens: tokens, Rate: m.ad.rateAt(m.rate, now), BaseRate: m.ad.rateAt(m.rate, now), Burst: m.burst,
		ConfiguredRate: m.rate, ConfiguredBurst: m.burst, Replicas: 1,
		Reserved: pr.reserved(tokens), Pushed: pr.pushed(),
		At: time.UnixMicro(now),
	}
	if m.changed > 0 {
		st.Changed = time.UnixMicro(m.changed)
	}
	if ts > now {
		st.Rate = 0
		st.PausedFor = time.Duration(ts-now) * time.Microsecond
		st.PausedBy = m.pausedBy
	}
	return st
}

// SetRate changes the rate and burst of the bucket, keeping its tokens, and
// tells the watchers. It returns a *ParamError for a value out of range.
func (m *Memory) SetRate(rate float64, burst int) error {
	return m.SetRateAt(m.now(), rate, burst)
}

// SetRateAt is SetRate at an explicit instant.
func (m *Memory) SetRateAt(t time.Time, rate float64, burst int) error {
	if err := ValidateRate(rate); err != nil {
		return err
	}
	if err := ValidateBurst(burst); err != nil {
		return err
	}
	m.mu.Lock()
	m.store(m.load(t.UnixMicro()))
	m.changed = t.UnixMicro()
	m.rate, m.burst = rate, burst
	m.ad = adaptiveCurve{} // an operator's rate starts again from it
	m.mu.Unlock()
	m.notify()
	return nil
}

// SetClock makes m read the time from now instead of time.Now: a Bucket's
// local fallback follows the Bucket's clock. Call it before m is used.
func (m *Memory) SetClock(now func() time.Time) { m.now = now }

// NewEmptyMemory returns a Memory bucket that starts with no tokens and
// refills only from at on, as a Bucket's local fallback does: the shared
// bucket's tokens were spent, and its reservations are served first.
func NewEmptyMemory(rate float64, burst int, now func() time.Time, at time.Time) (*Memory, error) {
	m, err := NewMemory(rate, burst)
	if err != nil {
		return nil, err
	}
	m.now = now
	m.save(0, max(now().UnixMicro(), at.UnixMicro()))
	return m, nil
}
