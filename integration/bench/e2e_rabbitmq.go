package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// rabbitURL is the RabbitMQ broker of the end-to-end scenario.
var rabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

// rabbitPrefetch and rabbitHandlers are the bare loop: prefetch
// 100, 100 handlers. throttle gets the same prefetch and concurrency.
const (
	rabbitPrefetch = 100
	rabbitHandlers = 100
)

type rabbitSource struct {
	runID string
	seq   int
}

func newRabbitSource(ctx context.Context) (*rabbitSource, error) {
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		return nil, fmt.Errorf("connecting to RabbitMQ at 127.0.0.1:5672: %w", err)
	}
	conn.Close()
	return &rabbitSource{runID: randomID()}, nil
}

func (s *rabbitSource) name() string { return "rabbitmq" }

// prepare declares a fresh queue as throttle's Declare would (durable,
// with a dead-letter exchange), so that both consumers meet the same
// queue, and publishes n messages to it.
func (s *rabbitSource) prepare(ctx context.Context, n int) (prepared, error) {
	s.seq++
	q := fmt.Sprintf("bench-e2e-%s-%d", s.runID, s.seq)
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := declareRabbitQueue(ch, q); err != nil {
		return nil, err
	}
	p := &rabbitQueue{queue: q}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	for i := range n {
		body := fmt.Appendf(nil, `{"to":"+15550%06d","text":"message %d"}`, i, i)
		if _, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false,
			amqp.Publishing{ContentType: "application/json", Body: body}); err != nil {
			p.cleanup()
			return nil, err
		}
	}
	// Confirms come in order: wait for every one.
	deadline := time.Now().Add(time.Minute)
	for {
		qi, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			p.cleanup()
			return nil, err
		}
		if qi.Messages >= n {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.cleanup()
			return nil, fmt.Errorf("queue %s holds %d of %d messages", q, qi.Messages, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// declareRabbitQueue declares queue q as throttle's Declare would:
// durable, dead-lettering to the fanout exchange q.dlx bound to q.dlq.
func declareRabbitQueue(ch *amqp.Channel, q string) error {
	dlx := q + ".dlx"
	if err := ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(q+".dlq", true, false, false, false, nil); err != nil {
		return err
	}
	if err := ch.QueueBind(q+".dlq", "", dlx, false, nil); err != nil {
		return err
	}
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx})
	return err
}

// rabbitQueue is one filled queue.
type rabbitQueue struct{ queue string }

func (p *rabbitQueue) throttleConfig() string {
	return fmt.Sprintf(`  rabbitmq:
    url: %s
    queue: %s
    prefetch: %d
    concurrency: %d
    declare: true`, rabbitURL, p.queue, rabbitPrefetch, rabbitHandlers)
}

// bare is the bare amqp091 loop: prefetch 100, 100 handlers, one
// POST per message, ack after a 2xx (requeue otherwise). Its HTTP client
// keeps up to 100 idle connections to the sink, as a tuned loop would.
func (p *rabbitQueue) bare(ctx context.Context, sinkURL string) error {
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(rabbitPrefetch, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(p.queue, "bench-bare", false, false, false, false, nil)
	if err != nil {
		return err
	}
	client := bareHTTPClient(rabbitHandlers)
	defer client.CloseIdleConnections()
	// Handlers finish the message they hold after ctx ends.
	hctx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for range rabbitHandlers {
		wg.Go(func() {
			for d := range deliveries {
				if post(hctx, client, sinkURL, d.Body) {
					_ = d.Ack(false)
				} else {
					_ = d.Nack(false, true)
				}
			}
		})
	}
	<-ctx.Done()
	// Cancelling closes deliveries once the broker confirms; deliveries
	// already prefetched are still handed out and acked. Closing the
	// connection then returns whatever is unacked to the queue.
	_ = ch.Cancel("bench-bare", false)
	wg.Wait()
	return nil
}

func (p *rabbitQueue) left(ctx context.Context) (int64, error) {
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	qi, err := ch.QueueDeclarePassive(p.queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return int64(qi.Messages), nil
}

func (p *rabbitQueue) cleanup() {
	conn, err := amqp.Dial(rabbitURL)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_, _ = ch.QueueDelete(p.queue, false, false, false)
	_, _ = ch.QueueDelete(p.queue+".dlq", false, false, false)
	_ = ch.ExchangeDelete(p.queue+".dlx", false, false)
}

// bareHTTPClient is the bare loops' client: keep-alive, up to conns idle
// connections to the sink.
func bareHTTPClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
	}, Timeout: 5 * time.Second}
}

// post sends one message to the sink and reports a 2xx.
func post(ctx context.Context, c *http.Client, url string, body []byte) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}
