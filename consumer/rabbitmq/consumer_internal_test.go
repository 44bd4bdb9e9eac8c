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
	"github.com/throttlehq/throttle/internal/testenv"
)

func TestBackoff(t *testing.T) {
	c := &Consumer{cfg: Config{ReconnectBackoff: 100 * time.Millisecond, MaxReconnectBackoff: time.Second}}
	tests := []struct {
		failures int
		ceiling  time.Duration
	}{
		{0, 100 * time.Millisecond},
		{1, 200 * time.Millisecond},
		{3, 800 * time.Millisecond},
		{4, time.Second},
		{50, time.Second},
	}
	for _, tt := range tests {
		for range 100 {
			if d := c.backoff(tt.failures); d < tt.ceiling/2 || d > tt.ceiling {
				t.Fatalf("backoff(%d) = %v, want within [%v, %v]", tt.failures, d, tt.ceiling/2, tt.ceiling)
			}
		}
	}
}

func TestFatal(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"queue not found", fmt.Errorf("consuming: %w", &amqp.Error{Code: amqp.NotFound, Server: true}), true},
		{"arguments conflict", &amqp.Error{Code: amqp.PreconditionFailed, Server: true}, true},
		{"access refused", &amqp.Error{Code: amqp.AccessRefused, Server: true}, true},
		{"client-side guess", amqp.ErrCredentials, false},
		{"connection forced", &amqp.Error{Code: amqp.ConnectionForced, Server: true}, false},
		{"network", errors.New("connection refused"), false},
	}
	for _, tt := range tests {
		if got := fatal(tt.err); got != tt.want {
			t.Errorf("%s: fatal = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestBacklogMissingQueue checks that Backlog of a queue that does not
// exist returns the broker's NOT_FOUND, naming the queue, and that the
// channel it closes is its own.
func TestBacklogMissingQueue(t *testing.T) {
	url := testenv.AMQPURL(t)
	q := "throttle-test-missing-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	c, err := New(Config{URL: url, Queue: q, Logger: testenv.Logger(t, slog.LevelDebug)},
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
