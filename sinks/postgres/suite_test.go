package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/internal/sinktest"
	"github.com/throttlehq/throttle/sinks/postgres"
)

// TestSinkContract runs the suite every sink passes. A row keeps the key,
// the body (jsonb may reformat a JSON one) and the headers.
func TestSinkContract(t *testing.T) {
	sinktest.Run(t, sinktest.Harness{
		KeepsKey:     true,
		KeepsHeaders: true,
		New: func(t *testing.T) (sinks.Sink, func() []sinktest.Received) {
			dsn, table, conn := db(t)
			s := newSink(t, postgres.Config{DSN: dsn, Table: table, CreateTable: true, MaxConns: 16})
			return s, func() []sinktest.Received {
				var got []sinktest.Received
				for _, r := range rows(t, conn, table) {
					body := r.Payload
					if body == nil {
						body = r.PayloadRaw
					}
					got = append(got, sinktest.Received{Body: body, Key: r.Key, Headers: r.Headers})
				}
				return got
			}
		},
		Fail: func(t *testing.T, kind sinktest.Kind) (sinks.Sink, consumer.Message) {
			dsn, table, conn := db(t)
			s := newSink(t, postgres.Config{DSN: dsn, Table: table, CreateTable: true, IDHeader: "id"})
			if kind == sinktest.Permanent {
				// An id that is not UTF-8: the message itself is at fault.
				return s, consumer.Message{Body: []byte(`{}`), Headers: map[string]string{"id": "bad \xff"}}
			}
			// The table vanished (an operator's mistake, fixed by
			// recreating it): retrying can help.
			if _, err := conn.Exec(testenv.Context(t, 10*time.Second), "DROP TABLE "+pgx.Identifier{table}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			return s, kafkaMsg(1, `{}`)
		},
		Block: func(t *testing.T) sinks.Sink {
			dsn, table, conn := db(t)
			s := newSink(t, postgres.Config{DSN: dsn, Table: table, CreateTable: true})
			// Hold a lock that every insert waits for until the test ends.
			ctx := testenv.Context(t, 30*time.Second)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return s
		},
	})
}
