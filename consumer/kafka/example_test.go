package kafka_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log"
	"os"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/limiter"
)

// exampleCluster starts an in-process Kafka broker with a one-partition
// topic holding three messages, so that the examples run without setup.
func exampleCluster(topic string) (brokers []string, shutdown func()) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		log.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	for i := 1; i <= 3; i++ {
		r := &kgo.Record{
			Topic:   topic,
			Key:     fmt.Appendf(nil, "order-%d", i),
			Value:   fmt.Appendf(nil, "send %d SMS", i),
			Headers: []kgo.RecordHeader{{Key: "x-segments", Value: fmt.Appendf(nil, "%d", i)}},
		}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}
	return c.ListenAddrs(), c.Close
}

func ExampleConsumer() {
	brokers, shutdown := exampleCluster("orders")
	defer shutdown()

	// A local bucket for the example; replicas share one bucket with
	// limiter.New on a limiter/redislimiter store.
	bucket, err := limiter.NewLocal(100, 10)
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	handled := 0
	c, err := kafka.New(kafka.Config{
		Brokers: brokers,
		Topic:   "orders",
		Group:   "sms-sender",
		Options: consumer.Options{
			Limiter: bucket,
			// Each message costs as many tokens as it has SMS segments.
			Cost: consumer.CostFromHeader("x-segments"),
		},
	}, func(ctx context.Context, m consumer.Message) error {
		fmt.Printf("%s: %s (offset %d, attempt %d)\n", m.Key, m.Body, m.Source.Offset, m.Attempt)
		if handled++; handled == 3 {
			cancel() // stop the example; a service stops on SIGTERM
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Run blocks until ctx ends, then drains and commits.
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// order-1: send 1 SMS (offset 0, attempt 1)
	// order-2: send 2 SMS (offset 1, attempt 1)
	// order-3: send 3 SMS (offset 2, attempt 1)
}

// A loop that already uses a kafka-go Reader adds throttling with one call
// per message, between FetchMessage and the work.
func ExampleWait() {
	brokers, shutdown := exampleCluster("orders")
	defer shutdown()
	bucket, err := limiter.NewLocal(100, 10)
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()

	ctx := context.Background()
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers: brokers, Topic: "orders", GroupID: "sms-sender",
		MaxWait: 500 * time.Millisecond, // Close waits for a pending fetch
	})
	defer r.Close()
	for range 3 {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if err := kafka.Wait(ctx, bucket, m, consumer.CostFromHeader("x-segments")); err != nil {
			// consumer.IsPermanent(err): the cost can never be granted,
			// so dead-letter the message instead of waiting.
			log.Fatal(err)
		}
		fmt.Printf("%s: %s\n", m.Key, m.Value)
		if err := r.CommitMessages(ctx, m); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// order-1: send 1 SMS
	// order-2: send 2 SMS
	// order-3: send 3 SMS
}

// The middleware form: wrap the handler with consumer.Throttle and feed it
// kafka-go messages converted with ToMessage.
func Example_middleware() {
	brokers, shutdown := exampleCluster("orders")
	defer shutdown()
	bucket, err := limiter.NewLocal(100, 10)
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()

	send := func(ctx context.Context, m consumer.Message) error {
		fmt.Printf("%s: %s (%s segments)\n", m.Key, m.Body, m.Headers["x-segments"])
		return nil
	}
	h := consumer.Chain(send, consumer.Throttle(bucket, consumer.CostFromHeader("x-segments")))

	ctx := context.Background()
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers: brokers, Topic: "orders", GroupID: "sms-sender",
		MaxWait: 500 * time.Millisecond, // Close waits for a pending fetch
	})
	defer r.Close()
	for range 3 {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if err := h(ctx, kafka.ToMessage(m)); err != nil {
			log.Fatal(err) // retry, or dead-letter when consumer.IsPermanent(err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// order-1: send 1 SMS (1 segments)
	// order-2: send 2 SMS (2 segments)
	// order-3: send 3 SMS (3 segments)
}

// Connecting with SASL/PLAIN over TLS: build a kafka-go Dialer and set it
// in the Config. A SCRAM mechanism from scram.Mechanism
// (github.com/segmentio/kafka-go/sasl/scram) goes in the same field.
func ExampleConfig_sasl() {
	mech := plain.Mechanism{Username: "sms-sender", Password: os.Getenv("KAFKA_PASSWORD")}
	cfg := kafka.Config{
		Brokers: []string{"broker-1.example.com:9093", "broker-2.example.com:9093"},
		Topic:   "orders",
		Group:   "sms-sender",
		Dialer: &kafkago.Dialer{
			Timeout:       10 * time.Second,
			DualStack:     true,
			TLS:           &tls.Config{MinVersion: tls.VersionTLS12},
			SASLMechanism: mech,
		},
	}
	c, err := kafka.New(cfg, func(ctx context.Context, m consumer.Message) error { return nil })
	if err != nil {
		log.Fatal(err)
	}
	_ = c // c.Run(ctx) in a service
}
