package kafka

import (
	"context"
	"errors"
	"testing"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/throttlehq/throttle/consumer"
)

// TestKeyErrorDeadLetterAttempts: a message whose ordering key cannot be
// computed is dead-lettered without a handler call, with the key's error
// and x-throttle-attempts 1: attempts count from 1, as for a message that
// failed in its first handler call.
func TestKeyErrorDeadLetterAttempts(t *testing.T) {
	calls := 0
	c := newTestConsumer(t, Config{Options: consumer.Options{
		Ordering:    consumer.OrderKey,
		OrderingKey: func(consumer.Message) (string, error) { return "", errors.New("ordering_key: no value for .to") },
	}}, func(context.Context, consumer.Message) error {
		calls++
		return nil
	})
	f := newFakeGroup(map[int]partitionReader{0: newFakeReader(kafkago.Message{Topic: "t", Offset: 0, Value: []byte("v")})})
	dl := &fakeWriter{}
	rg := startGeneration(t, c, f, dl)
	waitFor(t, "the message committed", func() bool { return f.committed()[0] == 1 })
	rg.finish(t, true)
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if len(dl.writes) != 1 || calls != 0 {
		t.Fatalf("%d dead letters, %d handler calls; want 1 and 0", len(dl.writes), calls)
	}
	got := headerMap(dl.writes[0].Headers)
	if got[consumer.HeaderAttempts] != "1" || got[consumer.HeaderError] != "ordering_key: no value for .to" {
		t.Errorf("dead-letter headers %v; want %s 1 and the key's error", got, consumer.HeaderAttempts)
	}
}
