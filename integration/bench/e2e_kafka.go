package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaPartitions is the topic's partition count; both consumers handle
// that many partitions in parallel (throttle's source.kafka.concurrency).
const kafkaPartitions = 16

type kafkaSource struct {
	brokers []string
	runID   string
	seq     int
	// bareQueue is what each bare worker queues of its own.
	bareQueue int
	// ordering is throttle's kafka.ordering: partition, key (by
	// recipient) or none.
	ordering string
}

func newKafkaSource(brokers []string, bareQueue int, ordering string) *kafkaSource {
	return &kafkaSource{brokers: brokers, runID: randomID(), bareQueue: bareQueue, ordering: ordering}
}

func (s *kafkaSource) name() string { return "kafka" }

// prepare creates a fresh topic and produces n messages, spread evenly
// over its partitions.
func (s *kafkaSource) prepare(ctx context.Context, n int) (prepared, error) {
	s.seq++
	p := &kafkaTopic{
		bareQueue: s.bareQueue,
		ordering:  s.ordering,
		brokers:   s.brokers,
		topic:     fmt.Sprintf("bench-e2e-%s-%d", s.runID, s.seq),
		group:     fmt.Sprintf("bench-e2e-%s-%d", s.runID, s.seq),
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, kafkaPartitions, 1, nil, p.topic); err != nil {
		return nil, fmt.Errorf("creating topic %s: %w", p.topic, err)
	}
	const batch = 2000
	for i := 0; i < n; i += batch {
		recs := make([]*kgo.Record, 0, batch)
		for j := i; j < min(n, i+batch); j++ {
			recs = append(recs, &kgo.Record{
				Topic: p.topic, Partition: int32(j % kafkaPartitions),
				Value: fmt.Appendf(nil, `{"to":"+15550%06d","text":"message %d"}`, j, j),
			})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return nil, fmt.Errorf("producing to %s: %w", p.topic, err)
		}
	}
	return p, nil
}

// kafkaTopic is one filled topic, with the group that consumes it.
type kafkaTopic struct {
	brokers      []string
	topic, group string
	bareQueue    int
	ordering     string
}

// kafkaMaxInFlight is throttle's kafka.max_in_flight under ordering key
// or none: RabbitMQ's handlers in these runs.
const kafkaMaxInFlight = 100

func (p *kafkaTopic) throttleConfig() string {
	base := fmt.Sprintf(`  kafka:
    brokers: [%s]
    topic: %s
    group: %s`, p.brokers[0], p.topic, p.group)
	switch p.ordering {
	case "key", "none":
		base += "\n    ordering: " + p.ordering
		if p.ordering == "key" {
			base += "\n    ordering_key: '{{.JSON.to}}'"
		}
		return base + fmt.Sprintf("\n    max_in_flight: %d", kafkaMaxInFlight)
	}
	return base + fmt.Sprintf(`
    concurrency: %d`, kafkaPartitions)
}

// bare is a bare kafka-go loop with throttle's commit semantics: one
// worker per partition handles its messages in order, one POST each, and a
// committer commits the highest handled offset of each partition, batched:
// whatever was handled while the previous commit was in flight goes in the
// next one. The reader is configured as throttle run configures its own
// (1 s fetch wait, 32 queued messages); each worker queues up to
// bareQueue messages of its own (32 unless -e2e-bare-queue), so that one
// busy partition does not hold up the fetch of the others. Once one
// worker's queue is full the fetch loop waits for it, and the other
// workers may run dry: with a sink that takes milliseconds, a larger
// queue keeps them busy.
func (p *kafkaTopic) bare(ctx context.Context, sinkURL string) error {
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:       p.brokers,
		GroupID:       p.group,
		Topic:         p.topic,
		MaxWait:       time.Second,
		QueueCapacity: 32,
		StartOffset:   kafkago.FirstOffset,
	})
	defer r.Close()
	client := bareHTTPClient(kafkaPartitions)
	defer client.CloseIdleConnections()

	var (
		mu      sync.Mutex
		pending = map[int]kafkago.Message{}
		kick    = make(chan struct{}, 1)
	)
	commit := func() error {
		mu.Lock()
		msgs := make([]kafkago.Message, 0, len(pending))
		for _, m := range pending {
			msgs = append(msgs, m)
		}
		clear(pending)
		mu.Unlock()
		if len(msgs) == 0 {
			return nil
		}
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return r.CommitMessages(cctx, msgs...)
	}
	committerDone := make(chan error, 1)
	stopCommitter := make(chan struct{})
	go func() {
		for {
			select {
			case <-kick:
				if err := commit(); err != nil {
					committerDone <- err
					return
				}
			case <-stopCommitter:
				committerDone <- commit()
				return
			}
		}
	}()

	work := make([]chan kafkago.Message, kafkaPartitions)
	hctx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for i := range work {
		work[i] = make(chan kafkago.Message, p.bareQueue)
		wg.Go(func() {
			for m := range work[i] {
				for !post(hctx, client, sinkURL, m.Value) {
					time.Sleep(100 * time.Millisecond) // retry until delivered
				}
				mu.Lock()
				pending[m.Partition] = m
				mu.Unlock()
				select {
				case kick <- struct{}{}:
				default:
				}
			}
		})
	}
	var ferr error
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() == nil {
				ferr = err
			}
			break
		}
		work[m.Partition%kafkaPartitions] <- m
	}
	for _, w := range work {
		close(w)
	}
	wg.Wait()
	close(stopCommitter)
	return errors.Join(ferr, <-committerDone)
}

func (p *kafkaTopic) left(ctx context.Context) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.brokers...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	lags, err := kadm.NewClient(cl).Lag(ctx, p.group)
	if err != nil {
		return 0, err
	}
	if err := lags.Error(); err != nil {
		return 0, err
	}
	return lags[p.group].Lag.Total(), nil
}

func (p *kafkaTopic) cleanup() {
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.brokers...))
	if err != nil {
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = kadm.NewClient(cl).DeleteTopics(ctx, p.topic)
}
