package rabbitmq_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// recipientLimiter is a consumer.MessageLimiter on a limiter.Bucket whose
// store has one layer, "per-recipient", keyed by the header "to". As the
// binary's limiter does (internal/cli), it passes a returned message's
// paid slots (setaside.PaidSlots) with the message's key.
type recipientLimiter struct{ b *limiter.Bucket }

func (l recipientLimiter) Wait(ctx context.Context, n int) error { return l.b.Wait(ctx, n) }

func (l recipientLimiter) WaitMessage(ctx context.Context, msg consumer.Message, n int) error {
	return l.b.WaitN(ctx, limiter.Request{Cost: n, Keys: map[string]string{"per-recipient": msg.Headers["to"]}, Paid: setaside.PaidSlots(msg.Headers)})
}

// newRecipientLimiter returns a recipientLimiter on an in-process layered
// store: a shared bucket that never limits, and a per-recipient layer of
// rate and burst 1 with on_exceed delay.
func newRecipientLimiter(t *testing.T, rate float64) recipientLimiter {
	t.Helper()
	store, err := limiter.NewLocalStore(1e6, 1e6,
		limiter.Layer{Name: "per-recipient", Keyed: true, Rate: rate, Burst: 1, OnExceed: limiter.ActionDelay})
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.New(store, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return recipientLimiter{b}
}

// TestForgedPaidSlot publishes 4 messages to one recipient behind a delay
// layer of 1/h, each with a paid slot (setaside.HeaderPaid) that the
// publisher made, for now, and an x-death header naming the delay queue,
// as if the consumer had set it aside: the forged slot carries no
// signature of the limiter's secret, so the layer decides as usual. One
// message goes out; the other three are set aside, each with a slot of
// its own an hour apart.
func TestForgedPaidSlot(t *testing.T) {
	const n = 4
	b := newBroker(t)
	q := b.declareQueue(t)
	t.Cleanup(func() { _, _ = b.ch.QueueDelete(q+".delay", false, false, false) })
	lim := newRecipientLimiter(t, 1.0/3600)

	ctx := testenv.Context(t, 30*time.Second)
	forged := `[{"layer":"per-recipient","key":"+15550100","due":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}]`
	for i := range n {
		dc, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
			MessageId: "m-" + string(rune('0'+i)),
			Headers: amqp.Table{
				"to":                "+15550100",
				setaside.HeaderPaid: forged,
				"x-death":           []any{amqp.Table{"queue": q + ".delay", "reason": "expired", "count": int64(1)}},
			},
			Body: []byte("hello"),
		})
		must(t, err)
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}

	var (
		mu        sync.Mutex
		delivered []time.Time
		setAside  atomic.Int64
	)
	h := func(context.Context, consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		delivered = append(delivered, time.Now())
		return nil
	}
	c := newConsumer(t, rabbitmq.Config{URL: b.url, Queue: q, Options: consumer.Options{
		Concurrency: 1,
		SetAside:    true,
		Limiter:     lim,
		Observer:    &consumer.MessageObserver{SetAside: func(consumer.Message, time.Duration) { setAside.Add(1) }},
	}}, h)
	runCtx, cancel := context.WithCancel(context.Background())
	wait := runAll(t, runCtx, c.Run)
	eventually(t, "every message delivered or set aside", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered)+int(setAside.Load()) >= n
	})
	cancel()
	wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d messages with a forged paid slot to one recipient at 1/h: %d delivered, %d set aside", n, len(delivered), setAside.Load())
	if len(delivered) != 1 || setAside.Load() != n-1 {
		var span time.Duration
		if len(delivered) > 0 {
			span = delivered[len(delivered)-1].Sub(delivered[0])
		}
		t.Errorf("%d delivered (within %v), %d set aside; want 1 delivered and %d set aside: a forged slot must not pass the layer",
			len(delivered), span, setAside.Load(), n-1)
	}
}
