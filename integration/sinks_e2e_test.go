package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// sinkE2EProvider is an SMS provider that rejects one number with 400 and
// accepts every other message, counting what it saw.
type sinkE2EProvider struct {
	mu   sync.Mutex
	seen map[string]int
}

func (p *sinkE2EProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var ev struct{ ID, To string }
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &ev); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.seen[ev.ID]++
	p.mu.Unlock()
	if ev.To == "invalid" {
		http.Error(w, `{"error":"invalid number"}`, http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

func (p *sinkE2EProvider) counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.seen))
	for k, v := range p.seen {
		out[k] = v
	}
	return out
}

const sinkE2EMessages = 30

// sinkE2EBody is message i; message 7 goes to a number the provider rejects.
func sinkE2EBody(i int) []byte {
	to := fmt.Sprintf("+4670%07d", i)
	if i == 7 {
		to = "invalid"
	}
	return fmt.Appendf(nil, `{"id":"m%d","to":%q,"text":"hello"}`, i, to)
}

func sinkE2ESetup(t *testing.T) (*sinkE2EProvider, consumer.Handler, *limiter.Bucket) {
	t.Helper()
	p := &sinkE2EProvider{seen: map[string]int{}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	s, err := httpsink.New(httpsink.Config{URL: srv.URL, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	l, err := limiter.NewLocal(200, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return p, sinks.Handler(s), l
}

// sinkE2ECheck asserts that the rejected message reached the provider once
// and every other message at least once.
func sinkE2ECheck(t *testing.T, p *sinkE2EProvider) {
	t.Helper()
	seen := p.counts()
	for i := range sinkE2EMessages {
		id := fmt.Sprintf("m%d", i)
		switch {
		case i == 7 && seen[id] != 1:
			t.Errorf("the rejected message reached the provider %d times, want exactly 1 (a 400 is not retried)", seen[id])
		case seen[id] < 1:
			t.Errorf("message %s never reached the provider", id)
		}
	}
}

// TestSinkRejectionIsDeadLetteredKafka: a message the provider answers with
// 400 goes to the dead-letter topic after one attempt; the rest arrive.
func TestSinkRejectionIsDeadLetteredKafka(t *testing.T) {
	t.Parallel()
	topic := fmt.Sprintf("sms-%d", time.Now().UnixNano())
	brokers := testenv.KafkaBrokers()
	if len(brokers) == 0 {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic), kfake.AllowAutoTopicCreation())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		brokers = c.ListenAddrs()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx := testenv.Context(t, 60*time.Second)
	for i := range sinkE2EMessages {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%5), Value: sinkE2EBody(i)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	p, h, l := sinkE2ESetup(t)
	c, err := kafka.New(kafka.Config{
		Options: consumer.Options{Concurrency: 3, Limiter: l, Retry: consumer.RetryPolicy{MaxAttempts: 5, Backoff: 10 * time.Millisecond}, Logger: slog.New(slog.DiscardHandler)},
		Brokers: brokers, Topic: topic, Group: topic + "-g",
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	dlq, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic+".dlq"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dlq.Close)
	var dead []*kgo.Record
	for len(dead) == 0 {
		fs := dlq.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no message reached the dead-letter topic")
		}
		fs.EachRecord(func(r *kgo.Record) { dead = append(dead, r) })
	}
	testenv.Eventually(t, 30*time.Second, "every accepted message", func() bool { return len(p.counts()) == sinkE2EMessages })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	sinkE2ECheck(t, p)
	if len(dead) != 1 || string(dead[0].Value) != string(sinkE2EBody(7)) {
		t.Fatalf("dead-lettered %d records (%q), want only message 7", len(dead), dead[0].Value)
	}
	headers := map[string]string{}
	for _, h := range dead[0].Headers {
		headers[h.Key] = string(h.Value)
	}
	if headers[consumer.HeaderAttempts] != "1" || headers[kafka.HeaderOriginalTopic] != topic {
		t.Fatalf("dead-letter headers = %v", headers)
	}
}

// TestSinkRejectionIsDeadLetteredRabbitMQ: the same through RabbitMQ, whose
// queue's dead-letter exchange takes the rejected message.
func TestSinkRejectionIsDeadLetteredRabbitMQ(t *testing.T) {
	t.Parallel()
	url := testenv.AMQPURL(t)
	queue := fmt.Sprintf("sms-%d", time.Now().UnixNano())
	p, h, l := sinkE2ESetup(t)
	ctx := testenv.Context(t, 60*time.Second)
	c, err := rabbitmq.New(rabbitmq.Config{
		URL:      url,
		Queue:    queue,
		Prefetch: 10,
		Declare:  true,
		Options: consumer.Options{
			Limiter: l,
			Retry:   consumer.RetryPolicy{MaxAttempts: 5, Backoff: 10 * time.Millisecond},
			Logger:  slog.New(slog.DiscardHandler),
		},
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch.QueueDelete(queue, false, false, false)
		ch.QueueDelete(queue+".dlq", false, false, false)
		ch.ExchangeDelete(queue+".dlx", false, false)
	})
	// The consumer declares the queue; publish once it exists.
	testenv.Eventually(t, 30*time.Second, "the queue to be declared", func() bool {
		probe, err := conn.Channel()
		if err != nil {
			return false
		}
		defer probe.Close()
		_, err = probe.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil
	})
	for i := range sinkE2EMessages {
		err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("m%d", i), ContentType: "application/json", Body: sinkE2EBody(i),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, "every accepted message", func() bool { return len(p.counts()) == sinkE2EMessages })
	var dead amqp.Delivery
	testenv.Eventually(t, 30*time.Second, "the rejected message in the dead-letter queue", func() bool {
		d, ok, err := ch.Get(queue+".dlq", true)
		if ok && err == nil {
			dead = d
		}
		return ok
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	sinkE2ECheck(t, p)
	if dead.MessageId != "m7" {
		t.Fatalf("dead-lettered message %q, want m7", dead.MessageId)
	}
	if _, ok, _ := ch.Get(queue+".dlq", true); ok {
		t.Fatal("more than one message was dead-lettered")
	}
}
