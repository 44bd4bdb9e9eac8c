package integration

import (
	"fmt"
	"math"
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
// messages closer than the layer allows, each message set aside is written
// to the delay topic about once (the layer books its slot), and the group
// commits both topics to their ends. A hot recipient's backlog does not hold up the other
// recipients' messages behind it in its partition, as it does under
// on_exceed wait (which writes nothing to the delay topic). With two
// replicas, one killed with SIGKILL mid-run, nothing is lost.
func TestLayersKafkaDelayEndToEnd(t *testing.T) {
	t.Parallel()
	bin := cliBuild(t)
	// One partition: 8 messages to a hot recipient, then one to each of 4
	// cold ones. At 5/s the hot recipient's need 1.4 s.
	const hot, cold = 8, 4
	to := func(id int) string {
		if id < hot {
			return "hot"
		}
		return fmt.Sprintf("cold%d", id-hot)
	}
	var coldWait time.Duration
	for _, action := range []string{"wait", "delay"} {
		t.Run(action, func(t *testing.T) {
			e := newKafkaDelayE2E(t, bin, action)
			e.start()
			e.waitMembers(1, 30*time.Second)
			start := time.Now()
			e.produceTo(hot+cold, to, func(int) int32 { return 0 })
			e.waitDelivered(hot+cold, 30*time.Second)
			took := time.Since(start)
			// The slots the replica could not honour (back later than
			// their lateness under load): each costs one more write.
			_, body := cliGet("http://" + cliServingAddr(t, e.replicas[0]) + "/metrics")
			forfeit := int64(cliMetric(body, "throttle_paid_slots_forfeit_total"))
			if code := e.replicas[0].stop(t, 30*time.Second); code != 0 {
				t.Fatalf("exit %d after SIGTERM", code)
			}
			requests, unique := e.sink.counts()
			sp := spacingPerRecipient(e.sink, to, 200*time.Millisecond)
			coldAt := e.lastArrival(func(id int) bool { return id >= hot }).Sub(start)
			delayed := e.endSum(e.topic + ".delay")
			t.Logf("on_exceed %s: %d messages in one partition, %d to a hot recipient then %d to cold ones, at 5/s per recipient: cold ones delivered %v after producing, all in %v; %d requests, %v, %d writes to the delay topic, %d paid slots forfeit",
				action, unique, hot, cold, coldAt.Round(time.Millisecond), took.Round(time.Millisecond), requests, sp, delayed, forfeit)
			if requests != unique {
				t.Errorf("%d requests for %d messages: duplicates without a crash", requests, unique)
			}
			// 5/s is 200 ms apart (see spacingPerRecipient).
			if !sp.ok() {
				t.Errorf("messages to one recipient above 5/s: %v", sp)
			}
			if n := e.endSum(e.topic + ".dlq"); n != 0 {
				t.Errorf("%d messages dead-lettered, want none", n)
			}
			e.checkCommittedToEnd(e.topic)
			if action == "wait" {
				coldWait = coldAt
				if delayed != 0 {
					t.Errorf("%d writes to the delay topic without a delay layer", delayed)
				}
				return
			}
			if delayed == 0 {
				t.Error("nothing was written to the delay topic")
			}
			// The layer books a slot for each hot message it refuses, which
			// comes back paid (x-throttle-paid): about one write each, not
			// one per message and round (1+2+...+7 = 28), and one more for
			// each slot forfeit (a loaded machine's: 11 and 13 to 15
			// writes in full suites, when nothing counted them).
			if want := int64(hot-1+2) + forfeit; delayed > want {
				t.Errorf("%d writes to the delay topic for %d messages to one recipient, want at most %d: each set aside about once, and again for each of its %d slots forfeit", delayed, hot, want, forfeit)
			}
			if forfeit > hot-1 {
				t.Errorf("%d paid slots forfeit, more than the %d first booked: slots lost again and again", forfeit, hot-1)
			}
			e.checkCommittedToEnd(e.topic + ".delay")
			// Under wait the cold messages come after the hot recipient's
			// 1.4 s; set aside, the hot ones leave the partition at once.
			if coldAt > 700*time.Millisecond {
				t.Errorf("the cold recipients' messages arrived %v after producing: held up behind the hot recipient's", coldAt)
			}
			if coldWait > 0 {
				t.Logf("cold recipients delivered after %v with delay, %v with wait", coldAt.Round(time.Millisecond), coldWait.Round(time.Millisecond))
			}
		})
	}
	t.Run("SIGKILL mid-run", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits for the group's 30s session timeout")
		}
		const recipients, perRecip = 8, 10
		e := newKafkaDelayE2E(t, bin, "delay")
		e.start()
		killed := e.start()
		e.waitMembers(2, 30*time.Second)
		to := func(id int) string { return fmt.Sprintf("r%d", id%recipients) }
		e.produceTo(recipients*perRecip, to, func(id int) int32 { return int32(id) % e.partitions })
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
		sp := spacingPerRecipient(e.sink, to, 200*time.Millisecond)
		t.Logf("SIGKILL: %d of %d messages delivered, %d requests, %d duplicates, %v, %d writes to the delay topic",
			unique, recipients*perRecip, requests, dups, sp, e.endSum(e.topic+".delay"))
		if unique != recipients*perRecip {
			t.Errorf("%d distinct messages arrived, want %d: a crash must lose nothing", unique, recipients*perRecip)
		}
		if !sp.ok() {
			t.Errorf("messages to one recipient above 5/s: %v", sp)
		}
		if n := e.endSum(e.topic + ".dlq"); n != 0 {
			t.Errorf("%d messages dead-lettered, want none", n)
		}
	})
}

// newKafkaDelayE2E is a kafkaE2E on 3 partitions whose replicas have a
// per-recipient layer of 5/s, burst 1, with on_exceed action, keyed by the
// body's "to".
func newKafkaDelayE2E(t *testing.T, bin, action string) *kafkaE2E {
	e := newKafkaE2EWith(t, bin, 1000, 3)
	e.burst = 1000
	e.conc = 3
	e.extraLimit = fmt.Sprintf(`  extra:
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 5/s
      burst: 1
      on_exceed: %s
`, action)
	return e
}

// produceTo writes messages {"id":N,"to":to(N)} for N in [0, n), keyed by
// the recipient, each to partition(N).
func (e *kafkaE2E) produceTo(n int, to func(int) string, partition func(int) int32) {
	e.t.Helper()
	cl := suiteKgo(e.t, e.brokers, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for id := range n {
		recs = append(recs, &kgo.Record{Topic: e.topic, Partition: partition(id),
			Key: []byte(to(id)), Value: fmt.Appendf(nil, `{"id":%d,"to":%q}`, id, to(id))})
	}
	ctx := testenv.Context(e.t, 30*time.Second)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("producing: %v", err)
	}
}

// lastArrival returns when the last of the messages whose id matches
// arrived at the sink.
func (e *kafkaE2E) lastArrival(match func(id int) bool) time.Time {
	e.sink.mu.Lock()
	defer e.sink.mu.Unlock()
	var last time.Time
	for _, a := range e.sink.arrivals {
		if match(a.id) && a.at.After(last) {
			last = a.at
		}
	}
	return last
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

// spacing is how the arrivals at a sink keep to a per-recipient rate.
type spacing struct {
	// closest is the shortest time between two arrivals for one
	// recipient.
	closest time.Duration
	// worst is the recipient whose arrivals after its first came closest
	// to breaking the rate over their run: n arrivals in all, span from
	// the second to the last, want the least span the rate allows, gaps
	// between all its arrivals.
	worst      string
	n          int
	span, want time.Duration
	gaps       []time.Duration
}

// spacingPerRecipient measures how the arrivals at sink for each
// recipient (message id going to to(id)) keep to one per interval. The
// grant is decided on Redis's clock and the arrival stamped by the sink's
// after the consumer's HTTP hop: a send lands after its grant, never
// before, by a jitter of a few ms, except the first send of a run, which
// landed up to 113 ms late on a loaded 2-core machine with -race (gaps
// such as [87ms 197ms 200ms 200ms 201ms 199ms 201ms]). So the check (ok)
// is that from its second arrival on, each recipient's n arrivals span at
// least (n-2) intervals less 100 ms (a grant too many takes a whole
// interval off), and that no two of its arrivals are closer than 20 ms
// (two sends in one slot, the first one included).
func spacingPerRecipient(sink *cliSink, to func(int) string, interval time.Duration) spacing {
	sink.mu.Lock()
	defer sink.mu.Unlock()
	at := map[string][]time.Time{}
	for _, a := range sink.arrivals {
		r := to(a.id)
		at[r] = append(at[r], a.at)
	}
	sp := spacing{closest: time.Hour, span: time.Hour}
	margin := time.Duration(math.MaxInt64)
	for r, ts := range at {
		n := len(ts)
		if n < 2 {
			continue
		}
		var gaps []time.Duration
		for i := 1; i < n; i++ {
			gaps = append(gaps, ts[i].Sub(ts[i-1]).Round(time.Millisecond))
			sp.closest = min(sp.closest, ts[i].Sub(ts[i-1]))
		}
		span, want := ts[n-1].Sub(ts[1]), time.Duration(n-2)*interval-100*time.Millisecond
		if span-want < margin {
			margin = span - want
			sp.worst, sp.n, sp.span, sp.want, sp.gaps = r, n, span, want, gaps
		}
	}
	return sp
}

// ok reports whether every recipient's arrivals kept to the rate.
func (sp spacing) ok() bool { return sp.span >= sp.want && sp.closest >= 20*time.Millisecond }

func (sp spacing) String() string {
	return fmt.Sprintf("closest pair to one recipient %v apart (want >= 20ms); %d arrivals to %s span %v from the second, want >= %v (gaps %v)",
		sp.closest.Round(time.Millisecond), sp.n, sp.worst, sp.span.Round(time.Millisecond), sp.want, sp.gaps)
}
