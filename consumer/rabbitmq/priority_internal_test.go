package rabbitmq

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// classLimiter waits on a bucket in each message's class, as the binary's
// limiter does with limit.priority_header.
type classLimiter struct {
	b     *limiter.Bucket
	class consumer.PriorityFunc
}

func (l classLimiter) Wait(ctx context.Context, cost int) error { return l.b.Wait(ctx, cost) }

func (l classLimiter) WaitMessage(ctx context.Context, m consumer.Message, cost int) error {
	p, err := l.class(m)
	if err != nil {
		return err
	}
	return l.b.WaitN(ctx, limiter.Request{Cost: cost, Priority: p})
}

// TestPriorityPassesLowBacklog: 40 low deliveries, then 5 high ones, all
// within the prefetch window, with Concurrency 5 and a bucket of 200/s:
// under OrderKey (free keys) and OrderNone the highs start at once on the
// slots the lows leave free and go out among the first deliveries; under
// OrderPartition deliveries start in the broker's order, so they go out
// last. Before, the lows took every slot in order and the highs went out
// 41st to 45th whatever the ordering.
func TestPriorityPassesLowBacklog(t *testing.T) {
	const lows, highs, within = 40, 5, 10
	for _, ordering := range []consumer.Ordering{consumer.OrderKey, consumer.OrderNone, consumer.OrderPartition} {
		t.Run(string(ordering), func(t *testing.T) {
			b, err := limiter.NewLocal(200, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			class := consumer.PriorityFromHeader("x-priority", limiter.PriorityNormal)
			var (
				mu    sync.Mutex
				order []string
			)
			h := func(_ context.Context, m consumer.Message) error {
				mu.Lock()
				defer mu.Unlock()
				order = append(order, m.Source.MessageID)
				return nil
			}
			opts := consumer.Options{Concurrency: 5, Ordering: ordering, Limiter: classLimiter{b, class}, Priority: class}
			if ordering == consumer.OrderKey {
				opts.OrderingKey = func(m consumer.Message) (string, error) { return m.Headers["to"], nil }
			}
			p := newTestRun(t, context.Background(), Config{Prefetch: 50, Options: opts}, h, &fakePublisher{})
			ack := &fakeAck{}
			deliver := func(tag int, class string) {
				id := fmt.Sprintf("%s-%d", class, tag)
				p.deliverForTest(amqp.Delivery{Acknowledger: ack, DeliveryTag: uint64(tag), MessageId: id,
					Headers: amqp.Table{"x-priority": class, "to": id}})
			}
			for i := range lows + highs {
				class := "low"
				if i >= lows {
					class = "high"
				}
				deliver(i+1, class)
			}
			p.wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			var at []int
			for i, id := range order {
				if strings.HasPrefix(id, "high") {
					at = append(at, i+1)
				}
			}
			t.Logf("highs delivered %v of %d", at, len(order))
			if len(at) != highs {
				t.Fatalf("delivered %v", order)
			}
			last := at[len(at)-1]
			if ordering == consumer.OrderPartition {
				if at[0] <= lows-5 {
					t.Errorf("under OrderPartition the first high went out %d of %d; want the broker's order, near the end", at[0], len(order))
				}
				return
			}
			if last > within {
				t.Errorf("the last high went out %d of %d, want among the first %d (order %v)", last, len(order), within, order)
			}
		})
	}
}
