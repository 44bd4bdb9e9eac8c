package consumer_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// A per-recipient layer on top of the shared bucket, and priority classes,
// on the in-process store: the same adapter the binary uses. A second SMS
// to one recipient within the minute is dead-lettered naming the layer,
// never retried, never sent.
func ExampleNewLimiter() {
	bucket, _ := limiter.NewLocal(100, 10, limiter.Layer{ // the provider account: 100/s
		Name: "per-recipient", Keyed: true, Rate: 1.0 / 60, Burst: 1, // 1 a minute
		OnExceed: limiter.ActionDeadLetter,
	})
	defer bucket.Close()

	lim, err := consumer.NewLimiter(bucket, consumer.LimitOptions{
		Keys: func(m consumer.Message) (map[string]string, error) {
			return map[string]string{"per-recipient": m.Headers["to"]}, nil
		},
		Priority: consumer.PriorityFromHeader("x-prio", limiter.PriorityNormal), // OTP codes: x-prio: high
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	send := consumer.Throttle(lim, nil)(func(_ context.Context, m consumer.Message) error {
		fmt.Println("sent to", m.Headers["to"], "as", m.Headers["x-prio"])
		return nil
	})
	for _, m := range []consumer.Message{
		{Headers: map[string]string{"to": "+14155550100", "x-prio": "high"}},
		{Headers: map[string]string{"to": "+14155550101", "x-prio": "low"}},
		{Headers: map[string]string{"to": "+14155550100", "x-prio": "low"}},
	} {
		err := send(context.Background(), m)
		var refused *limiter.LimitError
		if consumer.IsPermanent(err) && errors.As(err, &refused) {
			// A consumer dead-letters it at once, naming the layer in
			// the header consumer.HeaderLimit.
			fmt.Println("dead-lettered by", refused.Layer)
		}
	}
	// Output:
	// sent to +14155550100 as high
	// sent to +14155550101 as low
	// dead-lettered by per-recipient
}
