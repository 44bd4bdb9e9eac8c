package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestKafkaKeyOrderingThroughput is the key ordering's target through the binary:
// one partition, 20 keys, a per-key layer of 1/s (limit.extra), a shared
// bucket of 100/s, each key's messages together in the partition. With
// ordering: key a key that waits for its layer holds only its own
// messages, so the replica delivers about 20/s; with ordering: partition
// every message waits behind the previous one of its key: 1/s.
func TestKafkaKeyOrderingThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("takes about 15s")
	}
	const keys, perKey = 20, 6
	bin := cliBuild(t)
	for _, tc := range []struct {
		ordering string
		window   time.Duration // how long to measure; 0: until all arrived
		min, max float64
	}{
		{"key", 0, 18, 30},
		{"partition", 4 * time.Second, 0.7, 1.3},
	} {
		t.Run(tc.ordering, func(t *testing.T) {
			e := newKafkaE2EWith(t, bin, 100, 1)
			e.burst = 100
			e.extraLimit = `  extra:
    - name: per-key
      key: '{{.Key}}'
      rate: 1/s
      burst: 1
`
			e.extraSource = fmt.Sprintf("    ordering: %s\n", tc.ordering)
			cl := suiteKgo(t, e.brokers)
			var recs []*kgo.Record
			id := 0
			for k := range keys {
				for range perKey {
					recs = append(recs, &kgo.Record{Topic: e.topic, Key: fmt.Appendf(nil, "k%d", k), Value: fmt.Appendf(nil, `{"id":%d}`, id)})
					id++
				}
			}
			ctx := testenv.Context(t, 30*time.Second)
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Fatalf("producing: %v", err)
			}
			e.start()
			var rate float64
			if tc.window == 0 {
				e.waitDelivered(len(recs), 60*time.Second)
				ts := e.sink.times()
				// The first message of each key passes at once; the rate is
				// that of the rest, after the first round.
				rate = float64(len(ts)-keys) / ts[len(ts)-1].Sub(ts[keys-1]).Seconds()
			} else {
				e.waitDelivered(1, 30*time.Second)
				first := e.sink.times()[0]
				time.Sleep(time.Until(first.Add(tc.window)))
				ts := e.sink.times()
				if len(ts) < 2 {
					t.Fatalf("%d deliveries in %v", len(ts), tc.window)
				}
				rate = float64(len(ts)-1) / ts[len(ts)-1].Sub(ts[0]).Seconds()
			}
			requests, unique := e.sink.counts()
			t.Logf("ordering %s: %.1f msg/s (1 partition, %d keys, per-key layer 1/s, shared 100/s); %d requests, %d distinct",
				tc.ordering, rate, keys, requests, unique)
			if rate < tc.min || rate > tc.max {
				t.Errorf("ordering %s delivered %.1f/s, want between %v and %v", tc.ordering, rate, tc.min, tc.max)
			}
			if requests != unique {
				t.Errorf("%d requests for %d messages: duplicates", requests, unique)
			}
		})
	}
}
