package kafka

import (
	"sync"

	kafkago "github.com/segmentio/kafka-go"
)

// ReaderStats are counts of what the consumer's group membership and its
// kafka-go partition readers did, so that operators can see the health of
// the broker connections and of rebalances: kafka-go reconnects by itself,
// so Config.Observer's Reconnected is never called for Kafka. Every field
// but PartitionsAssigned is a total since Run started and never decreases.
// A ReaderStats is a plain value, safe to copy.
//
// The connection counts are kafka-go's (kafkago.ReaderStats), which counts
// per partition: the consumer runs one partition reader for each partition
// it owns in a generation.
type ReaderStats struct {
	// Dials counts the attempts, successful or not, to connect to the
	// leader of a partition: one when the consumer starts on a partition
	// (at the join, and again after every rebalance), plus one for each
	// reconnection after a broker or network failure or a leader change.
	// Connections to the group coordinator are not counted.
	Dials int64
	// Errors counts the failed attempts to join the group and the errors
	// that the partition readers retried by themselves: failed connections
	// to a partition leader, and broken connections while fetching. Errors
	// kafka-go passes on to FetchMessage instead, such as those of a
	// leader still unreachable after ReaderConfig.MaxAttempts, are logged
	// by the consumer and not counted here.
	Errors int64
	// Rebalances counts the group generations the consumer joined, the
	// first join included, plus the partitions a reader had to find again
	// because their leader moved (NotLeaderForPartition or
	// UnknownTopicOrPartition).
	Rebalances int64
	// Timeouts counts the fetches that returned no message: kafka-go
	// counts the broker's RequestTimedOut, and also a long poll that
	// ended empty after ReaderConfig.MaxWait. On an idle topic it grows
	// with Fetches, so only Timeouts growing while Messages does not,
	// with messages waiting, hints at trouble.
	Timeouts int64
	// Fetches counts the fetch requests sent to partition leaders. On an
	// idle topic it grows by about one per owned partition per
	// ReaderConfig.MaxWait (DefaultMaxWait unless ConfigureReader sets it).
	Fetches int64
	// Messages counts the messages fetched from the brokers, when they
	// are fetched and before a handler sees them. A message fetched again
	// after a rebalance or a reconnection counts again, and read-ahead
	// messages dropped at a revocation or shutdown count too, so Messages
	// may exceed the messages handled.
	Messages int64
	// Bytes is the size of the keys and values of the messages counted by
	// Messages.
	Bytes int64
	// PartitionsAssigned is the number of partitions this replica owns
	// now: set at each assignment, 0 between a revocation and the next
	// assignment. It is a gauge, not a total.
	PartitionsAssigned int64
	// DroppedAtRevocation counts the messages that were fetched and not
	// started when their partitions were revoked (at a rebalance or at
	// shutdown). They were not handled here and stay uncommitted, so the
	// partition's next owner handles them.
	DroppedAtRevocation int64
	// SkippedOtherGroup counts the messages of the delay topic that
	// another consumer group set aside (HeaderGroup), skipped without
	// handling: groups that share a delay topic read each other's copies.
	SkippedOtherGroup int64
}

// add adds the counts of s, which kafka-go resets on every Stats call, to
// the totals.
func (t *ReaderStats) add(s kafkago.ReaderStats) {
	t.Dials += s.Dials
	t.Errors += s.Errors
	t.Rebalances += s.Rebalances
	t.Timeouts += s.Timeouts
	t.Fetches += s.Fetches
	t.Messages += s.Messages
	t.Bytes += s.Bytes
}

// statsCounter collects ReaderStats from the partition readers, the live
// ones and the closed ones, and the consumer's own counts. It is safe for
// concurrent use.
type statsCounter struct {
	mu     sync.Mutex
	live   map[*kafkago.Reader]struct{}
	totals ReaderStats
	// assigned is Config.Assigned, or nil.
	assigned func(partitions int)
}

// addReader starts counting r.
func (s *statsCounter) addReader(r *kafkago.Reader) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live == nil {
		s.live = make(map[*kafkago.Reader]struct{})
	}
	s.live[r] = struct{}{}
}

// removeReader collects what the closed reader r counted last.
func (s *statsCounter) removeReader(r *kafkago.Reader) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.totals.add(r.Stats())
	delete(s.live, r)
}

func (s *statsCounter) joined() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.totals.Rebalances++
}

func (s *statsCounter) joinFailed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.totals.Errors++
}

func (s *statsCounter) setAssigned(n int) {
	s.mu.Lock()
	s.totals.PartitionsAssigned = int64(n)
	s.mu.Unlock()
	if s.assigned != nil {
		s.assigned(n)
	}
}

func (s *statsCounter) revoked(dropped int64) {
	s.mu.Lock()
	s.totals.PartitionsAssigned = 0
	s.totals.DroppedAtRevocation += dropped
	s.mu.Unlock()
	if s.assigned != nil {
		s.assigned(0)
	}
}

func (s *statsCounter) skippedOtherGroup() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.totals.SkippedOtherGroup++
}

func (s *statsCounter) get() ReaderStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r := range s.live {
		s.totals.add(r.Stats())
	}
	return s.totals
}

// ReaderStats returns the counts of the consumer's group membership and
// partition readers, totalled since Run started. The totals are monotonic:
// a call never returns less, in any field but the gauge
// PartitionsAssigned, than an earlier call, so each such field suits a
// Prometheus counter. Unlike kafka-go's Reader.Stats, which returns the
// counts since its previous call and resets them, ReaderStats does not
// reset anything: any number of callers may read it at any interval.
//
// Before Run it returns zero. After Run returned, it returns the final
// totals, which include everything the readers counted until Run closed
// them. It is safe for concurrent use, with Run and with itself; it does
// not block on the brokers.
func (c *Consumer) ReaderStats() ReaderStats { return c.stats.get() }
