package rabbitmq

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
)

// TestDelayRoute checks the exchange and routing key a delay is published
// with: the delay in 10 ms units, rounded down, at least one, in binary
// from the lowest bit, to the exchange of its highest bit, and capped at
// what the levels hold.
func TestDelayRoute(t *testing.T) {
	tests := []struct {
		d               time.Duration
		levels          int
		exchange, key   string
		after           time.Duration
		levelsForMaxSet time.Duration
	}{
		{d: 0, levels: 13, exchange: "sms.delay.00", key: "1", after: 10 * time.Millisecond},
		{d: -time.Second, levels: 13, exchange: "sms.delay.00", key: "1", after: 10 * time.Millisecond},
		{d: 19 * time.Millisecond, levels: 13, exchange: "sms.delay.00", key: "1", after: 10 * time.Millisecond},
		{d: 20 * time.Millisecond, levels: 13, exchange: "sms.delay.01", key: "0.1", after: 20 * time.Millisecond},
		{d: 250 * time.Millisecond, levels: 13, exchange: "sms.delay.04", key: "1.0.0.1.1", after: 250 * time.Millisecond},
		{d: 2 * time.Second, levels: 13, exchange: "sms.delay.07", key: "0.0.0.1.0.0.1.1", after: 2 * time.Second},
		// 1 min is 6000 units: 13 bits; the cap of 13 levels is 8191 units.
		{d: time.Minute, levels: 13, exchange: "sms.delay.12", key: "0.0.0.0.1.1.1.0.1.1.1.0.1", after: time.Minute},
		{d: time.Hour, levels: 13, exchange: "sms.delay.12", key: "1.1.1.1.1.1.1.1.1.1.1.1.1", after: 8191 * delayUnit},
	}
	for _, tt := range tests {
		ex, key, after := delayRoute("sms", tt.d, tt.levels)
		if ex != tt.exchange || key != tt.key || after != tt.after {
			t.Errorf("delayRoute(%v, %d levels) = %s, %s, %v; want %s, %s, %v", tt.d, tt.levels, ex, key, after, tt.exchange, tt.key, tt.after)
		}
	}
	for _, tt := range []struct {
		max  time.Duration
		want int
	}{{0, 1}, {time.Millisecond, 1}, {time.Second, 7}, {time.Minute, 13}, {time.Hour, 19}, {365 * 24 * time.Hour, maxDelayLevels}} {
		if got := delayLevels(tt.max); got != tt.want {
			t.Errorf("delayLevels(%v) = %d, want %d", tt.max, got, tt.want)
		}
	}
	for _, tt := range []struct {
		name string
		want bool
	}{{"sms.delay.00", true}, {"sms.delay.27", true}, {"sms.delay.28", false}, {"sms.delay", false},
		{"sms.delay.0", false}, {"sms.delay.a1", false}, {"other.delay.01", false}, {"sms.delay.001", false}} {
		if got := delayLevelOf("sms", tt.name); got != tt.want {
			t.Errorf("delayLevelOf(sms, %q) = %v, want %v", tt.name, got, tt.want)
		}
	}
	for n, want := range []string{"1.#", "*.1.#", "*.*.1.#"} {
		if got := levelPattern(n, '1'); got != want {
			t.Errorf("levelPattern(%d, 1) = %q, want %q", n, got, want)
		}
	}
}

// TestDropDelayDeaths: a copy set aside again keeps the x-death entries
// of other queues and loses those of its delay queues, which would make
// RabbitMQ drop it as a dead-letter cycle.
func TestDropDelayDeaths(t *testing.T) {
	other := amqp.Table{"queue": "sms", "reason": "rejected"}
	h := amqp.Table{"x-death": []any{amqp.Table{"queue": "sms.delay.03", "reason": "expired"}, other,
		amqp.Table{"queue": "sms.delay.00", "reason": "expired"}}}
	dropDelayDeaths(h, "sms")
	if got, _ := h["x-death"].([]any); len(got) != 1 || got[0].(amqp.Table)["queue"] != "sms" {
		t.Errorf("x-death %v, want only the entry of sms", h["x-death"])
	}
	h = amqp.Table{"x-death": []any{amqp.Table{"queue": "sms.delay.03", "reason": "expired"}}, "trace": "abc"}
	dropDelayDeaths(h, "sms")
	if _, ok := h["x-death"]; ok || h["trace"] != "abc" {
		t.Errorf("headers %v, want x-death gone and the rest kept", h)
	}
}

// TestReturnLag steps the lead estimate through fixed instants: it takes
// the largest lateness seen, halves every 10 s, never goes below 0 and is
// capped at maxLead.
func TestReturnLag(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var l returnLag
	steps := []struct {
		at      time.Duration
		observe time.Duration // 0: none
		want    time.Duration
	}{
		{at: 0, want: 0},
		{at: 0, observe: -5 * time.Millisecond, want: 0},
		{at: time.Second, observe: 80 * time.Millisecond, want: 80 * time.Millisecond},
		{at: 2 * time.Second, observe: 20 * time.Millisecond, want: 74642639}, // 80 ms × 2^-0.1
		{at: 11 * time.Second, want: 39999999},                                // 80 ms × 2^-1: halved 10 s after it was seen
		{at: 11 * time.Second, observe: time.Second, want: maxLead},
		{at: 21 * time.Second, want: 125 * time.Millisecond},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		if s.observe != 0 {
			l.observe(now, s.observe)
		}
		if got := l.lead(now); got != s.want {
			t.Errorf("step %d at %v: lead %v, want %v", i, s.at, got, s.want)
		}
	}
}

// TestBackFromDelayQueues drives a delivery back from the delay queues
// through handle: one due is handled, with setaside.HeaderPaid restored
// (item drops it, not knowing the levels); one due within maxHold waits
// in its handler until due, less setaside.PaidLead for its paid slot; one
// due later is set aside again, without a handler call, keeping its
// headers and its due time.
func TestBackFromDelayQueues(t *testing.T) {
	death := []any{amqp.Table{"queue": "sms.delay.03", "reason": "expired", "count": int64(1)}}
	tests := []struct {
		name      string
		due       time.Duration // from now
		handled   bool
		setAside  bool
		minWaited time.Duration
	}{
		{name: "due", due: -time.Millisecond, handled: true},
		// With a paid slot it is handed on setaside.PaidLead ahead.
		{name: "due soon: waits", due: 220 * time.Millisecond, handled: true, minWaited: 220*time.Millisecond - setaside.PaidLead},
		{name: "due later: set aside again", due: 2 * time.Second, setAside: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			var got []consumer.Message
			var at time.Time
			h := func(_ context.Context, m consumer.Message) error {
				mu.Lock()
				defer mu.Unlock()
				got, at = append(got, m), time.Now()
				return nil
			}
			pub := &fakePublisher{}
			p := newTestRun(t, ctx, Config{Options: consumer.Options{Retry: fastRetry, SetAside: true}}, h, pub)
			ack := &fakeAck{}
			start := time.Now()
			p.deliverForTest(amqp.Delivery{
				Acknowledger: ack, DeliveryTag: 3, MessageId: "m-3", RoutingKey: "0.0.0.1",
				Headers: amqp.Table{"x-death": death, setaside.HeaderPaid: paidSlot,
					consumer.HeaderDue:            start.Add(tt.due).UTC().Format(time.RFC3339Nano),
					headerBack:                    start.Add(-30 * time.Millisecond).UTC().Format(time.RFC3339Nano),
					consumer.HeaderSetAsideReason: "limit per-recipient: slot booked"},
				Body: []byte("hello"),
			})
			p.wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			if calls := ack.of(3); len(calls) != 1 || calls[0] != "ack multiple=false" {
				t.Fatalf("acknowledger calls %q, want one ack", calls)
			}
			if tt.handled {
				if len(got) != 1 || got[0].Headers[setaside.HeaderPaid] != paidSlot {
					t.Fatalf("handled %d times with %v, want once with the paid slot", len(got), got)
				}
				if waited := at.Sub(start); waited < tt.minWaited {
					t.Errorf("handled after %v, want after its due time, %v", waited, tt.minWaited)
				}
			} else if len(got) != 0 {
				t.Fatalf("handled %d times, want none before it is due", len(got))
			}
			if !tt.setAside {
				if len(pub.published) != 0 {
					t.Fatalf("published %d copies, want none", len(pub.published))
				}
				// Back 30 ms after it was due back, and the time it took
				// to handle it since: the lead learns it.
				if lead, most := p.lag.lead(time.Now()), 31*time.Millisecond+time.Since(start); lead < 25*time.Millisecond || lead > most {
					t.Errorf("lead %v after a copy back 30ms late, want about 30ms (at most %v, as measured)", lead, most)
				}
				return
			}
			if len(pub.published) != 1 {
				t.Fatalf("published %d copies, want 1", len(pub.published))
			}
			m := pub.published[0]
			if m.Headers[setaside.HeaderPaid] != paidSlot || m.Headers[consumer.HeaderSetAsideReason] != "limit per-recipient: slot booked" ||
				m.Headers["x-death"] != nil {
				t.Errorf("set aside again with headers %v, want the paid slot and the reason it came with, without x-death", m.Headers)
			}
			due, err := time.Parse(time.RFC3339Nano, m.Headers[consumer.HeaderDue].(string))
			if err != nil || due.Sub(start.Add(tt.due)).Abs() > 5*time.Millisecond {
				t.Errorf("set aside again due %v, want its due time %v", m.Headers[consumer.HeaderDue], start.Add(tt.due))
			}
		})
	}
}

// TestBackFromDelayKeepsRoutingKey: a copy back from the delay queues
// presents the routing key it was published with, not the cascade's, to
// the handler (the layers' key templates) and to OrderKey; one set aside
// carries it. Before, the handler saw the delay queues' key.
func TestBackFromDelayKeepsRoutingKey(t *testing.T) {
	t.Parallel()
	death := []any{amqp.Table{"queue": "sms.delay.00", "reason": "expired", "count": int64(1)}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var keys []string
	h := func(_ context.Context, m consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, string(m.Key))
		if len(keys) == 1 {
			return consumer.SetAside(errors.New("later"), 2*time.Second)
		}
		return nil
	}
	var ordered []string
	orderingKey := func(m consumer.Message) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		ordered = append(ordered, string(m.Key))
		return string(m.Key), nil
	}
	pub := &fakePublisher{}
	p := newTestRun(t, ctx, Config{Options: consumer.Options{Retry: fastRetry, SetAside: true,
		Ordering: consumer.OrderKey, OrderingKey: orderingKey}}, h, pub)
	// The original: its handler sets it aside.
	ack := &fakeAck{}
	p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 1, RoutingKey: "eu.sms", Body: []byte("a")})
	p.wg.Wait()
	if len(pub.published) != 1 {
		t.Fatalf("published %d copies, want 1", len(pub.published))
	}
	if k := pub.published[0].Headers[headerRoutingKey]; k != "eu.sms" {
		t.Fatalf("the copy set aside carries %s = %v, want eu.sms", headerRoutingKey, k)
	}
	// The copy back: the delay queues' level 0 routes it by the queue's name.
	back := pub.published[0].Headers
	back["x-death"] = death
	back[consumer.HeaderDue] = time.Now().Add(-time.Millisecond).UTC().Format(time.RFC3339Nano)
	p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: 2, RoutingKey: "sms", Headers: back, Body: []byte("a")})
	p.wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 2 || keys[1] != "eu.sms" {
		t.Fatalf("handler saw keys %q, want the copy back with eu.sms", keys)
	}
	if len(ordered) != 2 || ordered[1] != "eu.sms" {
		t.Fatalf("ordering keys %q, want the copy back ordered by eu.sms", ordered)
	}
}
