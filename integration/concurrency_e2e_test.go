package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// concSink is an HTTP sink that holds each request (200 ms, or until
// released) and records, per endpoint, the most requests it had open at
// once.
type concSink struct {
	srv  *httptest.Server
	hold time.Duration

	mu       sync.Mutex
	open     map[string]int
	most     map[string]int
	done     map[int]int // id → requests answered 200
	arrivals []time.Time
	block    chan struct{} // while not nil, requests wait for it to close
}

func newConcSink(t *testing.T, hold time.Duration) *concSink {
	s := &concSink{hold: hold, open: map[string]int{}, most: map[string]int{}, done: map[int]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			ID       int    `json:"id"`
			Endpoint string `json:"endpoint"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.open[body.Endpoint]++
		s.most[body.Endpoint] = max(s.most[body.Endpoint], s.open[body.Endpoint])
		s.arrivals = append(s.arrivals, time.Now())
		block := s.block
		s.mu.Unlock()
		if block != nil {
			select {
			case <-block:
			case <-r.Context().Done(): // the replica died
			}
		} else {
			time.Sleep(s.hold)
		}
		s.mu.Lock()
		s.open[body.Endpoint]--
		if r.Context().Err() == nil {
			s.done[body.ID]++
		}
		s.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// delivered returns how many distinct messages got an answer.
func (s *concSink) delivered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.done)
}

// concLayer is the limit.extra of the runs: 3 requests per endpoint at
// once.
func concLayer(lease string) string {
	return `  extra:
    - name: per-endpoint
      key: '{{.JSON.endpoint}}'
      concurrency: 3
` + lease
}

func concPublish(t *testing.T, f *faultFleet, n, endpoints int) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	for id := range n {
		err := f.ch.PublishWithContext(ctx, "", f.name, true, false, amqp.Publishing{
			ContentType: "application/json", MessageId: strconv.Itoa(id),
			Body: fmt.Appendf(nil, `{"id":%d,"endpoint":"e%d"}`, id, id%endpoints),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestConcurrencyFleet: 3 replicas, a layer of concurrency 3 per
// endpoint, a sink that takes 200 ms: the sink never has more than 3
// requests of one endpoint open at once, across the replicas, and it does
// reach 3 (the cap is what holds them, not the handlers).
func TestConcurrencyFleet(t *testing.T) {
	t.Parallel()
	sink := newConcSink(t, 200*time.Millisecond)
	f := faultNewFleet(t)
	spec := faultFleetSpec{
		Redis:      faultSharedRedis(t),
		Burst:      1000,
		LimitExtra: concLayer(""),
		Prefetch:   20,
		SinkURL:    sink.srv.URL + "/send",
	}
	for range 3 {
		f.Start(spec, 1000)
	}
	f.WaitConsumers(3)
	t.Cleanup(f.Stop)
	const n, endpoints = 90, 3 // 30 per endpoint: 10 rounds of 200 ms at 3 at once
	start := time.Now()
	concPublish(t, f, n, endpoints)
	testenv.Eventually(t, 30*time.Second, "every message delivered", func() bool { return sink.delivered() == n })
	took := time.Since(start)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	t.Logf("%d messages to %d endpoints through 3 replicas in %v; most open at once per endpoint: %v", n, endpoints, took.Round(time.Millisecond), sink.most)
	for e, m := range sink.most {
		if m > 3 {
			t.Errorf("endpoint %s had %d requests open at once, want at most 3", e, m)
		}
	}
	if reached := sink.most["e0"] == 3 || sink.most["e1"] == 3 || sink.most["e2"] == 3; !reached {
		t.Errorf("no endpoint reached 3 requests at once (%v): the handlers, not the cap, held them", sink.most)
	}
	for id, c := range sink.done {
		if c != 1 {
			t.Errorf("message %d delivered %d times", id, c)
		}
	}
}

// TestConcurrencySIGKILL: a replica killed with SIGKILL while it holds
// every slot of an endpoint never releases them; another replica gets
// them when their leases end, within the lease of the kill.
func TestConcurrencySIGKILL(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	sink := newConcSink(t, 0)
	sink.block = make(chan struct{})
	f := faultNewFleet(t)
	spec := faultFleetSpec{
		Redis:      faultSharedRedis(t),
		Burst:      1000,
		LimitExtra: concLayer("      lease: 3s\n"),
		SinkURL:    sink.srv.URL + "/send",
	}
	a := f.Start(spec, 1000)
	f.WaitConsumers(1)
	concPublish(t, f, 3, 1)
	testenv.Eventually(t, 10*time.Second, "3 requests open at the sink", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.open["e0"] == 3
	})
	a.Kill()
	killed := time.Now()
	sink.mu.Lock()
	close(sink.block)
	sink.block = nil
	sink.mu.Unlock()
	f.Start(spec, 1000)
	t.Cleanup(f.Stop)
	testenv.Eventually(t, 20*time.Second, "the 3 messages delivered by the second replica", func() bool { return sink.delivered() == 3 })
	took := time.Since(killed)
	sink.mu.Lock()
	first := sink.arrivals[3].Sub(killed)
	sink.mu.Unlock()
	t.Logf("after the SIGKILL, the second replica sent its first request after %v and all 3 after %v (lease %v)", first.Round(time.Millisecond), took.Round(time.Millisecond), lease)
	if took > lease+2*time.Second {
		t.Errorf("the slots came back %v after the kill, want within the lease (%v) and 2 s", took, lease)
	}
}
