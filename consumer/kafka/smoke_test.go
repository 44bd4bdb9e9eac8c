package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
)

func TestSmoke(t *testing.T) {
	topic, group := uniqueName(t, "t"), uniqueName(t, "g")
	brokers := newTopics(t, 3, topic)
	var recs []*kgo.Record
	for i := range 30 {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % 3), Value: []byte(fmt.Sprint(i))})
	}
	produce(t, brokers, recs...)
	got := make(chan consumer.Message, 100)
	start := time.Now()
	c, err := New(Config{Brokers: brokers, Topic: topic, Group: group, Concurrency: 3, Logger: testLogger(t), ConfigureReader: fastGroup},
		func(ctx context.Context, m consumer.Message) error { got <- m; return nil })
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, c)
	for range 30 {
		<-got
	}
	t.Logf("30 in %v", time.Since(start))
	s := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop in %v", time.Since(s))
	t.Log(committed(t, brokers, group, topic))
}
