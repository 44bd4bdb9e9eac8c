package limiter_test

import (
	"context"
	"fmt"

	"github.com/throttlehq/throttle/limiter"
)

// A single-process bucket: 2 tokens per second, burst 3. A new bucket starts
// full, so the first three tokens are there at once.
func ExampleNewLocal() {
	b, err := limiter.NewLocal(2, 3)
	if err != nil {
		panic(err)
	}
	defer b.Close()
	ctx := context.Background()
	for i := range 4 {
		ok, _ := b.Allow(ctx, 1)
		fmt.Println("message", i, "allowed:", ok)
	}
	// Output:
	// message 0 allowed: true
	// message 1 allowed: true
	// message 2 allowed: true
	// message 3 allowed: false
}

// Wait blocks for exactly as long as the bucket needs to refill. A 3-part SMS
// costs 3 tokens.
func ExampleBucket_Wait() {
	b, err := limiter.NewLocal(100, 5)
	if err != nil {
		panic(err)
	}
	defer b.Close()
	if err := b.Wait(context.Background(), 3); err != nil {
		panic(err)
	}
	fmt.Println("sent a 3-part SMS")
	// Output: sent a 3-part SMS
}
