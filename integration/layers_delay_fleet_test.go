package integration

import (
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// The delay-layer fleet runs: 3 replicas of the binary, a per-recipient
// layer of 30/min (2 s apart), burst 1, on_exceed delay, and 300 messages
// to 30 recipients, all published at once. The layer lets each recipient's
// 10 messages out over 18 s; every other message goes through the delay
// queue or topic at least once, on the slot the layer booked for it.
const (
	delayFleetReplicas   = 3
	delayFleetRecipients = 30
	delayFleetPerRecip   = 10
	delayFleetSpacing    = 2 * time.Second
	// delayFleetGapShare is the least share of the layer's spacing that
	// two messages to one recipient may be apart at the sink.
	delayFleetGapShare = 0.85
	// delayFleetSlack is how much longer than the layer's 18 s the whole
	// run may take: the last messages arrived after 18.04 to 18.2 s, and
	// after 20.04 s in 1 run of 10 on a loaded 2-core machine, where a
	// stall of a replica made a message forfeit its slot and take the
	// recipient's next one, 2 s after its last.
	delayFleetSlack = 4 * time.Second
)

// delayFleetLayer is the limit.extra entry of the runs.
const delayFleetLayer = `  extra:
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 30/min
      burst: 1
      on_exceed: delay
`

func delayFleetTo(id int) string { return fmt.Sprintf("r%d", id%delayFleetRecipients) }

// delayFleetAwait waits until the sink got every message of the run, or
// for 4 times what the layer allows, so that a slow run is measured
// rather than cut short.
func delayFleetAwait(sink *cliSink) {
	deadline := time.Now().Add(4 * time.Duration(delayFleetPerRecip-1) * delayFleetSpacing)
	for time.Now().Before(deadline) {
		if _, unique := sink.counts(); unique >= delayFleetRecipients*delayFleetPerRecip {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// delayFleetCheck fails t unless the sink got every message once, no two
// to one recipient closer than delayFleetGapShare of the spacing, and the
// last within the layer's time plus delayFleetSlack of start.
func delayFleetCheck(t *testing.T, sink *cliSink, start time.Time) {
	t.Helper()
	const n = delayFleetRecipients * delayFleetPerRecip
	sink.mu.Lock()
	defer sink.mu.Unlock()
	at := map[string][]time.Time{}
	var last time.Time
	for _, a := range sink.arrivals {
		at[delayFleetTo(a.id)] = append(at[delayFleetTo(a.id)], a.at)
		if a.at.After(last) {
			last = a.at
		}
	}
	want := time.Duration(delayFleetGapShare * float64(delayFleetSpacing))
	closest, closeTo := time.Hour, ""
	// Each gap under want, with how late its two arrivals were against
	// the recipient's grid, its first arrival plus k spacings.
	var short []string
	for r, ts := range at {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		for i := 1; i < len(ts); i++ {
			g := ts[i].Sub(ts[i-1])
			if g < closest {
				closest, closeTo = g, r
			}
			if g < want {
				grid := func(k int) time.Duration {
					return ts[k].Sub(ts[0].Add(time.Duration(k) * delayFleetSpacing)).Round(time.Millisecond)
				}
				short = append(short, fmt.Sprintf("%s #%d-#%d %v (%v, %v after the grid)", r, i-1, i, g.Round(time.Millisecond), grid(i-1), grid(i)))
			}
		}
	}
	took := last.Sub(start)
	allows := time.Duration(delayFleetPerRecip-1) * delayFleetSpacing
	t.Logf("%d requests, %d distinct messages; closest pair to one recipient %v apart (%s), %d of %d gaps under %v %v; last delivered %v after publishing (the layer allows %v)",
		len(sink.arrivals), len(sink.seen), closest.Round(time.Millisecond), closeTo, len(short),
		n-delayFleetRecipients, want, short, took.Round(time.Millisecond), allows)
	if len(sink.seen) != n || len(sink.arrivals) != n {
		t.Errorf("%d requests for %d distinct messages, want %d each", len(sink.arrivals), len(sink.seen), n)
	}
	if closest < want {
		t.Errorf("two messages to %s %v apart, want >= %v (%.0f%% of the layer's %v)", closeTo, closest.Round(time.Millisecond), want, 100*delayFleetGapShare, delayFleetSpacing)
	}
	if took > allows+delayFleetSlack {
		t.Errorf("the last message arrived %v after publishing, want within %v (the layer's %v and %v)", took.Round(time.Millisecond), allows+delayFleetSlack, allows, delayFleetSlack)
	}
}

// delayFleetRabbitMQ runs the delay-layer fleet on one RabbitMQ
// queue: the messages set aside come back from the delay queues when their
// slots are due, whatever the order they were set aside in, so that no
// slot is missed and none is sent next to the one after it. With the
// single delay queue and per-message TTLs, a message waited behind any
// longer delay set aside before it, forfeited its slot and booked one at
// the end: 299 of the 300 had arrived after 72 s.
func delayFleetRabbitMQ(t *testing.T) {
	f := faultNewFleet(t)
	spec := faultFleetSpec{
		Redis:      faultSharedRedis(t),
		Burst:      1000,
		LimitExtra: delayFleetLayer,
		Prefetch:   50,
	}
	for range delayFleetReplicas {
		f.Start(spec, 1000)
	}
	f.WaitConsumers(delayFleetReplicas)
	t.Cleanup(f.Stop)
	const n = delayFleetRecipients * delayFleetPerRecip
	ctx := testenv.Context(t, 30*time.Second)
	start := time.Now()
	for id := range n {
		err := f.ch.PublishWithContext(ctx, "", f.name, true, false, amqp.Publishing{
			ContentType: "application/json", MessageId: strconv.Itoa(id),
			Body: fmt.Appendf(nil, `{"id":%d,"to":%q}`, id, delayFleetTo(id)),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	delayFleetAwait(f.Sink)
	delayFleetCheck(t, f.Sink, start)
}

// delayFleetKafka runs the delay-layer fleet on a Kafka topic of
// 3 partitions (kfake), ordering key: the copies in the delay topic come
// back when their slots are due, not when the head of their partition is,
// as they did when the last arrived after 36 s.
func delayFleetKafka(t *testing.T) {
	bin := cliBuild(t)
	e := newKafkaE2EWith(t, bin, 1000, 3)
	e.burst = 1000
	e.extraLimit = delayFleetLayer
	e.extraSource = "    ordering: key\n"
	for range delayFleetReplicas {
		e.start()
	}
	e.waitMembers(delayFleetReplicas, 60*time.Second)
	const n = delayFleetRecipients * delayFleetPerRecip
	start := time.Now()
	e.produceTo(n, delayFleetTo, func(id int) int32 { return int32(id % 3) })
	delayFleetAwait(e.sink)
	delayFleetCheck(t, e.sink, start)
}

// TestDelayLayerFleet runs the RabbitMQ and the Kafka delay-layer fleets
// at the same time, before the parallel tests and without them: each holds
// a per-recipient spacing and a finishing time to a bound, and together
// they take the time of one.
func TestDelayLayerFleet(t *testing.T) {
	t.Run("RabbitMQ", func(t *testing.T) {
		t.Parallel()
		delayFleetRabbitMQ(t)
	})
	t.Run("Kafka", func(t *testing.T) {
		t.Parallel()
		delayFleetKafka(t)
	})
}
