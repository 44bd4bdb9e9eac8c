package kafka

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
)

// TestAssignedReportsIdleMembers: two members of a group on a topic of one
// partition; Config.Assigned tells the one given the partition 1, the
// other 0 (an idle member), and 0 to both once they stop.
func TestAssignedReportsIdleMembers(t *testing.T) {
	const topic, group = "assigned", "assigned-group"
	brokers := newTopics(t, 1, topic)
	var last [2]atomic.Int64
	stops := make([]func() error, 2)
	for i := range 2 {
		last[i].Store(-1)
		c, err := New(Config{
			Options: consumer.Options{Logger: testLogger(t)},
			Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
			Assigned: func(n int) { last[i].Store(int64(n)) },
		}, func(context.Context, consumer.Message) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		stops[i] = runConsumer(t, c)
	}
	deadline := time.Now().Add(20 * time.Second)
	for last[0].Load()+last[1].Load() != 1 || last[0].Load() < 0 || last[1].Load() < 0 {
		if time.Now().After(deadline) {
			t.Fatalf("assignments told %d and %d, want 1 and 0 within 20 s", last[0].Load(), last[1].Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, stop := range stops {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if n := last[i].Load(); n != 0 {
			t.Errorf("member %d told %d partitions after it stopped, want 0", i, n)
		}
	}
}
