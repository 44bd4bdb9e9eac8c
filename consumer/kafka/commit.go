package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/throttlehq/throttle/consumer/internal/kit"
)

// partState is one assigned partition during one generation.
type partState struct {
	topicPartition
	// index is the partition's position among the generation's
	// partitions: the source it takes fetch slots for (genRun.slots).
	index int
	// delay is set for a partition of the delay topic: the fetcher waits
	// for each message to be due (genRun.waitDue).
	delay bool

	// skip lists the messages the previous owner finished after the
	// committed offset (OrderKey, OrderNone): they are not handled again.
	skip finishedSet

	mu      sync.Mutex
	tracker *offsetTracker
	// committed is the last offset committed in this generation, or -1;
	// meta the metadata committed with it.
	committed int64
	meta      string
}

func newPartState(tp topicPartition) *partState {
	return &partState{topicPartition: tp, tracker: newOffsetTracker(), committed: -1}
}

// commitFunc commits offsets (partition → next offset to read) of the
// consumer's topic and delay topic in the current generation, with
// metadata (partition → finishedMetadata) when it is not nil. It must not
// keep the maps: the committer reuses them.
type commitFunc func(offsets map[topicPartition]int64, metadata map[topicPartition]string) error

// committer commits, for each partition of a generation, the end of the
// longest prefix of finished messages. Workers wake it without blocking;
// run commits whatever moved as soon as the previous commit returned, so
// one broker call covers every message finished meanwhile. A failed commit
// is retried with backoff.
//
// wake is safe for concurrent use; run and flush must not overlap.
type committer struct {
	commit commitFunc
	parts  []*partState
	log    *slog.Logger
	wakeC  chan struct{}
	// withMeta commits, with each offset, the messages that finished
	// after it (finishedMetadata), for orderings that finish out of order;
	// a partition of the delay topic always does (dueReader).
	withMeta bool
	// offsets and metadata are commitMoved's maps, reused from one
	// commit to the next.
	offsets  map[topicPartition]int64
	metadata map[topicPartition]string
}

func newCommitter(commit commitFunc, parts []*partState, withMeta bool, log *slog.Logger) *committer {
	return &committer{commit: commit, parts: parts, withMeta: withMeta, log: log, wakeC: make(chan struct{}, 1),
		offsets: make(map[topicPartition]int64), metadata: make(map[topicPartition]string)}
}

// wake asks run to commit.
func (c *committer) wake() {
	select {
	case c.wakeC <- struct{}{}:
	default:
	}
}

// run commits until ctx ends.
func (c *committer) run(ctx context.Context) {
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wakeC:
		}
		err := c.commitMoved()
		if err == nil {
			failures = 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		delay := backoff.Delay(failures)
		failures++
		c.log.Warn("commit failed; retrying", "err", err, "retry_in", delay.String())
		if kit.Sleep(ctx, delay) != nil {
			return
		}
		c.wake()
	}
}

// flush commits what moved, retrying until it succeeds, ctx ends or the
// group refuses the generation, and returns the committed offsets of every
// partition that has one.
func (c *committer) flush(ctx context.Context) (map[topicPartition]int64, error) {
	for failures := 0; ; failures++ {
		err := c.commitMoved()
		if err == nil || !retriableCommit(err) {
			return c.committed(), err
		}
		if kit.Sleep(ctx, backoff.Delay(failures)) != nil {
			return c.committed(), err
		}
	}
}

// retriableCommit reports whether a commit that failed with err may
// succeed in the same generation.
func retriableCommit(err error) bool {
	var kerr kafkago.Error
	if errors.As(err, &kerr) {
		switch kerr {
		case kafkago.IllegalGeneration, kafkago.UnknownMemberId, kafkago.RebalanceInProgress,
			kafkago.FencedInstanceID, kafkago.GroupAuthorizationFailed, kafkago.TopicAuthorizationFailed:
			return false
		}
	}
	return true
}

// commitMoved makes one commit call for the partitions whose position, or
// the set of messages finished after it, changed since their last commit.
func (c *committer) commitMoved() error {
	offsets := c.offsets
	clear(offsets)
	var metadata map[topicPartition]string
	for _, p := range c.parts {
		p.mu.Lock()
		pos, ok := p.tracker.position()
		var meta string
		// A partition of the delay topic finishes out of order under
		// every ordering: its copies go in the order they are due.
		withMeta := c.withMeta || p.delay
		if withMeta {
			if !ok {
				// Nothing finished at the start yet; later messages may
				// have. The position is still the first fetched one.
				pos, ok = p.tracker.first, p.tracker.fetched
			}
			if ok {
				meta = p.tracker.finishedMetadata(pos)
			}
		}
		if ok && (pos > p.committed || meta != p.meta) && (pos != p.tracker.first || meta != "") {
			offsets[p.topicPartition] = pos
			if withMeta {
				if metadata == nil {
					metadata = c.metadata
					clear(metadata)
				}
				metadata[p.topicPartition] = meta
			}
		}
		p.mu.Unlock()
	}
	if len(offsets) == 0 {
		return nil
	}
	if err := c.commit(offsets, metadata); err != nil {
		return fmt.Errorf("committing %d partition offsets: %w", len(offsets), err)
	}
	for _, p := range c.parts {
		if pos, ok := offsets[p.topicPartition]; ok {
			p.mu.Lock()
			if pos >= p.committed {
				p.committed, p.meta = pos, metadata[p.topicPartition]
			}
			p.mu.Unlock()
		}
	}
	return nil
}

// committed returns the offsets committed in this generation.
func (c *committer) committed() map[topicPartition]int64 {
	out := make(map[topicPartition]int64)
	for _, p := range c.parts {
		p.mu.Lock()
		if p.committed >= 0 {
			out[p.topicPartition] = p.committed
		}
		p.mu.Unlock()
	}
	return out
}

// formatOffsets renders partition offsets for a log line: "0:12 3:40", the
// partitions of a topic other than topic (the delay topic) after it with
// the topic's name: "0:12 3:40 t.delay/0:7".
func formatOffsets(topic string, offsets map[topicPartition]int64) string {
	tps := make([]topicPartition, 0, len(offsets))
	for tp := range offsets {
		tps = append(tps, tp)
	}
	slices.SortFunc(tps, func(a, b topicPartition) int {
		if (a.topic == topic) != (b.topic == topic) {
			if a.topic == topic {
				return -1
			}
			return 1
		}
		if c := strings.Compare(a.topic, b.topic); c != 0 {
			return c
		}
		return a.partition - b.partition
	})
	var b strings.Builder
	for i, tp := range tps {
		if i > 0 {
			b.WriteByte(' ')
		}
		if tp.topic != topic {
			b.WriteString(tp.topic)
			b.WriteByte('/')
		}
		b.WriteString(strconv.Itoa(tp.partition))
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(offsets[tp], 10))
	}
	return b.String()
}
