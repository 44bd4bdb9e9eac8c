package rabbitmq_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

func nop(context.Context, consumer.Message) error { return nil }

func TestNewValidation(t *testing.T) {
	local, err := limiter.NewLocal(10, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = local.Close() })
	const url = "amqp://guest:guest@127.0.0.1:5672/"
	tests := []struct {
		name    string
		cfg     rabbitmq.Config
		nilH    bool
		wantErr string // the Go field named by a *consumer.FieldError; empty means success
	}{
		{name: "minimal", cfg: rabbitmq.Config{URL: url, Queue: "q"}},
		{name: "amqps with TLS", cfg: rabbitmq.Config{URL: "amqps://u:p@host/", TLS: &tls.Config{MinVersion: tls.VersionTLS12}, Queue: "q"}},
		{name: "throttled", cfg: rabbitmq.Config{URL: url, Queue: "q", Options: consumer.Options{Limiter: local, Cost: consumer.CostFromHeader("n")}}},
		{name: "nil handler", cfg: rabbitmq.Config{URL: url, Queue: "q"}, nilH: true, wantErr: "handler"},
		{name: "no URL", cfg: rabbitmq.Config{Queue: "q"}, wantErr: "URL"},
		{name: "bad scheme", cfg: rabbitmq.Config{URL: "http://u:p@host/", Queue: "q"}, wantErr: "URL"},
		{name: "TLS without amqps", cfg: rabbitmq.Config{URL: url, TLS: &tls.Config{}, Queue: "q"}, wantErr: "TLS"},
		{name: "no queue", cfg: rabbitmq.Config{URL: url}, wantErr: "Queue"},
		{name: "negative prefetch", cfg: rabbitmq.Config{URL: url, Queue: "q", Prefetch: -1}, wantErr: "Prefetch"},
		{name: "prefetch too large", cfg: rabbitmq.Config{URL: url, Queue: "q", Prefetch: 70000}, wantErr: "Prefetch"},
		{name: "negative concurrency", cfg: rabbitmq.Config{URL: url, Queue: "q", Options: consumer.Options{Concurrency: -2}}, wantErr: "Concurrency"},
		{name: "cost without limiter", cfg: rabbitmq.Config{URL: url, Queue: "q", Options: consumer.Options{Cost: consumer.CostFromHeader("x-cost")}}, wantErr: "Cost"},
		{name: "negative drain", cfg: rabbitmq.Config{URL: url, Queue: "q", Options: consumer.Options{DrainTimeout: -time.Second}}, wantErr: "DrainTimeout"},
		{name: "max backoff below backoff", cfg: rabbitmq.Config{URL: url, Queue: "q", Options: consumer.Options{Retry: consumer.RetryPolicy{Backoff: 2 * time.Second, MaxBackoff: time.Second}}}, wantErr: "Retry.MaxBackoff"},
		{name: "max backoff below backoff", cfg: rabbitmq.Config{URL: url, Queue: "q", ReconnectBackoff: time.Second, MaxReconnectBackoff: time.Millisecond}, wantErr: "MaxReconnectBackoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h consumer.Handler = nop
			if tt.nilH {
				h = nil
			}
			c, err := rabbitmq.New(tt.cfg, h)
			if tt.wantErr == "" {
				if err != nil || c == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if !errors.Is(err, consumer.ErrInvalidConfig) {
				t.Errorf("New error %v does not wrap consumer.ErrInvalidConfig", err)
			}
			if tt.nilH {
				if err == nil || !strings.Contains(err.Error(), "handler") {
					t.Fatalf("New error %v, want one about the nil handler", err)
				}
				return
			}
			var fields []string
			for _, fe := range consumer.FieldErrors(err) {
				fields = append(fields, fe.Field)
			}
			if len(fields) != 1 || fields[0] != tt.wantErr || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New error %v names fields %v, want [%s]", err, fields, tt.wantErr)
			}
			if verr := tt.cfg.Validate(); verr == nil || verr.Error() != strings.TrimPrefix(err.Error(), "rabbitmq: invalid consumer config: ") {
				t.Errorf("Validate = %v, want New's error %v", verr, err)
			}
		})
	}
}

// TestNoPasswordInErrorsOrLogs checks that neither New's errors nor Run's
// logs show the URL's password.
func TestNoPasswordInErrorsOrLogs(t *testing.T) {
	const secret = "s3cr3t-pw"
	for _, raw := range []string{
		"amqp://user:" + secret + "@127.0.0.1:5672/%zz", // bad escape: url.Error quotes the URL
		"http://user:" + secret + "@127.0.0.1/",
		"amqps://user:" + secret + "@127.0.0.1/",
	} {
		_, err := rabbitmq.New(rabbitmq.Config{URL: raw, Queue: "q", TLS: &tls.Config{}}, nop)
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("New error shows the password: %v", err)
		}
	}

	// Nothing listens on a closed listener's port: Run keeps failing to
	// connect and logs each failure.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	var buf testenv.Buffer
	c, err := rabbitmq.New(rabbitmq.Config{
		URL:              "amqp://user:" + secret + "@" + addr + "/",
		Queue:            "q",
		ReconnectBackoff: time.Millisecond,
		Options: consumer.Options{
			Logger: slog.New(slog.NewTextHandler(&buf, nil)),
		},
	}, nop)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Run(ctx); err != nil {
		t.Fatalf("Run returned %v, want nil after its context ended", err)
	}
	logs := buf.String()
	if !strings.Contains(logs, "connect failed") || !strings.Contains(logs, "user:xxxxx@") {
		t.Errorf("logs lack the failed connects with the redacted URL:\n%s", logs)
	}
	if strings.Contains(logs, secret) {
		t.Errorf("logs show the password:\n%s", logs)
	}
}

// TestRunOnceAndClose checks the Run/Close contract that both backends
// share: Run runs once, Close stops it and waits for it, and Run after
// Close returns consumer.ErrStopped.
func TestRunOnceAndClose(t *testing.T) {
	var logs testenv.Buffer
	c, err := rabbitmq.New(rabbitmq.Config{
		URL:     "amqp://127.0.0.1:1/",
		Queue:   "q",
		Options: consumer.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))},
	}, nop)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(context.Background()) }()
	// Once the first Run has logged a failed connect, it is running.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "connect failed"); {
		if time.Now().After(deadline) {
			t.Fatal("Run logged no failed connect within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.Connected(); !errors.Is(err, rabbitmq.ErrNotConnected) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Connected while failing to connect = %v, want ErrNotConnected with the cause", err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, consumer.ErrStopped) {
		t.Errorf("second Run returned %v, want consumer.ErrStopped", err)
	}
	_ = c.Close()
	// Close waits for Run's work to end (kit's TestLifecycle checks the
	// order); Run's result reaches errc just after, from its goroutine.
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("first Run returned %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of Close")
	}
	if err := c.Run(context.Background()); !errors.Is(err, consumer.ErrStopped) {
		t.Errorf("Run after Close returned %v, want consumer.ErrStopped", err)
	}
}

func TestToMessage(t *testing.T) {
	stamp := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name        string
		d           amqp.Delivery
		wantHeaders map[string]string
		wantTime    time.Time // zero: about now
	}{
		{
			name: "all fields",
			d: amqp.Delivery{
				RoutingKey: "sms.eu", Exchange: "events", DeliveryTag: 7, MessageId: "id-1",
				Redelivered: true, Timestamp: stamp, Body: []byte("hi"),
				Headers: amqp.Table{"s": "text", "b": []byte("raw"), "n": int32(3), "f": 1.5, "ok": true},
			},
			wantHeaders: map[string]string{"s": "text", "b": "raw", "n": "3", "f": "1.5", "ok": "true"},
			wantTime:    stamp,
		},
		{name: "no headers, no timestamp", d: amqp.Delivery{RoutingKey: "k", DeliveryTag: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := time.Now()
			m := rabbitmq.ToMessage(tt.d, "q")
			if string(m.Key) != tt.d.RoutingKey || !bytes.Equal(m.Body, tt.d.Body) || m.Attempt != 1 {
				t.Errorf("key %q body %q attempt %d", m.Key, m.Body, m.Attempt)
			}
			if len(m.Headers) != len(tt.wantHeaders) {
				t.Errorf("headers %v, want %v", m.Headers, tt.wantHeaders)
			}
			for k, v := range tt.wantHeaders {
				if m.Headers[k] != v {
					t.Errorf("header %s = %q, want %q", k, m.Headers[k], v)
				}
			}
			if tt.wantTime.IsZero() {
				if m.Time.Before(before) || m.Time.After(time.Now()) {
					t.Errorf("time %v, want about now", m.Time)
				}
			} else if !m.Time.Equal(tt.wantTime) {
				t.Errorf("time %v, want %v", m.Time, tt.wantTime)
			}
			want := consumer.Source{
				Broker: "rabbitmq", Queue: "q", Exchange: tt.d.Exchange, DeliveryTag: tt.d.DeliveryTag,
				MessageID: tt.d.MessageId, Redelivered: tt.d.Redelivered,
			}
			if m.Source != want {
				t.Errorf("source %+v, want %+v", m.Source, want)
			}
		})
	}
}

func TestWait(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	withCost := func(v any) amqp.Delivery { return amqp.Delivery{Headers: amqp.Table{"segments": v}} }
	tests := []struct {
		name          string
		ctx           context.Context
		d             amqp.Delivery
		wantErr       bool
		wantPermanent bool
	}{
		{name: "granted", ctx: context.Background(), d: withCost(int32(3))},
		{name: "no header costs one", ctx: context.Background(), d: amqp.Delivery{}},
		{name: "above burst", ctx: context.Background(), d: withCost("9"), wantErr: true, wantPermanent: true},
		{name: "malformed cost", ctx: context.Background(), d: withCost("lots"), wantErr: true, wantPermanent: true},
		{name: "context ended", ctx: cancelled, d: withCost("5"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A fresh bucket of 5 tokens that refills slowly, so that
			// the "context ended" case (cost 5 after none) must wait.
			b, err := limiter.NewLocal(0.001, 5)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if tt.ctx == cancelled {
				if err := b.Wait(context.Background(), 5); err != nil {
					t.Fatal(err)
				}
			}
			err = rabbitmq.Wait(tt.ctx, b, tt.d, consumer.CostFromHeader("segments"))
			if (err != nil) != tt.wantErr || consumer.IsPermanent(err) != tt.wantPermanent {
				t.Fatalf("Wait: %v; want error %v, permanent %v", err, tt.wantErr, tt.wantPermanent)
			}
		})
	}
}

// TestLogsDurationsAsStrings checks that a JSON log gives retry_in as a
// duration string ("1.2s"), not as a count of nanoseconds.
func TestLogsDurationsAsStrings(t *testing.T) {
	var buf testenv.Buffer
	c, err := rabbitmq.New(rabbitmq.Config{
		URL: "amqp://127.0.0.1:1/", Queue: "q", ReconnectBackoff: time.Millisecond,
		Options: consumer.Options{Logger: slog.New(slog.NewJSONHandler(&buf, nil))},
	}, nop)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(buf.String(), "connect failed"); {
		if time.Now().After(deadline) {
			t.Fatal("no failed connect logged within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if v, ok := rec["retry_in"]; ok {
			if _, err := time.ParseDuration(fmt.Sprint(v)); err != nil {
				t.Errorf("retry_in = %v (%T), want a duration string: %s", v, v, line)
			}
		}
	}
}

// TestValidateNamesEveryField checks that Validate reports every bad
// field at once, each by its Go name, the shared options' too.
func TestValidateNamesEveryField(t *testing.T) {
	err := rabbitmq.Config{
		Prefetch: -1, ReconnectBackoff: -time.Second,
		Options: consumer.Options{Concurrency: -1, DrainTimeout: -time.Second, Ordering: "random", Retry: consumer.RetryPolicy{MaxAttempts: -1}},
	}.Validate()
	var fields []string
	for _, fe := range consumer.FieldErrors(err) {
		fields = append(fields, fe.Field)
	}
	want := []string{"URL", "Queue", "Prefetch", "ReconnectBackoff", "Concurrency", "DrainTimeout", "Retry.MaxAttempts", "Ordering"}
	if strings.Join(fields, " ") != strings.Join(want, " ") {
		t.Fatalf("Validate named %v, want %v (error: %v)", fields, want, err)
	}
	if err := (rabbitmq.Config{URL: "amqp://u:p@host/", Queue: "q"}).Validate(); err != nil {
		t.Fatalf("Validate of a minimal config = %v", err)
	}
}
