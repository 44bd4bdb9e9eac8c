// Package kafka consumes a Kafka topic as a member of a consumer group and
// calls a consumer.Handler for every message, throttled by a shared limiter
// and at least once. It is built on github.com/segmentio/kafka-go.
//
// The guide in the repository (docs/library.md, Kafka) shows it in use,
// with the measured duplicates at rebalances and crashes.
//
// # Flow
//
// The consumer joins the group with kafka-go's ConsumerGroup, which hands
// it one generation at a time: the partitions this replica owns until the
// next rebalance. For each owned partition a kafka-go partition reader
// fetches messages from the committed offset. Each fetched message takes a
// slot (at most Options.Concurrency + Config.QueueSize messages are
// fetched and not finished; then fetching blocks; a freed slot goes to the
// waiting partition that holds the fewest, and under
// consumer.OrderPartition one partition holds at most its share of the
// slots, at least 2, so that a partition whose message is slow or stuck
// leaves the others room) and goes to a scheduler
// that keeps the order Options.Ordering asks for, with at most
// Options.Concurrency messages handled at once:
//
//   - consumer.OrderPartition (the default): the messages of a partition one at
//     a time, in order; so up to Concurrency partitions in parallel.
//   - consumer.OrderKey: the messages of one key of a partition one at a time,
//     in order; different keys concurrently.
//   - consumer.OrderNone: any messages concurrently.
//
// Ordered lanes (partitions or keys) take turns one message each, so a
// busy lane does not starve the others, and a message waiting for its
// tokens holds back only the later messages of its own lane. With classes
// (Options.Priority), a lane whose next message has a higher class, or
// such a message under consumer.OrderNone, starts first, on a worker that the
// lower classes leave free; and a fetched message of a higher class takes
// a slot that they leave free, so that it is read while lower-class
// messages fill the window (see consumer.Ordering). For each
// message a worker waits on the limiter for the message's cost
// (consumer.Throttle), calls the handler under the retry policy, and
// dead-letters the message when the error is permanent or the attempts run
// out, or sets it aside (see Setting aside). Only a message that was
// delivered, dead-lettered or set aside counts as finished.
//
// # Commits
//
// Kafka keeps one committed offset per partition, and committing an offset
// commits everything before it. Messages of a partition may finish out of
// order (consumer.OrderKey, consumer.OrderNone), so the consumer tracks, per partition,
// which fetched messages finished, in a fixed ring that allocates nothing
// per message, and commits the end of the longest finished prefix: the
// offset of the oldest unfinished message, with the messages that finished
// after it in the commit's metadata (see Rebalances). A crash therefore
// never skips an unfinished message. Workers do not wait for commits: a committer goroutine
// commits whatever moved as soon as the previous commit returned, so
// commits are synchronous (on the broker when the call returns) yet
// batched under load. A failed commit is retried with backoff.
//
// # Rebalances
//
// When a generation ends (a member joined or left, partitions were added),
// the consumer revokes its partitions before it rejoins: it stops fetching;
// drops the messages fetched and not started, cancelling their limiter
// waits so the tokens they reserved are given back; lets the handlers in
// flight finish within Config.DrainTimeout; and commits what finished, in
// the ending generation. The partitions' next owners therefore start after
// every message finished here: a clean rebalance (a replica joins, or
// leaves through Close or its context) redelivers nothing. With OrderKey
// and OrderNone a message dropped while later messages of its partition
// finished keeps the committed offset before it; so that the next owner
// does not handle those later messages again, each commit carries them in
// its metadata (a bitset after the committed offset, up to 8192 offsets)
// and the next owner skips them. Each assignment and revocation is logged
// with the partitions, the messages dropped and skipped, and the offsets
// committed; ReaderStats counts them.
//
// The group waits the RebalanceTimeout (30s by default, ConfigureReader)
// for its members to rejoin, and goes on without the late ones, whose
// commits it then refuses. At a rebalance the drain is therefore cut to
// 4/5 of RebalanceTimeout when DrainTimeout is longer, leaving time for
// the final commit; at shutdown the generation stays live while it drains
// and DrainTimeout applies in full.
// A replica that crashes or loses its connection does not commit: the
// messages it fetched after its last commit, at most its in-flight bound
// (workers + QueueSize per replica), are handled again by the next owner.
//
// # Shutdown
//
// When the context given to Run ends, the consumer revokes its partitions
// as at a rebalance, while its generation is still live (heartbeats go on):
// it stops fetching, drops what did not start, gives in-flight handlers
// Config.DrainTimeout (the context they see is cancelled only at that
// deadline), commits what finished, then leaves the group, so the other
// members take over at once, and Run returns nil. A message that was not
// handled is never committed, so the group's next owner receives it.
//
// # Connection
//
// kafka-go reconnects by itself: the partition readers redial their
// leaders, and the group rejoins after JoinGroupBackoff. A lost
// connection to the group coordinator ends the generation as a rebalance
// does (the partitions are revoked and drained), and the next join fails:
// from then until a join succeeds, Connected returns an error wrapping
// consumer.ErrNotConnected, and the consumer.MessageObserver sees
// Disconnected, a ReconnectAttempt per join, and Reconnected, with the
// same log lines as every backend's (connection lost; reconnecting,
// connect failed; retrying, reconnected). A rebalance alone does not
// disconnect.
//
// # Setting aside
//
// With Options.SetAside, a message whose handler returns a consumer.SetAside
// error (a layered limit with on_exceed delay, through consumer.Throttle)
// is neither retried nor dead-lettered: the consumer writes it to
// Config.DelayTopic ("<topic>.delay") with its key, value and headers plus
// consumer.HeaderDue (now + the delay), the position it was first consumed from
// (HeaderOriginalTopic, ...Partition, ...Offset, kept when it is
// set aside again), consumer.HeaderAttempts, consumer.HeaderSetAsideReason,
// x-throttle-paid (the slots a delay layer booked for it, passed when
// it comes back; honoured only on a message read from the delay topic) and
// HeaderGroup (Config.Group, the group that set it aside). The
// write waits for every in-sync replica and is retried with backoff; only
// once it succeeded does the original count as finished, so the commit may
// pass it. A crash in between handles the message twice, never loses it.
//
// The group consumes the delay topic too: its partitions are assigned,
// drained and committed like the topic's. The reader of a delay partition
// reads ahead (up to 1024 copies) and hands each copy to the normal path
// when it is due, in the order they are due, on one timer at a time
// (ended by a revocation); there it is throttled again. Copies thus finish
// out of order, and, under every Ordering, each commit of a delay
// partition lists those finished after its offset in its metadata, which
// the partition's next owner skips. A delay partition without a committed
// offset is read from its first offset, whatever Config.StartOffset says
// for the topic.
//
// Several groups that consume one topic share its default delay topic.
// Each skips, without handling, the copies another group set aside
// (HeaderGroup): it commits past them, logs each at debug level and the
// first of each partition at info level, and counts them
// (ReaderStats.SkippedOtherGroup). A copy without HeaderGroup, set aside
// by an older version, is handled by whichever group reads it. Such groups
// should preferably each set their own Config.DelayTopic.
//
// A message set aside gives up its place: later messages of its
// partition or key go ahead of it. A copy due earlier than one written
// before it in its delay partition goes first: it does not wait behind
// it. Due times are the writing replica's clock.
//
// Run creates the delay topic, with the topic's partition count and the
// brokers' default settings, when it is missing; its retention must exceed
// the longest delay (a daily quota sets aside for up to a day). When the brokers refuse, it logs a warning and handlers wait out
// the delays instead, as without Options.SetAside. Backlog counts the messages in
// the delay topic too, and BacklogParts reports them apart (SetAside).
//
// # Authentication and TLS
//
// Set Config.Dialer to connect with SASL or TLS. The consumer uses it for
// the group reader and derives the dead-letter and delay writers'
// transport from it:
//
//	mech, err := scram.Mechanism(scram.SHA512, user, password) // or plain.Mechanism{Username: user, Password: password}
//	if err != nil { ... }
//	dialer := &kafkago.Dialer{
//		Timeout:       10 * time.Second,
//		DualStack:     true,
//		TLS:           &tls.Config{MinVersion: tls.VersionTLS12},
//		SASLMechanism: mech,
//	}
//
// with the packages github.com/segmentio/kafka-go/sasl/scram and
// github.com/segmentio/kafka-go/sasl/plain.
package kafka
