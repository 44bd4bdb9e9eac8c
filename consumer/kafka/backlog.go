package kafka

import (
	"context"
	"errors"
	"fmt"

	kafkago "github.com/segmentio/kafka-go"
)

// Backlog returns the consumer group's lag on its topic: for every partition,
// the last offset minus the group's committed offset, summed. That is the
// number of messages the group has not committed yet, including those that
// a replica fetched or is handling. A partition without a committed offset
// counts from where the group would start on it (Config.StartOffset): all
// its messages with FirstOffset, the default, and none with LastOffset. A
// committed offset below the partition's first offset, whose messages
// retention deleted, counts from the first offset. The result is never
// negative. The last offset honours the reader's IsolationLevel.
//
// The value belongs to the group, not to this replica: every replica of
// the group reports the same value, so a dashboard that collects it from
// several replicas should aggregate with max, not sum.
//
// Each call makes three round trips: ListOffsets to the partition leaders
// for the first and last offsets, then FindCoordinator and OffsetFetch for
// the group's committed offsets. The partitions come from cluster metadata
// that the client caches and refreshes in the background every few seconds,
// so a partition added to the topic is counted a few seconds later. That
// suits a metric read every few seconds, not a call per message.
//
// Backlog reads the group's offsets from the brokers, so it works whether
// Run is running, has not started, or has returned. It is safe for
// concurrent use. ctx bounds the call; give it a deadline, since a broker
// that accepts connections but does not answer holds the call until ctx
// ends. The connections are kept for the next call until Close, after
// which Backlog returns an error wrapping ErrClosed. A per-partition error
// in a broker's response fails the call, naming the partition.
func (c *Consumer) Backlog(ctx context.Context) (int64, error) {
	wrap := func(err error) error {
		return fmt.Errorf("reading lag of group %q on topic %q: %w", c.cfg.Group, c.cfg.Topic, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, wrap(ErrClosed)
	}
	c.backlogCalls++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.backlogCalls--
		release := c.closed && c.backlogCalls == 0
		c.mu.Unlock()
		if release {
			c.adminTransport.CloseIdleConnections()
		}
	}()
	if err := ctx.Err(); err != nil {
		return 0, wrap(err)
	}
	lag, err := c.backlog(ctx)
	if err != nil {
		return 0, wrap(err)
	}
	return lag, nil
}

func (c *Consumer) backlog(ctx context.Context) (int64, error) {
	topic := c.cfg.Topic
	md, err := c.admin.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("listing partitions: %w", err)
	}
	var partitions []int
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return 0, fmt.Errorf("listing partitions: %w", t.Error)
		}
		for _, p := range t.Partitions {
			partitions = append(partitions, p.ID)
		}
	}
	if len(partitions) == 0 {
		return 0, errors.New("listing partitions: the metadata lists none")
	}

	reqs := make([]kafkago.OffsetRequest, 0, 2*len(partitions))
	for _, p := range partitions {
		reqs = append(reqs, kafkago.FirstOffsetOf(p), kafkago.LastOffsetOf(p))
	}
	lo, err := c.admin.ListOffsets(ctx, &kafkago.ListOffsetsRequest{
		Topics:         map[string][]kafkago.OffsetRequest{topic: reqs},
		IsolationLevel: c.rc.IsolationLevel,
	})
	if err != nil {
		return 0, fmt.Errorf("listing offsets: %w", err)
	}
	bounds := make(map[int]kafkago.PartitionOffsets, len(partitions))
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return 0, fmt.Errorf("listing offsets of partition %d: %w", po.Partition, po.Error)
		}
		bounds[po.Partition] = po
	}

	of, err := c.admin.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{
		GroupID: c.cfg.Group,
		Topics:  map[string][]int{topic: partitions},
	})
	if err != nil {
		return 0, fmt.Errorf("fetching committed offsets: %w", err)
	}
	committed := make(map[int]int64, len(partitions))
	switch {
	case errors.Is(of.Error, kafkago.GroupIdNotFound):
		// A group that never committed may not exist yet: Kafka answers
		// -1 for each partition then, other brokers (kfake) this error.
		// Both mean that nothing is committed.
		for _, p := range partitions {
			committed[p] = -1
		}
	case of.Error != nil:
		return 0, fmt.Errorf("fetching committed offsets: %w", of.Error)
	default:
		for _, p := range of.Topics[topic] {
			if p.Error != nil {
				return 0, fmt.Errorf("fetching committed offset of partition %d: %w", p.Partition, p.Error)
			}
			committed[p.Partition] = p.CommittedOffset
		}
	}

	start := c.rc.StartOffset
	if start == 0 {
		start = kafkago.FirstOffset // kafka-go's default
	}
	var total int64
	for _, p := range partitions {
		b, ok := bounds[p]
		if !ok {
			return 0, fmt.Errorf("listing offsets: no answer for partition %d", p)
		}
		at, ok := committed[p]
		if !ok {
			return 0, fmt.Errorf("fetching committed offsets: no answer for partition %d", p)
		}
		total += partitionLag(b.FirstOffset, b.LastOffset, at, start)
	}
	return total, nil
}

// partitionLag is a partition's share of Backlog: the messages from the
// committed offset, or from where the group starts when it has none
// (committed < 0, as kafka-go reads it), up to the last offset.
func partitionLag(first, last, committed, start int64) int64 {
	from := committed
	if from < 0 {
		if start == kafkago.LastOffset {
			return 0
		}
		from = first
	}
	from = max(from, first)
	return max(last-from, 0)
}
