package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// simMessage is a message of the campaign sim: its keys and class, and the
// slots it holds from an earlier set-aside.
type simMessage struct {
	id    int
	keys  map[string]string
	class limiter.Priority
	paid  []limiter.PaidSlot
	back  time.Duration // set aside until then
}

// campaignSim is the fault campaign's mix (docs/campaign.md) in one
// process at fixed instants: Buckets on one watched LayeredMemory, workers
// that handle messages as the consumer does (a delay layer's refusal sets
// the message aside with its paid slots, a message back early waits for
// its slot), priority classes with a floor, and the rate set and cleared.
type campaignSim struct {
	t       *testing.T
	clk     *clocktest.Clock
	store   *watchedLayered
	buckets []*limiter.Bucket
	active  atomic.Int64

	mu        sync.Mutex
	ready     []*simMessage
	aside     []*simMessage
	total     int
	finished  int
	sends     []fleetSend
	setAsides int
}

func (c *campaignSim) now() time.Duration { return c.clk.Now().Sub(storetest.Base) }

// next returns the next message to handle, the set-aside ones that are
// back first, or nil.
func (c *campaignSim) next() *simMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	kept := c.aside[:0]
	for _, m := range c.aside {
		if m.back <= now {
			c.ready = append(c.ready, m)
		} else {
			kept = append(kept, m)
		}
	}
	c.aside = kept
	if len(c.ready) == 0 {
		return nil
	}
	m := c.ready[0]
	c.ready = c.ready[1:]
	return m
}

func (c *campaignSim) setAside(m *simMessage, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m.back = c.now() + d
	c.aside = append(c.aside, m)
	c.setAsides++
}

// idle returns how long a worker with nothing to do sleeps: until the
// first message set aside is back, at most 10 ms (a message published
// meanwhile waits that long at most).
func (c *campaignSim) idle() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := 10 * time.Millisecond
	for _, m := range c.aside {
		d = min(d, m.back-c.now())
	}
	return max(d, time.Millisecond)
}

func (c *campaignSim) done() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.finished == c.total
}

// sleep sleeps d on the fake clock.
func (c *campaignSim) sleep(d time.Duration) {
	t := c.clk.NewTimer(d)
	<-t.C()
}

func (c *campaignSim) worker(b *limiter.Bucket, ri int) {
	defer c.active.Add(-1)
	for !c.done() {
		m := c.next()
		if m == nil {
			c.sleep(c.idle())
			continue
		}
		// A message back before its latest slot: set aside again, or,
		// within 100 ms of it, waits for it (consumer.awaitPaidSlots).
		var due time.Time
		for _, s := range m.paid {
			if s.Due.After(due) {
				due = s.Due
			}
		}
		if early := due.Sub(c.clk.Now()); early > 100*time.Millisecond {
			c.setAside(m, early)
			continue
		} else if early > 0 {
			c.sleep(early)
		}
		err := b.WaitN(context.Background(), limiter.Request{Cost: 1, Keys: m.keys, Priority: m.class, Paid: m.paid})
		var le *limiter.LimitError
		switch {
		case err == nil:
			rec := map[string]string{"id": fmt.Sprint(m.id), "class": m.class.String(), "paid": fmt.Sprint(len(m.paid)), "replica": fmt.Sprint(ri)}
			for k, v := range m.keys {
				rec[k] = v
			}
			c.mu.Lock()
			c.sends = append(c.sends, fleetSend{c.now(), rec})
			c.finished++
			c.mu.Unlock()
		case errors.As(err, &le) && le.Action == limiter.ActionDelay:
			// consumer.paidHeaders: the slots of other layers, and the
			// refusing layer's own when it booked one.
			var paid []limiter.PaidSlot
			for _, s := range m.paid {
				if s.Layer != le.Layer {
					paid = append(paid, s)
				}
			}
			if le.Reserved {
				paid = append(paid, le.Slot())
			}
			m.paid = paid
			c.setAside(m, le.Wait)
		default:
			c.t.Errorf("message %d: %v", m.id, err)
			c.mu.Lock()
			c.finished++
			c.mu.Unlock()
		}
	}
}

// settle waits until every worker sleeps on a timer or in line behind its
// class's head.
func (c *campaignSim) settle() {
	c.t.Helper()
	asleep := func() bool {
		queued := 0
		for _, b := range c.buckets {
			queued += limiter.FloorQueued(b)
		}
		return c.clk.Timers() == int(c.active.Load())-queued
	}
	// Polled finely: a schedule takes tens of thousands of steps.
	for deadline := time.Now().Add(10 * time.Second); !asleep(); time.Sleep(20 * time.Microsecond) {
		if time.Now().After(deadline) {
			c.t.Fatalf("at +%v: %d timers, %d workers", c.now(), c.clk.Timers(), c.active.Load())
		}
	}
}

// closest returns layer's closest pair of sends over every key: its key,
// gap, and when the first went out.
func (c *campaignSim) closest(layer string) (key string, gap, at time.Duration) {
	gap = time.Hour
	for k, p := range closestPairs(c.sends, layer) {
		if p[0] < gap {
			key, gap, at = k, p[0], p[1]
		}
	}
	return key, gap, at
}

// TestCampaignSim runs the campaign's mix at fixed instants on seeded
// schedules: 3 replicas, the shared bucket at 20/s burst 5, a per-sender
// layer (5/s, burst 1, wait) and a per-recipient one (30/min, burst 1,
// delay), a tenth of the messages high and three tenths low under a floor
// of 10% for low, and the rate cut, raised and cleared every few seconds.
// With slow, each leg of a store call takes 1 to 40 ms, now and then 100
// to 300 ms. No key's pair may come closer than its layer's spacing less
// what a reservation or a paid slot may go out late, 10% of it and 25 ms
// at least (docs/operations.md, "Layers, as the sink sees them").
func TestCampaignSim(t *testing.T) {
	seeds, publishFor := uint64(2), 8*time.Second
	if n, err := strconv.ParseUint(os.Getenv("THROTTLE_SIM_SEEDS"), 10, 64); err == nil && n > 0 {
		seeds, publishFor = n, 30*time.Second // a longer campaign, by hand
	}
	// Slow store calls put pairs too close, a defect not fixed yet
	// (docs/campaign.md): by hand only, THROTTLE_SIM_SLOW=1.
	slows := []bool{false}
	if os.Getenv("THROTTLE_SIM_SLOW") != "" {
		slows = append(slows, true)
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		for _, slow := range slows {
			t.Run(fmt.Sprintf("%d/slow=%v", seed, slow), func(t *testing.T) {
				t.Parallel()
				runCampaignSim(t, seed, slow, publishFor)
			})
		}
	}
}

func runCampaignSim(t *testing.T, seed uint64, slow bool, publishFor time.Duration) {
	rng := rand.New(rand.NewPCG(seed, 1))
	clk := clocktest.New(storetest.Base)
	lc := newLayeredClocked(t, clk, 20, 5, 3,
		limiter.Layer{Name: "per-sender", Keyed: true, Rate: 5, Burst: 1, OnExceed: limiter.ActionWait},
		limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 0.5, Burst: 1, OnExceed: limiter.ActionDelay})
	c := &campaignSim{t: t, clk: clk, store: &watchedLayered{layeredClocked: lc}}
	var traceMu sync.Mutex
	var traced []string
	c.store.trace = func(line string) {
		traceMu.Lock()
		traced = append(traced, line)
		traceMu.Unlock()
	}
	if slow {
		// Each way 1 to 40 ms, now and then 100 to 300 ms.
		var mu sync.Mutex
		trips := rand.New(rand.NewPCG(seed, 2))
		leg := func() time.Duration {
			if trips.IntN(50) == 0 {
				return time.Duration(100+trips.IntN(200)) * time.Millisecond
			}
			return time.Duration(1+trips.IntN(40)) * time.Millisecond
		}
		c.store.trip = func() (time.Duration, time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			return leg(), leg()
		}
	}
	var shares limiter.Shares
	shares[limiter.PriorityLow] = 0.1
	for range 3 {
		b, err := limiter.New(c.store, limiter.Options{Clock: clk, Lease: limiter.LeaseOptions{Disabled: true}, Logger: discardLogger(),
			ProbeInterval: time.Hour, MinShare: shares, MaxReserve: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		c.buckets = append(c.buckets, b)
	}
	testenv.Eventually(t, 10*time.Second, "the Buckets watching the store", func() bool { return c.store.watching.Load() == 3 })
	publish := func(n int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for range n {
			m := &simMessage{id: c.total, keys: map[string]string{
				"per-sender":    fmt.Sprintf("s%d", rng.IntN(5)),
				"per-recipient": fmt.Sprintf("r%d", rng.IntN(60)),
			}, class: limiter.PriorityNormal}
			switch x := rng.IntN(10); {
			case x == 0:
				m.class = limiter.PriorityHigh
			case x <= 3:
				m.class = limiter.PriorityLow
			}
			c.ready = append(c.ready, m)
			c.total++
		}
	}
	publish(40)
	for i, b := range c.buckets {
		for range 4 {
			c.active.Add(1)
			go c.worker(b, i)
		}
	}
	c.settle()
	rates := []float64{6, 10, 14, 20, 40}
	nextChange := time.Duration(1000+rng.IntN(3000)) * time.Millisecond
	nextPublish := time.Second
	for c.active.Load() > 0 {
		now := c.now()
		if now >= nextPublish && now <= publishFor {
			publish(10 + rng.IntN(20))
			nextPublish += time.Second
		}
		if now >= nextChange && now <= publishFor {
			if err := c.store.m.SetRateAt(clk.Now(), rates[rng.IntN(len(rates))], 5); err != nil {
				t.Fatal(err)
			}
			c.settle()
			nextChange += time.Duration(1000+rng.IntN(3000)) * time.Millisecond
		}
		// On to the next instant anything happens at.
		to := now + time.Second
		if at, ok := clk.Next(); ok {
			to = at.Sub(storetest.Base)
		}
		if now < publishFor {
			to = min(to, nextPublish, nextChange)
		}
		clk.Advance(max(to-now, 0))
		c.settle()
		if now > 10*time.Minute {
			t.Fatalf("%d workers still running after 10 min", c.active.Load())
		}
	}
	t.Logf("%d messages, %d sent, %d set aside, last at +%v", c.total, len(c.sends), c.setAsides, c.sends[len(c.sends)-1].at)
	for _, l := range []struct {
		name    string
		spacing time.Duration
	}{{"per-sender", 200 * time.Millisecond}, {"per-recipient", 2 * time.Second}} {
		// A reservation or a paid slot goes out at most 10% of the
		// spacing late, 25 ms at least (backend.PaidLateness).
		want := l.spacing - max(l.spacing/10, 25*time.Millisecond)
		k, d, at := c.closest(l.name)
		t.Logf("%s: closest pair %v apart, key %s at +%v", l.name, d, k, at)
		if d < want-time.Millisecond {
			t.Errorf("%s: key %s's pair at +%v only %v apart, want at least %v", l.name, k, at, d, want)
			for _, s := range c.sends {
				if s.keys[l.name] == k && s.at > at-2*time.Second && s.at < at+2*time.Second {
					t.Logf("  +%v %v", s.at, s.keys)
				}
			}
			for _, line := range traced {
				if strings.Contains(line, l.name+":"+k+" ") || strings.Contains(line, l.name+":"+k+"]") {
					t.Log(line)
				}
			}
		}
	}
}
