package kafka

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
)

// HeaderGroup is the one header of a message set aside in the delay topic
// that is Kafka's own, beside those of every backend
// (consumer.HeaderDue, consumer.HeaderSetAsideReason,
// consumer.HeaderAttempts, x-throttle-paid) and the position headers
// HeaderOriginalTopic, HeaderOriginalPartition and
// HeaderOriginalOffset (where it was first consumed from; a
// message set aside again keeps them).
const (
	// HeaderGroup names the consumer group that set the message aside.
	// Groups that consume one topic share its default delay topic; each
	// skips the copies another group wrote, and handles those without the
	// header, written before it existed. A group renamed while copies wait
	// in the delay topic skips the copies set aside under its old name.
	HeaderGroup = "x-throttle-group"
)

// clock tells the time and waits for the heads of the delay topic's
// partitions. The consumer's is the real clock; tests give a fake one.
type clock interface {
	Now() time.Time
	// SleepUntil waits until t or until ctx ends, and then returns ctx's
	// error.
	SleepUntil(ctx context.Context, t time.Time) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) SleepUntil(ctx context.Context, t time.Time) error {
	return kit.Sleep(ctx, time.Until(t))
}

// dueOf returns the due time of a message of the delay topic (consumer.HeaderDue).
// Of several such headers the last one counts, as in ToMessage.
func dueOf(m kafkago.Message) (time.Time, bool) {
	v := lastHeader(m, consumer.HeaderDue)
	if v == nil {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(v))
	return t, err == nil
}

// handOnAt returns when m, a message of the delay topic, is handed on: its
// due time (dueOf), or setaside.PaidLead before it when it comes back with
// a paid slot (setaside.HandOnAt), which the limiter waits for itself.
func handOnAt(m kafkago.Message) (time.Time, bool) {
	due, ok := dueOf(m)
	if !ok {
		return due, false
	}
	return setaside.HandOnAt(due, string(lastHeader(m, setaside.HeaderPaid))), true
}

// lastHeader returns the value of m's last header named key, nil when it
// has none.
func lastHeader(m kafkago.Message, key string) []byte {
	var v []byte
	for _, h := range m.Headers {
		if h.Key == key {
			v = h.Value
		}
	}
	return v
}

// groupOf returns the group that set m aside (HeaderGroup); of several
// such headers the last one counts, as in dueOf. It reports false for a
// copy without the header.
func groupOf(m kafkago.Message) (string, bool) {
	v := lastHeader(m, HeaderGroup)
	return string(v), v != nil
}

// skipOtherGroup reports whether m, a message of the delay topic, was set
// aside by another consumer group (HeaderGroup), and if so marks it
// finished without handling it, so that the commit moves past it: that
// group handles its own copy, whose original this group handled already.
// A copy without the header, written by an older version, is handled.
func (r *genRun) skipOtherGroup(p *partState, m kafkago.Message) bool {
	c := r.c
	group, ok := groupOf(m)
	if !ok || group == c.cfg.Group {
		return false
	}
	r.otherGroup.Add(1)
	c.stats.skippedOtherGroup()
	r.finishUnhandled(p, m.Offset)
	args := []any{"topic", p.topic, "partition", p.partition, "offset", m.Offset,
		"group", c.cfg.Group, "set_aside_by", group}
	if _, logged := c.otherGroupLogged.LoadOrStore(p.topicPartition, struct{}{}); !logged {
		c.log.Info("skipping the copies another consumer group set aside in the delay topic; "+
			"give each group its own delay topic (DelayTopic) to avoid reading them", args...)
	}
	c.log.Debug("delay copy of another consumer group skipped", args...)
	return true
}

// waitDue waits until m, a message of the delay topic, is due (handOnAt:
// a little ahead with a paid slot), and reports false when the partition
// was revoked first. The fetcher calls it for each message its dueReader
// hands it, which is due already, except when the replica's clock went
// back. A message without a valid due time is due at once.
func (r *genRun) waitDue(p *partState, m kafkago.Message) bool {
	c := r.c
	due, ok := handOnAt(m)
	if !ok {
		c.log.Warn("message of the delay topic without a valid due time; handling it now",
			"topic", p.topic, "partition", p.partition, "offset", m.Offset, "header", consumer.HeaderDue)
		return r.rctx.Err() == nil
	}
	if wait := due.Sub(c.clock.Now()); wait > 0 {
		c.log.Debug("delay copy handed on before it is due; waiting",
			"topic", p.topic, "partition", p.partition, "offset", m.Offset, "due", due, "in", wait.String())
		if c.clock.SleepUntil(r.rctx, due) != nil {
			return false
		}
	}
	return r.rctx.Err() == nil
}

// setAside writes the message of w to the delay topic, due out.SetAside
// (at most Options.MaxSetAside) from now, with the headers its handler asked for
// (kit.Outcome.SetAsideHeaders, such as setaside.HeaderPaid), and
// reports it finished once the write succeeded on every
// in-sync replica, so that the commit may move past it. A failed write is
// retried with backoff; at the drain deadline the message is abandoned,
// uncommitted, and handled again by the partition's next owner.
func (c *Consumer) setAside(ctx context.Context, w work, out kit.Outcome, delay *deadLetterer) outcome {
	m := w.m
	out.SetAside = min(out.SetAside, c.proc.Options().MaxSetAside) // back to set aside again if need be
	due := c.clock.Now().Add(out.SetAside).UTC()
	h := c.origin(m)
	// The copy carries setaside.HeaderPaid as w.msg does, not as m does:
	// fetch dropped a producer's; "" removes it (deadLetterHeaders).
	h[setaside.HeaderPaid] = w.msg.Headers[setaside.HeaderPaid]
	for k, v := range out.SetAsideHeaders() { // such as setaside.HeaderPaid
		h[k] = v
	}
	h[consumer.HeaderDue] = due.Format(time.RFC3339Nano)
	h[HeaderGroup] = c.cfg.Group
	h[consumer.HeaderAttempts] = strconv.Itoa(out.Attempts)
	if out.Err != nil {
		h[consumer.HeaderSetAsideReason] = out.Err.Error()
	}
	if err := delay.send(ctx, m, h); err != nil {
		c.log.Warn(kit.LogWriteAbandoned, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
			kit.KeyDestination, delay.topic, "err", err)
		kit.SpanAbandoned(ctx, out.Attempts)
		return abandoned
	}
	c.proc.ReportSetAside(ctx, w.msg, out.SetAside, due, positionAttrs(m, delay.topic)...)
	return finished
}

// origin returns the position headers of m for the dead-letter and delay
// topics: where it was first consumed from. A message of the delay topic
// carries them from when it was set aside.
func (c *Consumer) origin(m kafkago.Message) map[string]string {
	if m.Topic == c.cfg.DelayTopic && c.cfg.SetAside {
		orig := make(map[string]string, 3)
		for _, h := range m.Headers {
			switch h.Key {
			case HeaderOriginalTopic, HeaderOriginalPartition, HeaderOriginalOffset:
				orig[h.Key] = string(h.Value)
			}
		}
		if len(orig) == 3 {
			return orig
		}
	}
	return map[string]string{
		HeaderOriginalTopic:     m.Topic,
		HeaderOriginalPartition: strconv.Itoa(m.Partition),
		HeaderOriginalOffset:    strconv.FormatInt(m.Offset, 10),
	}
}

// ensureDelayTopic makes sure the delay topic exists, creating it with as
// many partitions as the topic (the brokers' default when the topic does
// not exist either) and the brokers' default replication factor. It
// retries a failed lookup with backoff until ctx ends. It reports false,
// after a warning, when the brokers refuse to create it: the handlers then
// wait out the delays.
func (c *Consumer) ensureDelayTopic(ctx context.Context, client *kafkago.Client) bool {
	for failures := 0; ; failures++ {
		ok, err := c.findOrCreateDelayTopic(ctx, client)
		if err == nil {
			return ok
		}
		if ctx.Err() != nil {
			return false
		}
		delay := backoff.Delay(failures)
		c.log.Warn("looking up the delay topic failed; retrying",
			"topic", c.cfg.Topic, "delay_topic", c.cfg.DelayTopic, "err", err, "retry_in", delay.String())
		if kit.Sleep(ctx, delay) != nil {
			return false
		}
	}
}

// findOrCreateDelayTopic is one attempt of ensureDelayTopic. Its error is
// one worth retrying; a refusal is (false, nil).
func (c *Consumer) findOrCreateDelayTopic(ctx context.Context, client *kafkago.Client) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	defer cancel()
	md, err := client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{c.cfg.Topic, c.cfg.DelayTopic}})
	if err != nil {
		return false, err
	}
	partitions := -1
	for _, t := range md.Topics {
		if t.Error != nil || len(t.Partitions) == 0 {
			continue
		}
		switch t.Name {
		case c.cfg.DelayTopic:
			return true, nil
		case c.cfg.Topic:
			partitions = len(t.Partitions)
		}
	}
	resp, err := client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{
		Topic: c.cfg.DelayTopic, NumPartitions: partitions, ReplicationFactor: -1,
	}}})
	if err != nil {
		return false, err
	}
	cerr := resp.Errors[c.cfg.DelayTopic]
	var kerr kafkago.Error
	switch {
	case cerr == nil:
		c.log.Info("delay topic created", "topic", c.cfg.Topic, "delay_topic", c.cfg.DelayTopic, "partitions", partitions)
		c.awaitDelayTopic(ctx, client)
		return true, nil
	case errors.Is(cerr, kafkago.TopicAlreadyExists):
		return true, nil
	case errors.As(cerr, &kerr) && kerr.Temporary():
		return false, cerr
	}
	c.log.Warn(kit.LogNoDelayDestination, "topic", c.cfg.Topic, kit.KeyDestination, c.cfg.DelayTopic,
		"err", fmt.Errorf("the delay topic does not exist and cannot be created: %w", cerr))
	return false, nil
}

// awaitDelayTopic waits, until ctx ends, for the metadata to show the new
// delay topic with a leader for each partition. The group's leader reads
// the metadata of both topics when it assigns the partitions, and kafka-go
// assigns none at all while one of them reports an error, as a topic just
// created may do for a moment.
func (c *Consumer) awaitDelayTopic(ctx context.Context, client *kafkago.Client) {
	for failures := 0; ; failures++ {
		md, err := client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{c.cfg.DelayTopic}})
		if err == nil && delayTopicReady(md, c.cfg.DelayTopic) {
			return
		}
		if kit.Sleep(ctx, backoff.Delay(failures)) != nil {
			c.log.Warn("the delay topic was created but its partitions have no leader yet; joining anyway",
				"topic", c.cfg.Topic, "delay_topic", c.cfg.DelayTopic)
			return
		}
	}
}

// delayTopicReady reports whether md shows topic without error and with a
// leader for each of its partitions.
func delayTopicReady(md *kafkago.MetadataResponse, topic string) bool {
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil || len(t.Partitions) == 0 {
			return false
		}
		for _, p := range t.Partitions {
			if p.Error != nil || p.Leader.Host == "" {
				return false
			}
		}
		return true
	}
	return false
}

// maxDueAhead bounds the copies a dueReader holds, read ahead of the first
// unfinished one of its partition of the delay topic. Beyond it the reader
// waits for the earliest to be due before it reads on, and a copy due
// earlier further on waits that long.
const maxDueAhead = 1024

// dueReader reads a partition of the delay topic ahead and hands its
// copies on in the order they are due (consumer.HeaderDue), each when it is due,
// rather than in the order they were written: copies set aside for
// different delays interleave in a partition, and one due earlier behind
// a later one would otherwise wait for it, late for the slot a delay layer
// booked for it (setaside.HeaderPaid), which is then forfeit and booked
// again. Copies due at the same instant go in offset order.
//
// It adds each copy to its partition's offset tracker as it reads it, in
// offset order, so that the commit never passes a copy it holds; copies
// then finish out of order, and the committer lists the finished ones
// with the offset (finishedMetadata) for the partition's next owner. It
// skips, as it reads them, the copies the previous owner finished and those
// of another group (skipOtherGroup).
//
// A dueReader belongs to its partition's fetcher goroutine: FetchMessage
// is not safe for concurrent use. The copies it holds when ctx ends count
// as dropped.
type dueReader struct {
	r    *genRun
	p    *partState
	rd   partitionReader
	held dueHeap
}

// dueOrder returns the reader of p, a partition of the delay topic, that
// hands rd's copies on when they are due (see dueReader).
func (r *genRun) dueOrder(p *partState, rd partitionReader) partitionReader {
	return &dueReader{r: r, p: p, rd: rd}
}

// dueCopy is a copy read ahead and the instant it is due.
type dueCopy struct {
	m   kafkago.Message
	due time.Time
}

// dueHeap orders copies by due time, then offset.
type dueHeap []dueCopy

func (h dueHeap) Len() int { return len(h) }
func (h dueHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].m.Offset < h[j].m.Offset
}
func (h dueHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)   { *h = append(*h, x.(dueCopy)) }
func (h *dueHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = dueCopy{}
	*h = old[:len(old)-1]
	return c
}

// FetchMessage returns the copy due first once it is due (handOnAt),
// reading on meanwhile. It returns ctx's error when ctx ends, and the
// underlying reader's error as it comes.
func (d *dueReader) FetchMessage(ctx context.Context) (kafkago.Message, error) {
	clock := d.r.c.clock
	for {
		if ctx.Err() != nil {
			d.r.dropped.Add(int64(len(d.held)))
			d.held = nil
			return kafkago.Message{}, ctx.Err()
		}
		if len(d.held) > 0 && !d.held[0].due.After(clock.Now()) {
			return heap.Pop(&d.held).(dueCopy).m, nil
		}
		if len(d.held) >= maxDueAhead {
			_ = clock.SleepUntil(ctx, d.held[0].due)
			continue
		}
		m, err := d.fetchUntilDue(ctx)
		switch {
		case errors.Is(err, errHeadDue):
			continue
		case err != nil:
			if ctx.Err() != nil {
				continue
			}
			return kafkago.Message{}, err
		}
		if d.p.skip.has(m.Offset) {
			// Finished by the previous owner, after its committed offset.
			d.r.skipped.Add(1)
			d.r.finishUnhandled(d.p, m.Offset)
			continue
		}
		if d.r.skipOtherGroup(d.p, m) {
			continue
		}
		due, ok := handOnAt(m)
		if !ok {
			due = time.Time{} // due at once; waitDue logs it
		}
		d.p.mu.Lock()
		d.p.tracker.add(m.Offset)
		d.p.mu.Unlock()
		heap.Push(&d.held, dueCopy{m: m, due: due})
	}
}

// errHeadDue ends a read of the next copy when the copy due first is.
var errHeadDue = errors.New("held copy due")

// fetchUntilDue reads the next copy, until the copy due first that d
// holds is due, if any; then it returns errHeadDue.
func (d *dueReader) fetchUntilDue(ctx context.Context) (kafkago.Message, error) {
	if len(d.held) == 0 {
		return d.rd.FetchMessage(ctx)
	}
	due := d.held[0].due
	fctx, cancel := context.WithCancelCause(ctx)
	timer := make(chan struct{})
	go func() {
		defer close(timer)
		if d.r.c.clock.SleepUntil(fctx, due) == nil {
			cancel(errHeadDue)
		}
	}()
	m, err := d.rd.FetchMessage(fctx)
	cancel(nil)
	<-timer
	if err != nil && errors.Is(context.Cause(fctx), errHeadDue) && ctx.Err() == nil {
		return kafkago.Message{}, errHeadDue
	}
	return m, err
}
