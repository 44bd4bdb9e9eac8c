package integration

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestLayersKafkaDelayEndToEnd runs the binary on a Kafka topic (kfake)
// with a per-recipient bucket of 5/s, burst 1, on_exceed delay: the
// messages that must wait go to the delay topic "<topic>.delay", which the
// binary creates and its group consumes, and come back when due. Every
// message is delivered, none is dead-lettered, no recipient gets two
// messages closer than the layer allows, and the group commits both
// topics to their ends. With two replicas, one killed with SIGKILL
// mid-run, nothing is lost.
func TestLayersKafkaDelayEndToEnd(t *testing.T) {
	bin := cliBuild(t)
	t.Run("one replica", func(t *testing.T) {
		const recipients, perRecip = 4, 6
		e := newKafkaDelayE2E(t, bin)
		e.start()
		e.waitMembers(1, 30*time.Second)
		start := time.Now()
		e.produceTo(recipients, perRecip)
		e.waitDelivered(recipients*perRecip, 30*time.Second)
		took := time.Since(start)
		if code := e.replicas[0].stop(t, 30*time.Second); code != 0 {
			t.Fatalf("exit %d after SIGTERM", code)
		}
		requests, unique := e.sink.counts()
		closest := closestPerRecipient(e.sink, recipients)
		delayed := e.endSum(e.topic + ".delay")
		t.Logf("%d messages to %d recipients at 5/s each: all delivered in %v, %d requests, closest pair to one recipient %v apart, %d writes to the delay topic",
			unique, recipients, took.Round(time.Millisecond), requests, closest.Round(time.Millisecond), delayed)
		if requests != unique {
			t.Errorf("%d requests for %d messages: duplicates without a crash", requests, unique)
		}
		// 5/s is 200 ms apart; the grant is decided by Redis's clock and
		// the arrival stamped by the sink's, after an HTTP hop.
		if closest < 160*time.Millisecond {
			t.Errorf("two messages to one recipient arrived %v apart, want >= 200ms (5/s) less jitter", closest)
		}
		if delayed == 0 {
			t.Error("nothing was written to the delay topic")
		}
		// A recipient's 6 messages need 1 s at 5/s; serialised recipients
		// (a handler waiting out each delay) would need 4.8 s.
		if took > 4*time.Second {
			t.Errorf("delivering %d messages took %v: recipients held each other up", recipients*perRecip, took)
		}
		if n := e.endSum(e.topic + ".dlq"); n != 0 {
			t.Errorf("%d messages dead-lettered, want none", n)
		}
		e.checkCommittedToEnd(e.topic)
		e.checkCommittedToEnd(e.topic + ".delay")
	})
	t.Run("SIGKILL mid-run", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits for the group's 30s session timeout")
		}
		const recipients, perRecip = 8, 10
		e := newKafkaDelayE2E(t, bin)
		e.start()
		killed := e.start()
		e.waitMembers(2, 30*time.Second)
		e.produceTo(recipients, perRecip)
		cliWait(t, 30*time.Second, "messages in the delay topic and a third delivered", func() bool {
			_, unique := e.sink.counts()
			return unique >= recipients*perRecip/3 && e.endSum(e.topic+".delay") > 0
		})
		if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-killed.done
		e.waitDelivered(recipients*perRecip, 90*time.Second)
		if code := e.replicas[0].stop(t, 30*time.Second); code != 0 {
			t.Fatalf("the survivor exited %d after SIGTERM", code)
		}
		requests, unique := e.sink.counts()
		dups, _ := e.duplicates()
		closest := closestPerRecipient(e.sink, recipients)
		t.Logf("SIGKILL: %d of %d messages delivered, %d requests, %d duplicates, closest pair to one recipient %v apart, %d writes to the delay topic",
			unique, recipients*perRecip, requests, dups, closest.Round(time.Millisecond), e.endSum(e.topic+".delay"))
		if unique != recipients*perRecip {
			t.Errorf("%d distinct messages arrived, want %d: a crash must lose nothing", unique, recipients*perRecip)
		}
		if closest < 160*time.Millisecond {
			t.Errorf("two messages to one recipient arrived %v apart, want >= 200ms (5/s) less jitter", closest)
		}
		if n := e.endSum(e.topic + ".dlq"); n != 0 {
			t.Errorf("%d messages dead-lettered, want none", n)
		}
	})
}

// newKafkaDelayE2E is a kafkaE2E whose replicas have a per-recipient layer
// of 5/s, burst 1, on_exceed delay, keyed by the body's "to".
func newKafkaDelayE2E(t *testing.T, bin string) *kafkaE2E {
	e := newKafkaE2EWith(t, bin, 1000, 4)
	e.burst = 1000
	e.conc = 4
	e.extraLimit = `  extra:
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 5/s
      burst: 1
      on_exceed: delay
`
	return e
}

// produceTo writes perRecip messages to each of recipients recipients,
// {"id":N,"to":"r<N mod recipients>"}, keyed by the recipient, round-robin
// over the partitions.
func (e *kafkaE2E) produceTo(recipients, perRecip int) {
	e.t.Helper()
	cl := suiteKgo(e.t, e.brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for id := range recipients * perRecip {
		to := fmt.Sprintf("r%d", id%recipients)
		recs = append(recs, &kgo.Record{Topic: e.topic, Partition: int32(id) % e.partitions,
			Key: []byte(to), Value: fmt.Appendf(nil, `{"id":%d,"to":%q}`, id, to)})
	}
	ctx := testenv.Context(e.t, 30*time.Second)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("producing: %v", err)
	}
}

// endSum returns the number of records written to topic: the sum of its
// partitions' end offsets, 0 when it does not exist.
func (e *kafkaE2E) endSum(topic string) int64 {
	e.t.Helper()
	ctx := testenv.Context(e.t, 10*time.Second)
	ends, err := e.admin.ListEndOffsets(ctx, topic)
	if err != nil {
		e.t.Fatalf("end offsets of %s: %v", topic, err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			n += o.Offset
		}
	})
	return n
}

// checkCommittedToEnd fails the test unless the group committed every
// partition of topic at its end.
func (e *kafkaE2E) checkCommittedToEnd(topic string) {
	e.t.Helper()
	ctx := testenv.Context(e.t, 10*time.Second)
	ends, err := e.admin.ListEndOffsets(ctx, topic)
	if err != nil {
		e.t.Fatalf("end offsets of %s: %v", topic, err)
	}
	offs, err := e.admin.FetchOffsets(ctx, e.group)
	if err != nil {
		e.t.Fatalf("offsets of group %s: %v", e.group, err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		got, ok := offs.Lookup(topic, o.Partition)
		if o.Offset > 0 && (!ok || got.At != o.Offset) {
			e.t.Errorf("%s/%d: committed %d, want its end %d", topic, o.Partition, got.At, o.Offset)
		}
	})
}

// closestPerRecipient returns the shortest time between two arrivals at
// the sink for one recipient, message id going to recipient id mod
// recipients.
func closestPerRecipient(sink *cliSink, recipients int) time.Duration {
	sink.mu.Lock()
	defer sink.mu.Unlock()
	last := map[int]time.Time{}
	closest := time.Hour
	for _, a := range sink.arrivals {
		r := a.id % recipients
		if prev, ok := last[r]; ok && a.at.Sub(prev) < closest {
			closest = a.at.Sub(prev)
		}
		last[r] = a.at
	}
	return closest
}
