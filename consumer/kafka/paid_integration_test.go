package kafka

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/internal/setaside"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// bucketLimiter is a consumer.MessageLimiter on a limiter.Bucket whose
// store has one layer, "per-key", keyed by the Kafka key. As the binary's
// limiter does (internal/cli), it passes a returned message's paid slots
// (setaside.PaidSlots) with the message's key.
type bucketLimiter struct{ b *limiter.Bucket }

func (l bucketLimiter) Wait(ctx context.Context, n int) error { return l.b.Wait(ctx, n) }

func (l bucketLimiter) WaitMessage(ctx context.Context, msg consumer.Message, n int) error {
	return l.b.WaitN(ctx, limiter.Request{Cost: n, Keys: map[string]string{"per-key": string(msg.Key)}, Paid: setaside.PaidSlots(msg.Headers)})
}

// newDelayLayerBucket returns a Bucket on an in-process layered store: a
// shared bucket that never limits, and a per-key layer of rate and burst
// with on_exceed delay.
func newDelayLayerBucket(t *testing.T, rate float64, burst int) *limiter.Bucket {
	t.Helper()
	b, err := limiter.NewLocal(1e6, 1e6,
		limiter.Layer{Name: "per-key", Keyed: true, Rate: rate, Burst: burst, OnExceed: limiter.ActionDelay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// runDelayLayer runs a consumer of topic in group, setting messages aside,
// with opts (its Observer and Logger set here) until n distinct messages
// were handled, and returns what it recorded.
func runDelayLayer(t *testing.T, brokers []string, topic, group string, n int, opts consumer.Options) *recorder {
	t.Helper()
	rec := newRecorder()
	opts.Observer, opts.Logger, opts.SetAside = rec.observer(), testLogger(t), true
	c, err := New(Config{Brokers: brokers, Topic: topic, Group: group, Options: opts, ConfigureReader: fastGroup}, rec.handle)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, c)
	rec.waitDistinct(t, n)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rec
}

// TestSetAsideHotKeyOnce sends 10 messages of one key at once through a
// delay layer of 20/s, burst 1: the layer books a slot for each message it
// refuses, 50 ms apart, and the message comes back with the slot paid
// (setaside.HeaderPaid), so each is set aside about once: 9 writes to the
// delay topic, not one per message and round (up to 45). Every message is
// delivered exactly once, in the order of its slot, and the header a
// producer forged does not pass the layer. (A message back more
// than backend.PaidLateness late, 25 ms here, books a new slot behind the
// others: one more write, and it comes last.)
func TestSetAsideHotKeyOnce(t *testing.T) {
	const (
		n     = 10
		rate  = 20
		slack = 3 // a message back late books a new slot: set aside once more
	)
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	cluster := newDelayCluster(t, 1, topic)
	brokers := cluster.ListenAddrs()
	// A producer's paid slot is not trusted: it would let every message
	// pass the layer together when due.
	forged := `[{"layer":"per-key","key":"hot","due":"` + time.Now().Add(300*time.Millisecond).UTC().Format(time.RFC3339Nano) + `"}]`
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte("hot"), Value: []byte(strconv.Itoa(i)),
			Headers: []kgo.RecordHeader{{Key: setaside.HeaderPaid, Value: []byte(forged)}}}
	}
	produce(t, brokers, recs...)

	rec := runDelayLayer(t, brokers, topic, group, n, consumer.Options{Limiter: bucketLimiter{newDelayLayerBucket(t, rate, 1)}})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	delivered, at, setAside := rec.bodies, rec.at, len(rec.stays)
	copies := int64(0)
	for _, e := range endOffsets(t, brokers, topic+".delay") {
		copies += e
	}
	t.Logf("%d messages of one key at %d/s, burst 1: %d set aside, %d writes to the delay topic; delivered %v",
		n, rate, setAside, copies, delivered)
	want := make([]string, n)
	for i := range want {
		want[i] = strconv.Itoa(i)
	}
	sorted := slices.Clone(delivered)
	slices.SortFunc(sorted, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
	if !slices.Equal(sorted, want) {
		t.Errorf("delivered %v, want each message once", delivered)
	}
	if setAside == n-1 && !slices.Equal(delivered, want) {
		t.Errorf("delivered %v, want the order of their slots: %v", delivered, want)
	}
	if setAside > n-1+slack || copies > int64(n-1+slack) {
		t.Errorf("%d set aside, %d writes to the delay topic; want at most %d: each message set aside about once", setAside, copies, n-1+slack)
	}
	// 9 slots 50 ms apart, less what a slot may be late (25 ms).
	if span := at[len(at)-1].Sub(at[0]); span < (n-1)*25*time.Millisecond {
		t.Errorf("delivered within %v, want the layer's spacing: 9 × 50 ms", span)
	}
}

// TestSetAsideCappedStay sets aside 4 messages of one key through a delay
// layer of 5/s, burst 1 (slots 200, 400 and 600 ms ahead) with
// MaxSetAside 100 ms: no stay in the delay topic is longer, a message back
// before its slot is set aside again, and each is delivered once, in the
// order of its slot.
func TestSetAsideCappedStay(t *testing.T) {
	const (
		n       = 4
		maxStay = 100 * time.Millisecond
	)
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	cluster := newDelayCluster(t, 1, topic)
	brokers := cluster.ListenAddrs()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte("hot"), Value: []byte(strconv.Itoa(i))}
	}
	produce(t, brokers, recs...)

	rec := runDelayLayer(t, brokers, topic, group, n, consumer.Options{Limiter: bucketLimiter{newDelayLayerBucket(t, 5, 1)}, MaxSetAside: maxStay})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	delivered, stays := rec.bodies, rec.stays
	t.Logf("%d messages of one key at 5/s with MaxSetAside %v: set aside for %v; delivered %v", n, maxStay, stays, delivered)
	if !slices.Equal(delivered, []string{"0", "1", "2", "3"}) {
		t.Errorf("delivered %v, want each message once, in the order of its slot", delivered)
	}
	for _, d := range stays {
		if d > maxStay {
			t.Errorf("set aside for %v, want at most MaxSetAside %v", d, maxStay)
		}
	}
	if len(stays) <= n-1 {
		t.Errorf("set aside %d times, want more than %d: the slots 400 and 600 ms ahead take more than one stay of %v", len(stays), n-1, maxStay)
	}
}
