package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/internal/testenv"
)

// TestClassify checks which connect errors end Run at start: access
// refused (by the broker, or amqp091's guess after a dropped login, the
// second time in a row) wraps consumer.ErrAccessRefused; a missing queue or
// conflicting arguments end it too; anything else is retried.
func TestClassify(t *testing.T) {
	tests := []struct {
		name    string
		errs    []error // consecutive failed connects
		fatal   bool    // after the last one
		refused bool
	}{
		{"queue not found", []error{fmt.Errorf("consuming: %w", &amqp.Error{Code: amqp.NotFound, Server: true})}, true, false},
		{"arguments conflict", []error{&amqp.Error{Code: amqp.PreconditionFailed, Server: true}}, true, false},
		{"access refused by the broker", []error{&amqp.Error{Code: amqp.AccessRefused, Server: true}}, true, true},
		{"vhost not allowed", []error{&amqp.Error{Code: amqp.NotAllowed, Server: true, Reason: "NOT_ALLOWED - vhost x not found"}}, true, true},
		{"no SASL mechanism", []error{amqp.ErrSASL}, true, true},
		{"login dropped once", []error{fmt.Errorf("dialing: %w", amqp.ErrCredentials)}, false, false},
		{"login dropped twice", []error{amqp.ErrCredentials, fmt.Errorf("dialing: %w", amqp.ErrCredentials)}, true, true},
		{"login dropped, then a network error, then dropped", []error{amqp.ErrCredentials, errors.New("connection refused"), amqp.ErrCredentials}, false, false},
		{"connection forced", []error{&amqp.Error{Code: amqp.ConnectionForced, Server: true}}, false, false},
		{"network", []error{errors.New("connection refused")}, false, false},
	}
	c := &Consumer{}
	for _, tt := range tests {
		var guesses int
		var err error
		for _, e := range tt.errs {
			err = c.fatal(e, &guesses)
		}
		if (err != nil) != tt.fatal || errors.Is(err, consumer.ErrAccessRefused) != tt.refused {
			t.Errorf("%s: fatal = %v; want fatal %v, access refused %v", tt.name, err, tt.fatal, tt.refused)
		}
	}
}

// TestBacklogMissingQueue checks that Backlog of a queue that does not
// exist returns the broker's NOT_FOUND, naming the queue, and that the
// channel it closes is its own.
func TestBacklogMissingQueue(t *testing.T) {
	url := testenv.AMQPURL(t)
	q := "throttle-test-missing-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	c, err := New(Config{URL: url, Queue: q, Options: consumer.Options{Logger: testenv.Logger(t, slog.LevelDebug)}},
		func(context.Context, consumer.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dialing RabbitMQ: %v", err)
	}
	defer conn.Close()
	other, err := conn.Channel() // stands for the consuming channel
	if err != nil {
		t.Fatal(err)
	}
	c.setConn(conn)
	defer c.setConn(nil)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := c.Backlog(ctx)
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.NotFound || n != 0 {
		t.Fatalf("Backlog returned %d, %v; want 0 and a NOT_FOUND *amqp.Error", n, err)
	}
	if errors.Is(err, ErrNotConnected) {
		t.Errorf("error %q wraps ErrNotConnected, but the connection is up", err)
	}
	if !strings.Contains(err.Error(), strconv.Quote(q)) {
		t.Errorf("error %q does not name queue %q", err, q)
	}
	if conn.IsClosed() || other.IsClosed() {
		t.Errorf("after the NOT_FOUND: connection closed %v, other channel closed %v; want both open",
			conn.IsClosed(), other.IsClosed())
	}
	c.probes.Wait()
}

// TestFromDelayQueue: only a delivery that the broker dead-lettered from
// the delay queue counts as set aside by the consumer, whose paid slots
// (setaside.HeaderPaid) are then kept.
func TestFromDelayQueue(t *testing.T) {
	death := func(q string) amqp.Table {
		return amqp.Table{"x-death": []any{amqp.Table{"queue": "other", "reason": "rejected"}, amqp.Table{"queue": q, "reason": "expired"}}}
	}
	for _, tt := range []struct {
		name    string
		headers amqp.Table
		want    bool
	}{
		{"from the delay queue", death("sms.delay"), true},
		{"dead-lettered from another queue", death("sms.retry"), false},
		{"published with the header", amqp.Table{setaside.HeaderPaid: "[]"}, false},
		{"no headers", nil, false},
	} {
		if got := fromDelayQueue(amqp.Delivery{Headers: tt.headers}, "sms.delay"); got != tt.want {
			t.Errorf("%s: fromDelayQueue = %v, want %v", tt.name, got, tt.want)
		}
	}
}
