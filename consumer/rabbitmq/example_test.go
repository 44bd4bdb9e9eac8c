package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// sendSMS stands for the user's sink.
func sendSMS(ctx context.Context, body []byte) error { return nil }

// A Consumer throttled by a bucket in Redis that every replica shares. It
// needs RabbitMQ and Redis, so the example only compiles.
func ExampleConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	store, err := redislimiter.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}),
		redislimiter.Config{Bucket: "sms", Rate: 50, Burst: 5})
	if err != nil {
		log.Fatal(err)
	}
	bucket, err := limiter.New(store, limiter.Options{MaxPause: 30 * time.Second}) // the longest push-back pause
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()

	c, err := rabbitmq.New(rabbitmq.Config{
		URL:      "amqp://guest:guest@127.0.0.1:5672/",
		Queue:    "sms",
		Declare:  true, // sms, with dead-letter exchange sms.dlx and queue sms.dlq
		Prefetch: 20,
		Options: consumer.Options{ // the settings every backend shares
			Limiter: bucket,
			Cost:    consumer.CostFromHeader("segments"),
			Pauser:  bucket, // a handler's consumer.RetryAfter pauses every replica, up to the bucket's MaxPause
			Retry:   consumer.RetryPolicy{MaxAttempts: 5},
		},
	}, func(ctx context.Context, msg consumer.Message) error {
		return sendSMS(ctx, msg.Body)
	})
	if err != nil {
		log.Fatal(err)
	}
	// Run returns after Ctrl-C, once in-flight messages are acked.
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Backlog reports the depth of the queue while Run consumes it, here every
// 10 seconds, for a gauge or an autoscaler. It needs RabbitMQ, so the
// example only compiles.
func ExampleConsumer_Backlog() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	c, err := rabbitmq.New(rabbitmq.Config{
		URL:   "amqp://guest:guest@127.0.0.1:5672/",
		Queue: "sms",
	}, func(ctx context.Context, msg consumer.Message) error {
		return sendSMS(ctx, msg.Body)
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			bctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			n, err := c.Backlog(bctx)
			cancel()
			switch {
			case errors.Is(err, rabbitmq.ErrNotConnected):
				// Run is connecting or reconnecting: no reading this time.
			case err != nil:
				log.Print(err)
			default:
				log.Printf("sms backlog: %d messages", n)
			}
		}
	}()
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// An existing delivery loop gets throttled with one call per delivery. It
// needs RabbitMQ, so the example only compiles.
func ExampleWait() {
	ctx := context.Background()
	bucket, err := limiter.NewLocal(50, 5) // or a shared Redis bucket
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()

	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("sms", "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	for d := range deliveries {
		if err := rabbitmq.Wait(ctx, bucket, d, consumer.CostFromHeader("segments")); err != nil {
			if consumer.IsPermanent(err) {
				_ = d.Nack(false, false) // can never be granted: dead-letter it
				continue
			}
			return // ctx ended: leave d unacked for redelivery
		}
		if err := sendSMS(ctx, d.Body); err != nil {
			_ = d.Nack(false, true)
			continue
		}
		_ = d.Ack(false)
	}
}

// The middleware form: the user's handler wrapped with consumer.Throttle,
// called from an existing delivery loop. It needs RabbitMQ, so the example
// only compiles.
func ExampleToMessage_middleware() {
	ctx := context.Background()
	bucket, err := limiter.NewLocal(50, 5)
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()
	handle := consumer.Chain(func(ctx context.Context, msg consumer.Message) error {
		return sendSMS(ctx, msg.Body)
	}, consumer.Throttle(bucket, consumer.CostFromHeader("segments")))

	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("sms", "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	for d := range deliveries {
		switch err := handle(ctx, rabbitmq.ToMessage(d, "sms")); {
		case err == nil:
			_ = d.Ack(false)
		case consumer.IsPermanent(err):
			_ = d.Nack(false, false)
		default:
			_ = d.Nack(false, true)
		}
	}
}

// ToMessage converts a delivery without a broker, so this example runs.
func ExampleToMessage() {
	d := amqp.Delivery{
		RoutingKey:  "sms.eu",
		MessageId:   "42",
		DeliveryTag: 7,
		Headers:     amqp.Table{"segments": int32(3)},
		Timestamp:   time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC),
		Body:        []byte("hello"),
	}
	msg := rabbitmq.ToMessage(d, "sms")
	cost, _ := consumer.CostFromHeader("segments")(msg)
	fmt.Println(string(msg.Key), string(msg.Body), msg.Source.Queue, msg.Source.DeliveryTag, msg.Source.MessageID, cost)
	// Output: sms.eu hello sms 7 42 3
}
