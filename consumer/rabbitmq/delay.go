package rabbitmq

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
)

// The delay queues. A message set aside goes through a cascade of levels,
// each a topic exchange and a durable queue named "<Queue>.delay.NN" for
// NN = 00, 01, ...: the queue of level n holds every message for
// delayUnit·2ⁿ (a queue-level x-message-ttl), then dead-letters it to the
// exchange of level n-1, and level 0 to the queue. The routing key spells
// the delay in units, in binary, lowest bit first ("0.1.1" is 6 units);
// the exchange of level n routes a message whose bit n is 1 to its queue
// and one whose bit is 0 straight on, to level n-1's exchange, or to the
// queue at level 0. The consumer publishes a message once, to the
// exchange of its highest bit; the broker does the rest.
//
// Every message in one level's queue waits as long, so the queue's order
// is its expiry order, and RabbitMQ, which expires messages only at the
// head of a queue, brings each back on time: a message is never held up
// behind a longer delay, as it is behind a longer per-message TTL in a
// single queue.
const (
	// delayUnit is the resolution of a delay through the queues. The
	// delay is rounded down to it, and the returned message waits the
	// rest in its handler (see run.back).
	delayUnit = 10 * time.Millisecond
	// maxDelayLevels bounds the levels: level 27 waits 15.5 days, and a
	// queue-level TTL must stay below 2³² ms. A longer Options.MaxSetAside
	// is set aside again when it comes back.
	maxDelayLevels = 28
)

// headerBack names the header of a message set aside that says when the
// delay queues should bring it back: consumer.HeaderDue less the lead (see
// returnLag), rounded down to delayUnit. The consumer that receives it
// measures from it how late the broker brings messages back.
const headerBack = "x-throttle-back"

// headerRoutingKey names the header of a message set aside that holds its
// routing key: the delay queues route it by a key of their own (the
// cascade's binary spelling of the delay, then the queue's name), and the
// consumer gives the copy that comes back its original key again
// (run.item), for the layers' key templates and OrderKey.
const headerRoutingKey = "x-throttle-routing-key"

// delayLevels returns the levels that delays up to maxSetAside need.
func delayLevels(maxSetAside time.Duration) int {
	n := bits.Len64(uint64(max(maxSetAside/delayUnit, 1)))
	return min(n, maxDelayLevels)
}

// DelayQueues returns the names of the delay queues of queue, lowest
// level first, that a Consumer with Options.SetAside and
// Options.MaxSetAside maxSetAside declares when it connects:
// "<queue>.delay.00" and up, 13 with the default of a minute, at most 28.
// Each is also the name of a topic exchange. They are durable and stay
// when the consumer stops; delete them with the queue.
func DelayQueues(queue string, maxSetAside time.Duration) []string {
	out := make([]string, delayLevels(maxSetAside))
	for n := range out {
		out[n] = delayLevelName(queue, n)
	}
	return out
}

// delayLevelName returns the name of the exchange and of the queue of
// level n of queue's delay queues.
func delayLevelName(queue string, n int) string {
	return fmt.Sprintf("%s.delay.%02d", queue, n)
}

// delayLevelOf reports whether name is a level of queue's delay queues.
func delayLevelOf(queue, name string) bool {
	rest, ok := strings.CutPrefix(name, queue+".delay.")
	if !ok || len(rest) != 2 {
		return false
	}
	n, err := strconv.Atoi(rest)
	return err == nil && n >= 0 && n < maxDelayLevels
}

// levelPattern returns the binding key of level n that matches the
// routing keys whose bit n is bit.
func levelPattern(n int, bit byte) string {
	return strings.Repeat("*.", n) + string(bit) + ".#"
}

// delayRoute returns where to publish a message that the delay queues
// should bring back after d, at most 2^levels-1 units: the exchange of
// its highest bit and the routing key, and the delay they give, d rounded
// down to delayUnit, at least one unit.
func delayRoute(queue string, d time.Duration, levels int) (exchange, key string, after time.Duration) {
	u := uint64(max(d/delayUnit, 1))
	u = min(u, uint64(1)<<levels-1)
	top := bits.Len64(u) - 1
	var b strings.Builder
	for n := 0; n <= top; n++ {
		if n > 0 {
			b.WriteByte('.')
		}
		b.WriteByte('0' + byte(u>>n&1))
	}
	return delayLevelName(queue, top), b.String(), time.Duration(u) * delayUnit
}

// declareDelay declares, on ch, the levels 0 to levels-1 of queue's delay
// queues, their exchanges and their bindings (see delayUnit). Each is
// durable; declaring them again with the same levels changes nothing, and
// a replica with fewer levels uses the lower ones of the same cascade.
func declareDelay(ch *amqp.Channel, queue string, levels int) error {
	for n := range levels {
		name := delayLevelName(queue, n)
		if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declaring exchange %s: %w", name, err)
		}
		args := amqp.Table{"x-message-ttl": int64(delayUnit/time.Millisecond) << n}
		if n == 0 {
			args["x-dead-letter-exchange"] = ""
			args["x-dead-letter-routing-key"] = queue
		} else {
			args["x-dead-letter-exchange"] = delayLevelName(queue, n-1)
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			return fmt.Errorf("declaring queue %s: %w", name, err)
		}
		if err := ch.QueueBind(name, levelPattern(n, '1'), name, false, nil); err != nil {
			return fmt.Errorf("binding queue %s: %w", name, err)
		}
		var err error
		if n == 0 {
			err = ch.QueueBind(queue, levelPattern(0, '0'), name, false, nil)
		} else {
			err = ch.ExchangeBind(delayLevelName(queue, n-1), levelPattern(n, '0'), name, false, nil)
		}
		if err != nil {
			return fmt.Errorf("binding exchange %s onwards: %w", name, err)
		}
	}
	return nil
}

// fromDelayLevels reports whether d came back from queue's delay queues:
// its x-death header names one of their levels.
func fromDelayLevels(d amqp.Delivery, queue string) bool {
	deaths, _ := d.Headers["x-death"].([]any)
	for _, x := range deaths {
		if t, ok := x.(amqp.Table); ok {
			if q, ok := t["queue"].(string); ok && delayLevelOf(queue, q) {
				return true
			}
		}
	}
	return false
}

// dropDelayDeaths removes from the x-death header of h, the headers of a
// copy to set aside, the entries of queue's delay queues: RabbitMQ drops a
// message that it would dead-letter into a queue its x-death names (a
// cycle without a rejection), and a message set aside again takes some of
// the levels it took before. The broker writes them again as the copy
// goes through, which is how the consumer knows it when it comes back
// (fromDelayLevels). The header goes when nothing is left in it.
func dropDelayDeaths(h amqp.Table, queue string) {
	deaths, ok := h["x-death"].([]any)
	if !ok {
		return
	}
	kept := make([]any, 0, len(deaths))
	for _, x := range deaths {
		if t, ok := x.(amqp.Table); ok {
			if q, ok := t["queue"].(string); ok && delayLevelOf(queue, q) {
				continue
			}
		}
		kept = append(kept, x)
	}
	if len(kept) == 0 {
		delete(h, "x-death")
		return
	}
	h["x-death"] = kept
}

// returnLag estimates how late the delay queues bring messages back: the
// largest lateness seen, decaying by half every lagHalfLife. Under load
// the broker's dead-lettering and the redelivery lag tens of ms (50 to 180
// ms on a loaded 2-core machine, 2 to 7 ms idle). setAside asks for each
// message back that much ahead of its due time, and the handler waits the
// rest (run.back), so that a message comes to its limiter when due rather
// than late: a booked slot back too late is forfeit, and one back a little
// late is sent closer than the layer's spacing to the next one. It is
// safe for concurrent use.
type returnLag struct {
	mu sync.Mutex
	v  time.Duration // the estimate at at
	at time.Time
}

const (
	lagHalfLife = 10 * time.Second
	// maxLead caps the lead: a message back that much early waits in its
	// handler, holding a slot of the prefetch.
	maxLead = 250 * time.Millisecond
	// maxHold is how early a message back from the delay queues may be
	// and still wait in its handler: the lead, one unit of rounding, and
	// a margin for clocks. One back earlier is set aside again.
	maxHold = maxLead + delayUnit + 50*time.Millisecond
)

// lead returns the estimate at now, at most maxLead.
func (l *returnLag) lead(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return min(l.decayed(now), maxLead)
}

// observe records a message back late after the time it was due back.
func (l *returnLag) observe(now time.Time, late time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.v, l.at = max(l.decayed(now), min(max(late, 0), maxLead)), now
}

func (l *returnLag) decayed(now time.Time) time.Duration {
	if l.v == 0 {
		return 0
	}
	age := now.Sub(l.at)
	if age <= 0 {
		return l.v
	}
	return time.Duration(float64(l.v) * math.Exp2(-float64(age)/float64(lagHalfLife)))
}

// headerTime parses the RFC 3339 time of header name of d.
func headerTime(d *amqp.Delivery, name string) (time.Time, bool) {
	v, ok := d.Headers[name].(string)
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}

// back handles a delivery that came back from the delay queues before its
// handler runs, and reports whether it settled the delivery. It gives
// it.msg back setaside.HeaderPaid, which item drops from a delivery it
// does not know came from the delay queue, records how late the delivery
// came back (returnLag), and, when it is not due yet (consumer.HeaderDue;
// setaside.HandOnAt with a paid slot), waits until it is, or sets it aside
// again when that is further away than maxHold. A wait that ctx ends
// requeues the delivery. Any other delivery is left alone.
func (r *run) back(ctx context.Context, it *item, pub publisher) (settled bool) {
	d := &it.d
	if !fromDelayLevels(*d, r.cfg.Queue) {
		return false
	}
	attrs := requeueAttrs(d)
	if v, ok := d.Headers[setaside.HeaderPaid].(string); ok && v != "" && it.msg.Headers[setaside.HeaderPaid] == "" {
		if it.msg.Headers == nil {
			it.msg.Headers = map[string]string{}
		}
		it.msg.Headers[setaside.HeaderPaid] = v
	}
	now := time.Now()
	if b, ok := headerTime(d, headerBack); ok {
		r.lag.observe(now, now.Sub(b))
		delete(d.Headers, headerBack) // once: handle may come here again
	}
	due, ok := headerTime(d, consumer.HeaderDue)
	if !ok {
		return false
	}
	// A paid slot is handed on a little ahead: the limiter waits for it.
	early := setaside.HandOnAt(due, it.msg.Headers[setaside.HeaderPaid]).Sub(now)
	switch {
	case early <= 0:
		return false
	case early <= maxHold:
		if kit.Sleep(ctx, early) != nil {
			r.requeue(d, attrs)
			return true
		}
		return false
	}
	r.log.LogAttrs(ctx, slog.LevelDebug, "message back from the delay queues early; set aside again",
		append(attrs, slog.String("early", early.String()))...)
	// Set aside until its due time (setAside asks it back ahead of that
	// again). Without delay queues, setAside waited for it: it is handled
	// now.
	return !r.setAside(ctx, it, kit.Outcome{SetAside: due.Sub(now)}, pub, attrs)
}
