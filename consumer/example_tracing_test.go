package consumer_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// A consumer with Options.TracerProvider puts each message's span in its
// handler's context; Throttle opens its wait span under it. Here the
// message's span is started by hand, as a loop of one's own would, and a
// recorder stands for the exporter.
func ExampleThrottle_tracing() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	bucket, err := limiter.NewLocal(100, 1)
	if err != nil {
		panic(err)
	}
	defer bucket.Close()

	send := func(context.Context, consumer.Message) error { return nil }
	h := consumer.Throttle(bucket, nil)(send)
	ctx, span := tp.Tracer("example").Start(context.Background(), "process sms")
	if err := h(ctx, consumer.Message{Body: []byte("hello")}); err != nil {
		panic(err)
	}
	span.End()

	for _, s := range rec.Ended() {
		fmt.Print(s.Name())
		for _, kv := range s.Attributes() {
			if kv.Key == "throttle.wait.layer" || kv.Key == "throttle.cost" {
				fmt.Printf(" %s=%s", kv.Key, kv.Value.Emit())
			}
		}
		fmt.Println()
	}
	// Output:
	// throttle wait throttle.cost=1 throttle.wait.layer=bucket
	// process sms
}
