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

	"github.com/throttlehq/throttle/consumer"
)

// partState is one assigned partition during one generation.
type partState struct {
	partition int

	mu      sync.Mutex
	tracker *offsetTracker
	// committed is the last offset committed in this generation, or -1.
	committed int64
}

func newPartState(partition int) *partState {
	return &partState{partition: partition, tracker: newOffsetTracker(), committed: -1}
}

// commitFunc commits offsets (partition → next offset to read) of the
// consumer's topic in the current generation.
type commitFunc func(offsets map[int]int64) error

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
}

func newCommitter(commit commitFunc, parts []*partState, log *slog.Logger) *committer {
	return &committer{commit: commit, parts: parts, log: log, wakeC: make(chan struct{}, 1)}
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
		_, err := c.commitMoved()
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
		if consumer.Sleep(ctx, delay) != nil {
			return
		}
		c.wake()
	}
}

// flush commits what moved, retrying until it succeeds, ctx ends or the
// group refuses the generation, and returns the committed offsets of every
// partition that has one.
func (c *committer) flush(ctx context.Context) (map[int]int64, error) {
	for failures := 0; ; failures++ {
		_, err := c.commitMoved()
		if err == nil || !retriableCommit(err) {
			return c.committed(), err
		}
		if consumer.Sleep(ctx, backoff.Delay(failures)) != nil {
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

// commitMoved makes one commit call for the partitions whose position
// moved since their last commit, and returns what it committed.
func (c *committer) commitMoved() (map[int]int64, error) {
	var offsets map[int]int64
	for _, p := range c.parts {
		p.mu.Lock()
		pos, ok := p.tracker.position()
		if ok && pos > p.committed {
			if offsets == nil {
				offsets = make(map[int]int64)
			}
			offsets[p.partition] = pos
		}
		p.mu.Unlock()
	}
	if len(offsets) == 0 {
		return nil, nil
	}
	if err := c.commit(offsets); err != nil {
		return nil, fmt.Errorf("committing %d partition offsets: %w", len(offsets), err)
	}
	for _, p := range c.parts {
		if pos, ok := offsets[p.partition]; ok {
			p.mu.Lock()
			p.committed = max(p.committed, pos)
			p.mu.Unlock()
		}
	}
	return offsets, nil
}

// committed returns the offsets committed in this generation.
func (c *committer) committed() map[int]int64 {
	out := make(map[int]int64)
	for _, p := range c.parts {
		p.mu.Lock()
		if p.committed >= 0 {
			out[p.partition] = p.committed
		}
		p.mu.Unlock()
	}
	return out
}

// formatOffsets renders partition offsets for a log line: "0:12 3:40".
func formatOffsets(offsets map[int]int64) string {
	ps := make([]int, 0, len(offsets))
	for p := range offsets {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(p))
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(offsets[p], 10))
	}
	return b.String()
}
