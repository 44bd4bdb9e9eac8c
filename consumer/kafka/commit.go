package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// offsetCommitter is what the committer needs from a kafka-go Reader.
type offsetCommitter interface {
	CommitMessages(ctx context.Context, msgs ...kafkago.Message) error
}

type topicPartition struct {
	topic     string
	partition int
}

// committer commits the highest handled offset of each partition. Workers
// add messages without blocking; run commits whatever is pending as soon as
// the previous commit returned, so one broker call covers every message
// handled meanwhile. A failed commit is put back and retried with backoff.
//
// A committer is safe for concurrent use by the workers; run and flush must
// not overlap.
type committer struct {
	r       offsetCommitter
	timeout time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	pending map[topicPartition]kafkago.Message
	wake    chan struct{}
}

func newCommitter(r offsetCommitter, timeout time.Duration, log *slog.Logger) *committer {
	return &committer{
		r:       r,
		timeout: timeout,
		log:     log,
		pending: make(map[topicPartition]kafkago.Message),
		wake:    make(chan struct{}, 1),
	}
}

// add records that m was handled. The caller must add the messages of one
// partition in offset order, after all earlier ones were handled.
func (c *committer) add(m kafkago.Message) {
	c.put([]kafkago.Message{m})
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// put merges msgs into pending, keeping the highest offset per partition.
func (c *committer) put(msgs []kafkago.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		k := topicPartition{m.Topic, m.Partition}
		if p, ok := c.pending[k]; !ok || m.Offset > p.Offset {
			c.pending[k] = m
		}
	}
}

func (c *committer) take() []kafkago.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	msgs := make([]kafkago.Message, 0, len(c.pending))
	for k, m := range c.pending {
		msgs = append(msgs, m)
		delete(c.pending, k)
	}
	return msgs
}

// run commits pending offsets until ctx ends. A commit in progress when ctx
// ends is put back for flush.
func (c *committer) run(ctx context.Context) {
	var delay time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		err := c.commit(ctx)
		if err == nil {
			delay = 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		delay = nextBackoff(delay)
		c.log.Warn("commit failed; retrying", "error", err, "retry_in", delay)
		if sleep(ctx, delay) != nil {
			return
		}
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// flush commits what is pending, retrying until it succeeds or ctx ends.
func (c *committer) flush(ctx context.Context) error {
	var delay time.Duration
	for {
		err := c.commit(ctx)
		if err == nil {
			return nil
		}
		delay = nextBackoff(delay)
		if sleep(ctx, delay) != nil {
			return err
		}
	}
}

// commit makes one commit call for everything pending.
func (c *committer) commit(ctx context.Context) error {
	msgs := c.take()
	if len(msgs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if err := c.r.CommitMessages(ctx, msgs...); err != nil {
		c.put(msgs)
		return fmt.Errorf("committing %d partition offsets: %w", len(msgs), err)
	}
	return nil
}
