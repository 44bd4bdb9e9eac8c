// Command producer loads sample SMS messages into a Kafka topic, for the
// docker-compose stack and for trying throttle by hand. It creates the topic
// with several partitions (so that throttle replicas in one consumer group
// share it) and its dead-letter topic, writes the messages and exits.
//
//	go run ./examples/producer -brokers 127.0.0.1:29092 -messages 1000
//
// Each message is a JSON SMS such as
//
//	{"id":"sms-000001","to":"+15550000001","text":"Your code is 418230","created_at":"2025-01-02T15:04:05Z"}
//
// keyed by its recipient, so one recipient's messages stay in order in one
// partition. Running it again appends another batch. It waits up to -timeout
// for the brokers, so it may start together with them.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// options are the producer's settings, from its flags.
type options struct {
	brokers    []string
	topic      string
	dlqTopic   string
	partitions int
	messages   int
	recipients int
}

// sms is one sample message.
type sms struct {
	ID        string    `json:"id"`
	To        string    `json:"to"`
	Text      string    `json:"text"`
	CreatedAt time.Time `json:"created_at"`
}

func main() {
	brokers := flag.String("brokers", envOr("KAFKA_BROKERS", "127.0.0.1:9092"), "comma-separated host:port of the seed brokers (default $KAFKA_BROKERS)")
	topic := flag.String("topic", "sms", "topic to create and fill")
	dlq := flag.String("dlq-topic", "", "dead-letter topic to create (default TOPIC.dlq); \"-\" creates none")
	partitions := flag.Int("partitions", 6, "partitions of a topic that does not exist yet")
	messages := flag.Int("messages", 3000, "number of messages to write")
	recipients := flag.Int("recipients", 500, "number of distinct recipients (message keys)")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()

	opts := options{
		brokers:    splitList(*brokers),
		topic:      *topic,
		dlqTopic:   *dlq,
		partitions: *partitions,
		messages:   *messages,
		recipients: *recipients,
	}
	switch opts.dlqTopic {
	case "":
		opts.dlqTopic = opts.topic + ".dlq"
	case "-":
		opts.dlqTopic = ""
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := run(ctx, opts, log); err != nil {
		log.Error("producer failed", "error", err)
		os.Exit(1)
	}
}

// run creates the topics and writes the messages.
func run(ctx context.Context, o options, log *slog.Logger) error {
	switch {
	case len(o.brokers) == 0:
		return errors.New("-brokers names no broker")
	case o.topic == "":
		return errors.New("-topic must not be empty")
	case o.partitions < 1:
		return fmt.Errorf("-partitions %d must be at least 1", o.partitions)
	case o.messages < 0:
		return fmt.Errorf("-messages %d must not be negative", o.messages)
	case o.recipients < 1:
		return fmt.Errorf("-recipients %d must be at least 1", o.recipients)
	}
	topics := []string{o.topic}
	if o.dlqTopic != "" {
		topics = append(topics, o.dlqTopic)
	}
	if err := createTopics(ctx, o.brokers, o.partitions, topics, log); err != nil {
		return err
	}

	w := &kafkago.Writer{
		Addr:         kafkago.TCP(o.brokers...),
		Topic:        o.topic,
		Balancer:     &kafkago.Hash{},
		RequiredAcks: kafkago.RequireAll,
		BatchSize:    500,
		BatchTimeout: 10 * time.Millisecond,
	}
	defer w.Close()
	const batch = 500
	start := time.Now()
	for i := 0; i < o.messages; i += batch {
		msgs := make([]kafkago.Message, 0, min(batch, o.messages-i))
		for j := i; j < min(i+batch, o.messages); j++ {
			m, err := sample(j, o.recipients, start)
			if err != nil {
				return err
			}
			msgs = append(msgs, m)
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return fmt.Errorf("writing messages %d to %d to %s: %w", i, i+len(msgs)-1, o.topic, err)
		}
	}
	log.Info("messages loaded", "topic", o.topic, "messages", o.messages, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// createTopics creates the topics that do not exist yet, retrying while the
// brokers are unreachable or not ready, until ctx ends.
func createTopics(ctx context.Context, brokers []string, partitions int, topics []string, log *slog.Logger) error {
	client := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second}
	req := &kafkago.CreateTopicsRequest{}
	for _, t := range topics {
		req.Topics = append(req.Topics, kafkago.TopicConfig{Topic: t, NumPartitions: partitions, ReplicationFactor: 1})
	}
	backoff := 250 * time.Millisecond
	for {
		resp, err := client.CreateTopics(ctx, req)
		if err == nil {
			var errs []error
			for _, t := range topics {
				switch terr := resp.Errors[t]; {
				case terr == nil:
					log.Info("topic created", "topic", t, "partitions", partitions)
				case errors.Is(terr, kafkago.TopicAlreadyExists):
					log.Info("topic exists", "topic", t)
				default:
					errs = append(errs, fmt.Errorf("creating topic %s: %w", t, terr))
				}
			}
			return errors.Join(errs...)
		}
		log.Info("waiting for the brokers", "brokers", brokers, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("creating topics on %v: %w (last error: %w)", brokers, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// sample returns the i-th sample message, addressed to one of recipients
// numbers.
func sample(i, recipients int, now time.Time) (kafkago.Message, error) {
	m := sms{
		ID:        fmt.Sprintf("sms-%06d", i+1),
		To:        fmt.Sprintf("+1555%07d", i%recipients+1),
		Text:      fmt.Sprintf("Your code is %06d", (i*7919+104729)%1_000_000),
		CreatedAt: now.UTC().Truncate(time.Second),
	}
	body, err := json.Marshal(m)
	if err != nil {
		return kafkago.Message{}, fmt.Errorf("encoding message %s: %w", m.ID, err)
	}
	return kafkago.Message{
		Key:     []byte(m.To),
		Value:   body,
		Headers: []kafkago.Header{{Key: "content-type", Value: []byte("application/json")}},
	}, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
