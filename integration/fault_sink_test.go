package integration

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// faultHTTPSink is an HTTP endpoint on a fixed loopback port that the test
// can take down (connections refused) and bring back on the same port.
type faultHTTPSink struct {
	t    *testing.T
	addr string

	mu       sync.Mutex
	srv      *httptest.Server
	received map[string]int
	accepted int // requests accepted, in all
}

func faultStartHTTPSink(t *testing.T) *faultHTTPSink {
	t.Helper()
	s := &faultHTTPSink{t: t, received: map[string]int{}}
	s.Up()
	t.Cleanup(s.Down)
	return s
}

// URL returns the endpoint's URL.
func (s *faultHTTPSink) URL() string { return "http://" + s.addr + "/send" }

// Up starts serving, on the same port as before after a Down.
func (s *faultHTTPSink) Up() {
	s.t.Helper()
	addr := s.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.t.Fatalf("sink listening on %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.received[string(body)]++
		s.accepted++
		s.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	s.mu.Lock()
	s.srv, s.addr = srv, ln.Addr().String()
	s.mu.Unlock()
}

// Down closes the listener and every connection: requests fail with
// "connection refused" until Up.
func (s *faultHTTPSink) Down() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.CloseClientConnections()
		srv.Close()
	}
}

// Accepted returns how many requests the endpoint accepted, in all.
func (s *faultHTTPSink) Accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

// Received returns how many times the endpoint accepted body.
func (s *faultHTTPSink) Received(body string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received[body]
}

// TestFaultSinkDown takes the HTTP sink down for 10 s while a Kafka
// consumer delivers to it: the failed attempts are retried with backoff,
// and once the sink is back every message is delivered, none dead-lettered
// for the outage, and the group's offsets are committed to the end.
func TestFaultSinkDown(t *testing.T) {
	t.Parallel()
	const outage = 10 * time.Second
	topic, group := faultName(t), faultName(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic),
		kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	ids := faultMessageIDs(300)
	faultProduce(t, brokers, topic, ids)

	endpoint := faultStartHTTPSink(t)
	sink, err := httpsink.New(httpsink.Config{URL: endpoint.URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	bucket, err := limiter.NewLocal(100, 10)
	if err != nil {
		t.Fatal(err)
	}
	tr := newFaultTracker()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	// The retry budget (30 attempts, backoff up to 1s) outlasts the outage.
	done := faultKafkaRun(t, ctx, kafka.Config{
		Options: consumer.Options{Concurrency: 4, Limiter: bucket, Observer: tr.Observer(), Logger: faultLogger(t), Retry: consumer.RetryPolicy{MaxAttempts: 30, Backoff: 100 * time.Millisecond, MaxBackoff: time.Second}, DrainTimeout: 5 * time.Second},
		Brokers: brokers, Topic: topic, Group: group,
		ConfigureReader: faultKafkaFastGroup,
	}, tr.Handler(sink.Send))

	testenv.Eventually(t, 30*time.Second, "a third of the messages delivered", func() bool { return tr.Delivered() > len(ids)/3 })
	// Down returns once the requests in flight have been answered, so the
	// endpoint accepts nothing after it, though the consumer may count one
	// of those answers as delivered a moment later. Whatever the consumer
	// counts as delivered by the end of the outage, the sink must have
	// accepted before it.
	endpoint.Down()
	downAt, acceptedBefore := time.Now(), endpoint.Accepted()
	faultSleepUntil(ctx, downAt.Add(outage))
	deliveredByEnd, failed := tr.Delivered(), tr.failed.Load()
	endpoint.Up()
	faultWaitAccounted(t, tr, ids, 30*time.Second)
	recoveredIn := time.Since(downAt) - outage
	testenv.Eventually(t, 20*time.Second, "the group committing every message", func() bool {
		lag, err := faultKafkaLag(context.Background(), brokers, group, topic)
		return err == nil && lag == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if deliveredByEnd > acceptedBefore {
		t.Errorf("%d messages counted as delivered by the end of the outage, but the sink accepted only %d before it went down", deliveredByEnd, acceptedBefore)
	}
	if failed == 0 {
		t.Error("no attempt failed while the sink was down")
	}
	for _, id := range ids {
		if !faultIsPermanent(id) && endpoint.Received(id) == 0 {
			t.Errorf("the sink never received %s", id)
		}
	}
	t.Logf("sink down %v after %d accepted requests: %d failed attempts during the outage, all delivered %v after it; %s",
		outage, acceptedBefore, failed, recoveredIn.Round(time.Millisecond), tr.Summary(len(ids)))
}
