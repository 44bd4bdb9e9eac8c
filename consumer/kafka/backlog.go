package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
)

// Backlog returns the consumer group's lag: for every partition of the
// topic, and of the delay topic with Options.SetAside, the last offset minus
// the group's committed offset, summed. That is the number of messages the
// group has not committed yet, including those that a replica fetched or is
// handling and those set aside until they are due. BacklogParts tells the
// two apart; Backlog is their Total.
func (c *Consumer) Backlog(ctx context.Context) (int64, error) {
	return kit.BacklogTotal(c.BacklogParts(ctx))
}

// BacklogParts returns the consumer group's lag on the topic as Ready and,
// with Options.SetAside, its lag on the delay topic as SetAside: the
// messages set aside and not handled again yet, due or not. A delay topic
// that does not exist yet (Run creates it) counts 0.
//
// A partition without a committed offset counts from where the group would
// start on it (Config.StartOffset): all its messages with FirstOffset, the
// default, and none with LastOffset. A committed offset below the
// partition's first offset, whose messages retention deleted, counts from
// the first offset. The parts are never negative. The last offset honours
// the reader's IsolationLevel.
//
// The value belongs to the group, not to this replica: every replica of
// the group reports the same value, so a dashboard that collects it from
// several replicas should aggregate with max, not sum.
//
// Each call makes three round trips, for both topics at once: ListOffsets
// to the partition leaders for the first and last offsets, then
// FindCoordinator and OffsetFetch for the group's committed offsets. The
// partitions come from cluster metadata that the client caches and
// refreshes in the background every few seconds, so a partition added to
// a topic, or a delay topic just created, is counted a few seconds later.
// That suits a metric read every few seconds, not a call per message.
//
// BacklogParts reads the group's offsets from the brokers, so it works
// whether Run is running, has not started, or has returned. It is safe for
// concurrent use. ctx bounds the call; give it a deadline, since a broker
// that accepts connections but does not answer holds the call until ctx
// ends. The connections are kept for the next call until Close, after
// which it returns an error wrapping consumer.ErrStopped. A per-partition error in a
// broker's response fails the call, naming the partition.
func (c *Consumer) BacklogParts(ctx context.Context) (consumer.Backlog, error) {
	wrap := func(err error) error {
		return fmt.Errorf("reading lag of group %q on topic %q: %w", c.cfg.Group, c.cfg.Topic, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return consumer.Backlog{}, wrap(consumer.ErrStopped)
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
		return consumer.Backlog{}, wrap(err)
	}
	b, err := c.backlog(ctx)
	if err != nil {
		return consumer.Backlog{}, wrap(err)
	}
	return b, nil
}

// backlogTopics returns the topics whose lag BacklogParts reads: the topic,
// and the delay topic with Options.SetAside.
func (c *Consumer) backlogTopics() []string {
	if c.cfg.SetAside {
		return []string{c.cfg.Topic, c.cfg.DelayTopic}
	}
	return []string{c.cfg.Topic}
}

// partitionName names a partition in BacklogParts' errors: by its number
// alone on the topic, which the error names already.
func (c *Consumer) partitionName(tp topicPartition) string {
	if tp.topic == c.cfg.Topic {
		return fmt.Sprintf("partition %d", tp.partition)
	}
	return fmt.Sprintf("partition %d of %q", tp.partition, tp.topic)
}

func (c *Consumer) backlog(ctx context.Context) (consumer.Backlog, error) {
	topics := c.backlogTopics()
	md, err := c.admin.Metadata(ctx, &kafkago.MetadataRequest{Topics: topics})
	if err != nil {
		return consumer.Backlog{}, fmt.Errorf("listing partitions: %w", err)
	}
	partitions := make(map[string][]int, len(topics))
	var all []topicPartition
	for _, t := range md.Topics {
		if !slices.Contains(topics, t.Name) {
			continue
		}
		if t.Error != nil {
			if t.Name == c.cfg.DelayTopic && errors.Is(t.Error, kafkago.UnknownTopicOrPartition) {
				continue // not created yet: nothing was set aside
			}
			if t.Name != c.cfg.Topic {
				return consumer.Backlog{}, fmt.Errorf("listing partitions of %q: %w", t.Name, t.Error)
			}
			return consumer.Backlog{}, fmt.Errorf("listing partitions: %w", t.Error)
		}
		for _, p := range t.Partitions {
			partitions[t.Name] = append(partitions[t.Name], p.ID)
			all = append(all, topicPartition{t.Name, p.ID})
		}
	}
	if len(partitions[c.cfg.Topic]) == 0 {
		return consumer.Backlog{}, errors.New("listing partitions: the metadata lists none")
	}

	reqs := make(map[string][]kafkago.OffsetRequest, len(partitions))
	for t, ps := range partitions {
		for _, p := range ps {
			reqs[t] = append(reqs[t], kafkago.FirstOffsetOf(p), kafkago.LastOffsetOf(p))
		}
	}
	lo, err := c.admin.ListOffsets(ctx, &kafkago.ListOffsetsRequest{
		Topics:         reqs,
		IsolationLevel: c.rc.IsolationLevel,
	})
	if err != nil {
		return consumer.Backlog{}, fmt.Errorf("listing offsets: %w", err)
	}
	bounds := make(map[topicPartition]kafkago.PartitionOffsets, len(all))
	for t, pos := range lo.Topics {
		for _, po := range pos {
			tp := topicPartition{t, po.Partition}
			if po.Error != nil {
				return consumer.Backlog{}, fmt.Errorf("listing offsets of %s: %w", c.partitionName(tp), po.Error)
			}
			bounds[tp] = po
		}
	}

	of, err := c.admin.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{
		GroupID: c.cfg.Group,
		Topics:  partitions,
	})
	if err != nil {
		return consumer.Backlog{}, fmt.Errorf("fetching committed offsets: %w", err)
	}
	committed := make(map[topicPartition]int64, len(all))
	switch {
	case errors.Is(of.Error, kafkago.GroupIdNotFound):
		// A group that never committed may not exist yet: Kafka answers
		// -1 for each partition then, other brokers (kfake) this error.
		// Both mean that nothing is committed.
		for _, tp := range all {
			committed[tp] = -1
		}
	case of.Error != nil:
		return consumer.Backlog{}, fmt.Errorf("fetching committed offsets: %w", of.Error)
	default:
		for t, ps := range of.Topics {
			for _, p := range ps {
				tp := topicPartition{t, p.Partition}
				if p.Error != nil {
					return consumer.Backlog{}, fmt.Errorf("fetching committed offset of %s: %w", c.partitionName(tp), p.Error)
				}
				committed[tp] = p.CommittedOffset
			}
		}
	}

	start := c.rc.StartOffset
	if start == 0 {
		start = kafkago.FirstOffset // kafka-go's default
	}
	var b consumer.Backlog
	for _, tp := range all {
		bd, ok := bounds[tp]
		if !ok {
			return consumer.Backlog{}, fmt.Errorf("listing offsets: no answer for %s", c.partitionName(tp))
		}
		at, ok := committed[tp]
		if !ok {
			return consumer.Backlog{}, fmt.Errorf("fetching committed offsets: no answer for %s", c.partitionName(tp))
		}
		lag := partitionLag(bd.FirstOffset, bd.LastOffset, at, start)
		if tp.topic == c.cfg.Topic {
			b.Ready += lag
		} else {
			b.SetAside += lag
		}
	}
	return b, nil
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
