package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestKafkaPriorityBehindLowBacklog runs the binary with ordering: key,
// max_in_flight: 5 and limit.priority_header on one partition holding 40
// low messages and then 5 high ones, each on its own key, at 20/s: the
// highs go out as soon as the replica reads them, ahead of the lows it
// fetched before them. Before, the lows filled max_in_flight and the
// window, and the highs went out 37th to 41st of 45.
func TestKafkaPriorityBehindLowBacklog(t *testing.T) {
	t.Parallel()
	const lows, highs, highBase = 40, 5, 1000
	bin := cliBuild(t)
	e := newKafkaE2EWith(t, bin, 20, 1)
	e.burst = 1
	e.extraLimit = "  priority: low\n  priority_header: x-priority\n"
	e.extraSource = "    ordering: key\n    max_in_flight: 5\n"
	var recs []*kgo.Record
	add := func(id int, class string) {
		recs = append(recs, &kgo.Record{Topic: e.topic, Key: fmt.Appendf(nil, "k%d", id), Value: fmt.Appendf(nil, `{"id":%d}`, id),
			Headers: []kgo.RecordHeader{{Key: "x-priority", Value: []byte(class)}}})
	}
	for i := range lows {
		add(i, "low")
	}
	for i := range highs {
		add(highBase+i, "high")
	}
	ctx := testenv.Context(t, 30*time.Second)
	if err := suiteKgo(t, e.brokers).ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
	e.start()
	e.waitDelivered(lows+highs, 60*time.Second)
	e.sink.mu.Lock()
	var at []int
	for i, a := range e.sink.arrivals {
		if a.id >= highBase {
			at = append(at, i+1)
		}
	}
	e.sink.mu.Unlock()
	t.Logf("the highs arrived %v of %d", at, lows+highs)
	// The replica reads the highs once the lows before them fit in its
	// window (max_in_flight + queue_size, less the highs' reserve): after
	// 7 or 8 lows went out; then each goes out next.
	if len(at) != highs || at[highs-1] > 15 {
		t.Errorf("the highs arrived %v of %d, want all among the first 15", at, lows+highs)
	}
}
