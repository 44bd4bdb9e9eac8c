package limiter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// A shadow layer is decided on every message but never enforced: five
// messages to one recipient all pass at once, and the layer of 1/h counts
// the four it would have held back.
func ExampleLayer_shadow() {
	store, err := limiter.NewLocalStore(1000, 1000, limiter.Layer{Name: "per-recipient", Keyed: true, Rate: 1.0 / 3600, Shadow: true})
	if err != nil {
		panic(err)
	}
	var would atomic.Int64
	b, err := limiter.New(store, limiter.Options{Observer: &limiter.Observer{
		ShadowDecided: func(d limiter.ShadowDecision) {
			if d.Exceeded() {
				would.Add(1)
			}
		},
	}})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	for range 5 {
		if err := b.WaitN(context.Background(), limiter.Request{Cost: 1, Keys: map[string]string{"per-recipient": "+15550100"}}); err != nil {
			panic(err)
		}
	}
	fmt.Println(b.Stats().Granted, would.Load(), b.Stats().Exceeded["per-recipient"])
	// Output: 5 4 4
}

// A shadow shared bucket (Options.Shadow) is decided on every message but
// never enforced: at 1/s with a burst of 1, five messages all pass at once,
// and the shadow counts the four it would have made wait, under the layer
// name "" (the shared bucket).
func ExampleOptions_shadow() {
	store, err := limiter.NewLocalStore(1, 1)
	if err != nil {
		panic(err)
	}
	var would atomic.Int64
	b, err := limiter.New(store, limiter.Options{Shadow: true, Observer: &limiter.Observer{
		ShadowDecided: func(d limiter.ShadowDecision) {
			if d.Layer == "" && d.Exceeded() {
				would.Add(1)
			}
		},
	}})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	for range 5 {
		if err := b.Wait(ctx, 1); err != nil {
			panic(err) // a wait for the shared bucket would end the context
		}
	}
	fmt.Println(b.Stats().Granted, would.Load(), b.Stats().Exceeded[""])
	// Output: 5 4 4
}
