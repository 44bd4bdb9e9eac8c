package stdout_test

import (
	"context"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/stdout"
)

func ExampleNew() {
	sink := stdout.New(nil) // os.Stdout
	_ = sink.Send(context.Background(), consumer.Message{
		Key:     []byte("user-7"),
		Body:    []byte(`{"to":"+15550100","text":"hi"}`),
		Attempt: 1,
		Source:  consumer.Source{Broker: "kafka", Topic: "sms", Partition: 2, Offset: 41},
	})
	// Output:
	// {"key":"user-7","body":{"to":"+15550100","text":"hi"},"headers":{},"source":{"broker":"kafka","topic":"sms","partition":2,"offset":41},"attempt":1}
}
