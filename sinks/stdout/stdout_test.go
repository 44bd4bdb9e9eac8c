package stdout_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/stdout"
)

func TestLineShape(t *testing.T) {
	tests := []struct {
		name string
		msg  consumer.Message
		want string
	}{
		{
			name: "kafka JSON body",
			msg: consumer.Message{
				Key: []byte("k1"), Body: []byte("{\n  \"to\": \"+15550100\"\n}"),
				Headers: map[string]string{"h": "v"}, Attempt: 2,
				Source: consumer.Source{Broker: "kafka", Topic: "sms", Partition: 0, Offset: 7},
			},
			want: `{"key":"k1","body":{"to":"+15550100"},"headers":{"h":"v"},"source":{"broker":"kafka","topic":"sms","partition":0,"offset":7},"attempt":2}`,
		},
		{
			name: "rabbitmq text body",
			msg: consumer.Message{
				Key: []byte("rk"), Body: []byte("plain \"text\"\n"), Attempt: 1,
				Source: consumer.Source{Broker: "rabbitmq", Queue: "q", Exchange: "ex", DeliveryTag: 3, MessageID: "m-1", Redelivered: true},
			},
			want: `{"key":"rk","body":"plain \"text\"\n","headers":{},"source":{"broker":"rabbitmq","queue":"q","exchange":"ex","delivery_tag":3,"message_id":"m-1","redelivered":true},"attempt":1}`,
		},
		{
			name: "empty body",
			msg:  consumer.Message{Attempt: 1},
			want: `{"key":"","body":"","headers":{},"source":{},"attempt":1}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := stdout.New(&buf).Send(context.Background(), tt.msg); err != nil {
				t.Fatal(err)
			}
			if got := buf.String(); got != tt.want+"\n" {
				t.Errorf("line\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestConcurrentSendsWriteWholeLines(t *testing.T) {
	var buf bytes.Buffer
	h := sinks.Handler(stdout.New(&buf))
	var wg sync.WaitGroup
	const n = 200
	for i := range n {
		wg.Go(func() {
			body := `{"i":` + strings.Repeat("1", i%50+1) + `}`
			if err := h(context.Background(), consumer.Message{Body: []byte(body)}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	sc := bufio.NewScanner(&buf)
	lines := 0
	for sc.Scan() {
		lines++
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %d is not JSON: %v: %s", lines, err, sc.Text())
		}
	}
	if lines != n {
		t.Errorf("%d lines, want %d", lines, n)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestWriteErrorIsRetryable(t *testing.T) {
	err := stdout.New(failingWriter{}).Send(context.Background(), consumer.Message{Body: []byte("x")})
	if err == nil || consumer.IsPermanent(err) || !strings.Contains(err.Error(), "broken pipe") {
		t.Fatalf("Send = %v, want a retryable write error", err)
	}
}

func TestCancelledContext(t *testing.T) {
	var buf bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := stdout.New(&buf).Send(ctx, consumer.Message{}); !errors.Is(err, context.Canceled) || buf.Len() != 0 {
		t.Fatalf("Send = %v, wrote %q; want context.Canceled and nothing written", err, buf.String())
	}
}
