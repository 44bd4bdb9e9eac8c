package rabbitmq

import (
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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
