package kafka

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
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

// TestPriorityPassesLowBacklog: with OrderKey and MaxInFlight 5, five high
// messages on free keys behind 40 low ones in their partition go out among
// the first deliveries after they were read, not after the low messages
// that were fetched before them: the lows may not fill every handler slot,
// and a freed slot goes to a waiting high first. Before, the lows held all
// five slots and the highs waited for the ~30 lows queued ahead of them.
func TestPriorityPassesLowBacklog(t *testing.T) {
	const (
		lows, highs = 40, 5
		rate        = 50.0
		// within is how many deliveries after the first high was read
		// the last high must have gone out by: the lows already granted
		// tokens, and one per slot freed.
		within = 10
	)
	for _, ordering := range []consumer.Ordering{consumer.OrderKey, consumer.OrderNone} {
		t.Run(string(ordering), func(t *testing.T) {
			topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
			brokers := newTopics(t, 1, topic)
			var recs []*kgo.Record
			add := func(class string, i int) {
				recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "%s-%d", class, i),
					Value: fmt.Appendf(nil, "%s-%d", class, i), Headers: []kgo.RecordHeader{{Key: "x-priority", Value: []byte(class)}}})
			}
			for i := range lows {
				add("low", i)
			}
			for i := range highs {
				add("high", i)
			}
			produce(t, brokers, recs...)

			b, err := limiter.NewLocal(rate, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			class := consumer.PriorityFromHeader("x-priority", limiter.PriorityNormal)
			var (
				mu     sync.Mutex
				order  []string
				readAt = -1 // deliveries made when the first high was read
			)
			h := func(_ context.Context, m consumer.Message) error {
				mu.Lock()
				defer mu.Unlock()
				order = append(order, string(m.Body))
				return nil
			}
			obs := &consumer.MessageObserver{Received: func(m consumer.Message) {
				mu.Lock()
				defer mu.Unlock()
				if readAt < 0 && strings.HasPrefix(string(m.Body), "high") {
					readAt = len(order)
				}
			}}
			c, err := New(Config{
				Options: consumer.Options{
					Concurrency: 5,
					Logger:      testLogger(t), Ordering: ordering, Observer: obs,
					Limiter: classLimiter{b, class}, Priority: class,
				},
				Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
			}, h)
			if err != nil {
				t.Fatal(err)
			}
			runConsumer(t, c)
			waitFor(t, "every message handled", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(order) == lows+highs
			})
			mu.Lock()
			defer mu.Unlock()
			var at []int
			for i, body := range order {
				if strings.HasPrefix(body, "high") {
					at = append(at, i+1)
				}
			}
			t.Logf("first high read after %d deliveries; highs delivered %v of %d", readAt, at, lows+highs)
			if last := at[len(at)-1]; last > readAt+within {
				t.Errorf("the last high went out %d deliveries after the first was read, want at most %d (order %v)",
					last-readAt, within, order)
			}
		})
	}
}
