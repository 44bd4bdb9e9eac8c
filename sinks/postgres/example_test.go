package postgres_test

import (
	"context"
	"fmt"
	"log"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/postgres"
)

// A sink that stores every event once, keyed by the producer's event id
// when there is one. The example needs a database, so it only compiles.
func ExampleNew() {
	ctx := context.Background()
	sink, err := postgres.New(ctx, postgres.Config{
		DSN:         "postgres://app@127.0.0.1:5432/app?sslmode=disable",
		Table:       "events.deliveries",
		CreateTable: true,
		IDHeader:    "x-event-id",
	})
	if err != nil {
		log.Fatal(err) // e.g. table "events.deliveries" does not exist (...)
	}
	defer sink.Close()

	err = sink.Send(ctx, consumer.Message{
		Body:    []byte(`{"order":42,"status":"shipped"}`),
		Headers: map[string]string{"x-event-id": "evt-42"},
	})
	switch {
	case err == nil:
		fmt.Println("stored")
	case consumer.IsPermanent(err):
		fmt.Println("dead-letter it:", err) // retrying cannot help
	default:
		// As a consumer's handler (sinks.Handler), it is retried under
		// Options.Retry.
		fmt.Println("retry it later:", err)
	}
}

func ExampleDDL() {
	ddl, err := postgres.DDL("deliveries")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ddl)
	// Output:
	// CREATE TABLE IF NOT EXISTS "deliveries" (id text PRIMARY KEY, payload jsonb, payload_raw bytea, key bytea, headers jsonb NOT NULL, source jsonb NOT NULL, received_at timestamptz NOT NULL DEFAULT now())
}

func ExampleMessageID() {
	kafka := consumer.Message{Source: consumer.Source{Broker: "kafka", Topic: "orders", Partition: 3, Offset: 1207}}
	amqp := consumer.Message{Source: consumer.Source{Broker: "rabbitmq", Queue: "orders", MessageID: "b7f3c1"}}
	stamped := consumer.Message{Headers: map[string]string{"x-event-id": "evt-42"}, Source: amqp.Source}
	fmt.Println(postgres.MessageID(kafka, "x-event-id"))
	fmt.Println(postgres.MessageID(amqp, "x-event-id"))
	fmt.Println(postgres.MessageID(stamped, "x-event-id"))
	// Output:
	// orders/3/1207
	// b7f3c1
	// evt-42
}
