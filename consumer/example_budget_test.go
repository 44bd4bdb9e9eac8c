package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// A daily budget of 0.10 at 0.04 a segment to the UK and 0.0079 elsewhere:
// a message is charged its price, segments × the price of its recipient's
// country, and one that does not fit in what is left is dead-lettered
// (on_exceed dead_letter), naming the budget.
func ExampleLimitOptions_prices() {
	budget, _ := limiter.ParseAmount("0.10")
	bucket, _ := limiter.NewLocal(100, 10, limiter.Layer{
		Name: "daily-spend", Budget: budget, Per: limiter.PerDay,
		OnExceed: limiter.ActionDeadLetter,
	})
	defer bucket.Close()
	gb, _ := limiter.ParseAmount("0.04")
	other, _ := limiter.ParseAmount("0.0079")
	lim, err := consumer.NewLimiter(bucket, consumer.LimitOptions{
		Prices:    &limiter.Prices{Currency: "USD", Default: other, PerSegment: true, Countries: map[string]limiter.Amount{"GB": gb}},
		Recipient: func(m consumer.Message) (string, error) { return m.Headers["to"], nil },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	segments := func(m consumer.Message) (int, error) { return len(m.Body)/160 + 1, nil }
	send := consumer.Throttle(lim, segments)(func(_ context.Context, m consumer.Message) error {
		fmt.Println("sent to", m.Headers["to"])
		return nil
	})
	for _, to := range []string{"+442079460000", "+442079460001", "+12125550100", "+442079460002", "+12125550101"} {
		err := send(context.Background(), consumer.Message{Headers: map[string]string{"to": to}, Body: []byte("hello")})
		var refused *limiter.LimitError
		if errors.As(err, &refused) {
			reason, _, _ := strings.Cut(refused.Reason, ";") // then when it resets
			fmt.Println("dead-lettered by", refused.Layer+":", reason)
		}
	}
	// Output:
	// sent to +442079460000
	// sent to +442079460001
	// sent to +12125550100
	// dead-lettered by daily-spend: budget of 0.10 per day spent
	// sent to +12125550101
}
