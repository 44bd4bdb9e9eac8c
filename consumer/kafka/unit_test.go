package kafka

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/limiter"
)

func TestNewRejectsBadConfig(t *testing.T) {
	ok := func(context.Context, consumer.Message) error { return nil }
	l, err := limiter.NewLocal(10, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	base := func() Config { return Config{Brokers: []string{"127.0.0.1:9092"}, Topic: "t", Group: "g"} }
	cases := []struct {
		name   string
		mutate func(*Config)
		h      consumer.Handler
		want   string
	}{
		{"nil handler", func(*Config) {}, nil, "handler"},
		{"no brokers", func(c *Config) { c.Brokers = nil }, ok, "Brokers"},
		{"broker without port", func(c *Config) { c.Brokers = []string{"localhost"} }, ok, "Brokers[0]"},
		{"no topic", func(c *Config) { c.Topic = "" }, ok, "Topic"},
		{"illegal topic name", func(c *Config) { c.Topic = "a b" }, ok, "Topic"},
		{"illegal dead-letter topic name", func(c *Config) { c.DeadLetterTopic = ".." }, ok, "DeadLetterTopic"},
		{"unknown ordering", func(c *Config) { c.Ordering = "random" }, ok, "Ordering"},
		{"no group", func(c *Config) { c.Group = "" }, ok, "Group"},
		{"negative concurrency", func(c *Config) { c.Concurrency = -1 }, ok, "Concurrency"},
		{"dead-letter topic is the topic", func(c *Config) { c.DeadLetterTopic = "t" }, ok, "DeadLetterTopic"},
		{"bad start offset", func(c *Config) { c.StartOffset = 42 }, ok, "StartOffset"},
		{"illegal delay topic name", func(c *Config) { c.DelayTopic = "a/b" }, ok, "DelayTopic"},
		{"delay topic is the topic", func(c *Config) { c.DelayTopic = "t" }, ok, "DelayTopic"},
		{"delay topic is the dead-letter topic", func(c *Config) { c.DelayTopic = "t.dlq" }, ok, "DelayTopic"},
		{"default delay topic is the dead-letter topic", func(c *Config) { c.DeadLetterTopic = "t.delay" }, ok, "DelayTopic"},
		{"max backoff below backoff", func(c *Config) { c.Retry = consumer.RetryPolicy{Backoff: 2 * time.Second, MaxBackoff: time.Second} }, ok, "Retry.MaxBackoff"},
		{"negative commit timeout", func(c *Config) { c.CommitTimeout = -time.Second }, ok, "CommitTimeout"},
		{"negative drain timeout", func(c *Config) { c.DrainTimeout = -time.Second }, ok, "DrainTimeout"},
		{"cost without limiter", func(c *Config) { c.Cost = consumer.CostFromHeader("x-cost") }, ok, "Limiter"},
		{"reader hook breaks backoff", func(c *Config) {
			c.ConfigureReader = func(rc *kafkago.ReaderConfig) { rc.ReadBackoffMax = time.Millisecond }
		}, ok, "ReadBackoffMax"},
		{"reader hook breaks group", func(c *Config) {
			c.ConfigureReader = func(rc *kafkago.ReaderConfig) { rc.SessionTimeout = -time.Second }
		}, ok, "SessionTimeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.mutate(&cfg)
			_, err := New(cfg, tc.h)
			if !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New() = %v, want consumer.ErrInvalidConfig naming %q", err, tc.want)
			}
		})
	}

	t.Run("defaults", func(t *testing.T) {
		cfg := base()
		cfg.Limiter = l
		cfg.Cost = consumer.CostFromHeader("x-cost")
		c, err := New(cfg, ok)
		if err != nil {
			t.Fatal(err)
		}
		if c.cfg.Concurrency != 1 || c.cfg.DeadLetterTopic != "t.dlq" || c.cfg.DelayTopic != "t.delay" || c.cfg.StartOffset != kafkago.FirstOffset ||
			c.cfg.DrainTimeout != DefaultDrainTimeout || c.cfg.CommitTimeout != DefaultCommitTimeout {
			t.Fatalf("defaults not applied: %+v", c.cfg)
		}
		if c.rc.GroupID != "g" || c.rc.Topic != "t" || c.rc.CommitInterval != 0 {
			t.Fatalf("reader config: %+v", c.rc)
		}
		// The one bound, messages at once: 1 under OrderPartition (a
		// partition at a time), DefaultConcurrency under the others.
		for _, o := range []consumer.Ordering{consumer.OrderKey, consumer.OrderNone} {
			cfg := base()
			cfg.Ordering = o
			c, err := New(cfg, ok)
			if err != nil {
				t.Fatal(err)
			}
			if c.cfg.Concurrency != DefaultConcurrency {
				t.Errorf("ordering %s: Concurrency %d, want %d", o, c.cfg.Concurrency, DefaultConcurrency)
			}
		}
	})
}

// TestValidateFieldErrors: Validate reports every problem, each naming its
// Go field, so that the config package can name its own keys.
func TestValidateFieldErrors(t *testing.T) {
	err := Config{Brokers: []string{"nohost"}, Group: "g", QueueSize: -1,
		Options: consumer.Options{Retry: consumer.RetryPolicy{MaxAttempts: -1}}}.Validate()
	var fields []string
	for _, fe := range consumer.FieldErrors(err) {
		fields = append(fields, fe.Field)
	}
	want := []string{"Brokers[0]", "Topic", "QueueSize", "Retry.MaxAttempts"}
	if !equalStrings(fields, want) {
		t.Fatalf("fields at fault %v, want %v (error: %v)", fields, want, err)
	}
	if err := (Config{Brokers: []string{"h:1"}, Topic: "t", Group: "g"}).Validate(); err != nil {
		t.Fatalf("a minimal config: %v", err)
	}
}

func TestRunOnceAndClose(t *testing.T) {
	c, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", Group: "g"},
		func(context.Context, consumer.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, consumer.ErrStopped) {
		t.Fatalf("Run after Close = %v, want consumer.ErrStopped", err)
	}
}

func TestToMessage(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name    string
		in      kafkago.Message
		headers map[string]string
	}{
		{"no headers", kafkago.Message{Topic: "t", Partition: 2, Offset: 7, Key: []byte("k"), Value: []byte("v"), Time: ts}, nil},
		{"last header wins", kafkago.Message{Topic: "t", Partition: 0, Offset: 1, Value: []byte("v"), Time: ts,
			Headers: []kafkago.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("x")}, {Key: "a", Value: []byte("2")}}},
			map[string]string{"a": "2", "b": "x"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := ToMessage(tc.in)
			if string(m.Key) != string(tc.in.Key) || string(m.Body) != string(tc.in.Value) || !m.Time.Equal(ts) || m.Attempt != 1 {
				t.Fatalf("ToMessage = %+v", m)
			}
			want := consumer.Source{Broker: "kafka", Topic: tc.in.Topic, Partition: tc.in.Partition, Offset: tc.in.Offset}
			if m.Source != want {
				t.Fatalf("Source = %+v, want %+v", m.Source, want)
			}
			if len(m.Headers) != len(tc.headers) {
				t.Fatalf("Headers = %v, want %v", m.Headers, tc.headers)
			}
			for k, v := range tc.headers {
				if m.Headers[k] != v {
					t.Fatalf("Headers = %v, want %v", m.Headers, tc.headers)
				}
			}
		})
	}
	if m := ToMessage(kafkago.Message{}); m.Time.IsZero() {
		t.Fatal("a message without a timestamp must get the current time")
	}
}

func TestWait(t *testing.T) {
	l, err := limiter.NewLocal(1000, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cost := consumer.CostFromHeader("x-cost")
	withCost := func(v string) kafkago.Message {
		return kafkago.Message{Headers: []kafkago.Header{{Key: "x-cost", Value: []byte(v)}}}
	}
	cases := []struct {
		name      string
		msg       kafkago.Message
		cost      consumer.CostFunc
		permanent bool
	}{
		{"default cost", kafkago.Message{}, nil, false},
		{"cost from header", withCost("3"), cost, false},
		{"cost above burst", withCost("4"), cost, true},
		{"cost not a number", withCost("many"), cost, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Wait(context.Background(), l, tc.msg, tc.cost)
			if got := consumer.IsPermanent(err); got != tc.permanent || (!tc.permanent && err != nil) {
				t.Fatalf("Wait = %v, want permanent=%v", err, tc.permanent)
			}
		})
	}
	t.Run("context ends while waiting", func(t *testing.T) {
		slow, err := limiter.NewLocal(1, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer slow.Close()
		if err := Wait(context.Background(), slow, kafkago.Message{}, nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := Wait(ctx, slow, kafkago.Message{}, nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait on an empty bucket = %v, want the context's error", err)
		}
	})
}

func TestDeadLetterHeaders(t *testing.T) {
	// An empty value removes the header, as an old x-throttle-paid on a
	// copy set aside again without a slot (Outcome.SetAsideHeaders).
	orig := []kafkago.Header{{Key: "trace", Value: []byte("abc")}, {Key: consumer.HeaderAttempts, Value: []byte("stale")},
		{Key: setaside.HeaderPaid, Value: []byte(`[{"layer":"old"}]`)}}
	got := deadLetterHeaders(orig, map[string]string{consumer.HeaderAttempts: "3", consumer.HeaderError: "boom", setaside.HeaderPaid: ""})
	want := []string{"trace=abc", consumer.HeaderAttempts + "=3", consumer.HeaderError + "=boom"}
	if len(got) != len(want) {
		t.Fatalf("headers = %v, want %v", got, want)
	}
	for i, h := range got {
		if h.Key+"="+string(h.Value) != want[i] {
			t.Fatalf("headers = %v, want %v", got, want)
		}
	}
}

// fakeWriter fails the first fail writes.
type fakeWriter struct {
	mu     sync.Mutex
	fail   int
	calls  int
	writes []kafkago.Message
}

func (w *fakeWriter) WriteMessages(ctx context.Context, msgs ...kafkago.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls++
	if w.fail != 0 {
		if w.fail > 0 {
			w.fail--
		}
		return errors.New("broker unavailable")
	}
	w.writes = append(w.writes, msgs...)
	return nil
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func msgs(partition int, offsets ...int64) []kafkago.Message {
	var out []kafkago.Message
	for _, o := range offsets {
		out = append(out, kafkago.Message{Topic: "t", Partition: partition, Offset: o, Value: []byte("v")})
	}
	return out
}
