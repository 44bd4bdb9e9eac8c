package consumer_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlehq/throttle/consumer"
)

// The protocol a consumer with Options.Dedupe runs for each message, on
// the in-process store: the first delivery claims the key and marks it
// sent after its send; a copy then finds it sent and is acked without a
// send. A delivery that failed releases its claim instead, and the next
// copy claims at once.
func ExampleNewLocalDedupeStore() {
	store := consumer.NewLocalDedupeStore()
	ctx := context.Background()
	show := func(st consumer.DedupeState, err error) {
		switch {
		case err != nil:
			fmt.Println(err)
		case st == consumer.DedupeClaimed:
			fmt.Println("claimed: send it")
		case st == consumer.DedupeSent:
			fmt.Println("already sent: ack it without a send")
		}
	}
	show(store.Claim(ctx, "msg-1", "delivery-1", time.Minute))
	_ = store.MarkSent(ctx, "msg-1", "delivery-1", 24*time.Hour) // after the sink's success
	show(store.Claim(ctx, "msg-1", "delivery-2", time.Minute))   // the copy

	show(store.Claim(ctx, "msg-2", "delivery-3", time.Minute))
	_ = store.Release(ctx, "msg-2", "delivery-3") // dead-lettered: not sent
	show(store.Claim(ctx, "msg-2", "delivery-4", time.Minute))
	// Output:
	// claimed: send it
	// already sent: ack it without a send
	// claimed: send it
	// claimed: send it
}
