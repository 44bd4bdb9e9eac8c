package kafka

import (
	"context"
	"errors"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// handledLog records every handler call of a test.
type handledLog struct {
	mu    sync.Mutex
	calls []handledCall
	seen  map[pos]bool
	want  int
	all   chan struct{}
}

type pos struct {
	partition int
	offset    int64
}

type handledCall struct {
	pos
	at      time.Time
	replica int
}

func newHandledLog(want int) *handledLog {
	return &handledLog{seen: map[pos]bool{}, want: want, all: make(chan struct{})}
}

func (l *handledLog) add(replica int, m consumer.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := pos{m.Source.Partition, m.Source.Offset}
	l.calls = append(l.calls, handledCall{pos: p, at: time.Now(), replica: replica})
	if !l.seen[p] {
		l.seen[p] = true
		if len(l.seen) == l.want {
			close(l.all)
		}
	}
}

func (l *handledLog) done() bool {
	select {
	case <-l.all:
		return true
	default:
		return false
	}
}

func (l *handledLog) snapshot() []handledCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

func (l *handledLog) waitAll(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-l.all:
	case <-time.After(d):
		l.mu.Lock()
		defer l.mu.Unlock()
		t.Fatalf("handled %d distinct messages of %d within %v", len(l.seen), l.want, d)
	}
}

// records returns n records spread round-robin over partitions.
func records(topic string, partitions, n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(i % partitions), Key: []byte(strconv.Itoa(i)), Value: []byte("m" + strconv.Itoa(i))}
	}
	return recs
}

// TestSharedRate runs three replicas in one group on one Redis bucket at
// 50/s, burst 5, over 600 messages in 12 partitions. Each replica works its
// 4 partitions at once, so 12 reservations queue at the bucket (240 ms of
// tokens): a replica whose next request is late, on a loaded machine, does
// not leave the bucket idle.
//
// The bucket starts full, so the first 5 grants are immediate; after them a
// saturated bucket grants one token every 1/50 s. With the handler times
// sorted as t[0..n-1], grants 5..n-1 are n-6 intervals apart, so the
// aggregate rate after the first burst is (n-6)/(t[n-1]-t[5]). Every
// handler call counts, redeliveries included, since each took a token.
func TestSharedRate(t *testing.T) {
	const (
		rate       = 50.0
		burst      = 5
		n          = 600
		partitions = 12
		replicas   = 3
	)
	addr := testenv.RedisAddr(t)
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	brokers := newTopics(t, partitions, topic)
	bucket := testenv.Name(t, "kafka-rate")

	log, warm := newHandledLog(n), newHandledLog(partitions)
	for i := range replicas {
		rc := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = rc.Close() })
		store, err := redislimiter.New(rc, redislimiter.Config{Bucket: bucket, Rate: rate, Burst: burst})
		if err != nil {
			t.Fatal(err)
		}
		l, err := limiter.New(store, limiter.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		c, err := New(Config{
			Options: consumer.Options{Concurrency: partitions / replicas, Limiter: l, Logger: testLogger(t)},
			Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
		}, func(ctx context.Context, m consumer.Message) error {
			if string(m.Body) == "warm-up" {
				warm.add(i, m)
			} else {
				log.add(i, m)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		stop := runConsumer(t, c)
		defer func() {
			if err := stop(); err != nil {
				t.Errorf("replica %d: Run = %v", i, err)
			}
		}()
	}
	// Produce only once every replica has its partitions, so that no
	// rebalance interrupts the measurement. One warm-up message per
	// partition first makes every replica open its Redis and broker
	// connections, so that their set-up cost (large under -race on two
	// cores) does not delay the handlers of the first burst and skew the
	// windows. The warm-up calls count in the windows, not in the rate.
	testenv.WaitGroupStable(t, newAdmin(t, brokers), group, replicas, 20*time.Second)
	// The probe measures how late this process's goroutines wake up, and
	// how slow Redis answers (other packages' tests share it in CI).
	stallDone := make(chan struct{})
	var maxStall, maxRedis time.Duration
	probe := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = probe.Close() })
	go func() {
		defer close(stallDone)
		for !log.done() {
			s := time.Now()
			time.Sleep(5 * time.Millisecond)
			maxStall = max(maxStall, time.Since(s)-5*time.Millisecond)
			s = time.Now()
			if probe.Ping(context.Background()).Err() == nil {
				maxRedis = max(maxRedis, time.Since(s))
			}
		}
	}()
	var recs []*kgo.Record
	for p := range partitions {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(p), Value: []byte("warm-up")})
	}
	produce(t, brokers, recs...)
	warm.waitAll(t, 10*time.Second)
	produce(t, brokers, records(topic, partitions, n)...)
	log.waitAll(t, 30*time.Second)
	<-stallDone

	main := log.snapshot()
	all := append(warm.snapshot(), main...)
	sorted := func(calls []handledCall) []time.Time {
		ts := make([]time.Time, len(calls))
		for i, c := range calls {
			ts[i] = c.at
		}
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		return ts
	}
	perReplica := make([]int, replicas)
	for _, c := range main {
		perReplica[c.replica]++
	}
	ts := sorted(main)
	m := len(ts)
	measured := float64(m-6) / ts[m-1].Sub(ts[5]).Seconds()
	var gap time.Duration // the longest pause between handler calls
	gapAt := 0
	for i := 6; i < m; i++ {
		if d := ts[i].Sub(ts[i-1]); d > gap {
			gap, gapAt = d, i
		}
	}
	t.Logf("longest pause between handler calls after the first burst: %v, before call %d of %d", gap.Round(time.Millisecond), gapAt, m)
	ts = sorted(all)
	maxWindow := 0
	for i, j := 0, 0; i < len(ts); i++ {
		for j < len(ts) && ts[j].Sub(ts[i]) < time.Second {
			j++
		}
		maxWindow = max(maxWindow, j-i)
	}
	// The bucket grants at most burst + rate·1s = 55 tokens in any second.
	// Handler times trail the grants by the scheduling delay and the
	// store's round trip (a reply that arrives after its slot is acted on
	// at once), and a stall of the whole process or of Redis (a loaded CI
	// machine) releases the waiters it held up together, so a window may
	// then show the calls due during the stall as well. The limit allows
	// for the stall and the round trip measured by the probe above, and
	// only for them.
	limit := burst + int(rate)
	if lag := maxStall + maxRedis; lag > time.Second/time.Duration(rate) {
		limit += int(math.Ceil(rate * lag.Seconds()))
	}
	// A pause of every request for longer than the bucket can store
	// (burst/rate) loses the tokens beyond it. The lower bound allows for
	// the longest measured stall of this process or of Redis, and only
	// for it.
	minRate := testenv.RateFloor(rate, burst, m-6, max(maxStall, maxRedis))
	t.Logf("kafka shared rate: %d handler calls for %d messages, by replicas %v; aggregate rate after the first burst %.2f/s (target %.0f, %+.2f%%, floor %.2f); max calls in a 1 s window %d (limit %d for a longest scheduler stall of %v and a slowest Redis ping of %v)",
		m, n, perReplica, measured, rate, 100*(measured-rate)/rate, minRate, maxWindow, limit, maxStall.Round(time.Millisecond), maxRedis.Round(time.Millisecond))
	if measured < minRate || measured > rate*1.03 {
		t.Errorf("aggregate rate %.2f/s is not within %.2f/s and 3%% above %.0f/s", measured, minRate, rate)
	}
	if maxWindow > limit {
		t.Errorf("a 1 s window holds %d calls, want at most %d", maxWindow, limit)
	}
	for i, c := range perReplica {
		if c == 0 {
			t.Errorf("replica %d handled nothing; the partitions were not shared", i)
		}
	}
}

// crashableNet dials real connections until crash, which closes them all
// and makes every later dial fail, as if the replica's host died.
type crashableNet struct {
	mu      sync.Mutex
	conns   []net.Conn
	crashed bool
}

func (n *crashableNet) dial(ctx context.Context, network, address string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.crashed {
		return nil, errors.New("replica crashed")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, address)
	if err == nil {
		n.conns = append(n.conns, c)
	}
	return c, err
}

func (n *crashableNet) crash() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.crashed = true
	for _, c := range n.conns {
		_ = c.Close()
	}
}

// TestReplicaCrash stops one of three replicas mid-run without a clean
// shutdown: its network is cut, so it commits nothing more and never leaves
// the group, and its handlers hang. The group evicts it after the session
// timeout, the others take over its partitions from the last committed
// offsets, and every message is handled by a live replica or was handled by
// the crashed one before it died.
func TestReplicaCrash(t *testing.T) {
	const (
		n          = 300
		partitions = 6
		replicas   = 3
		crashed    = 2
	)
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	brokers := newTopics(t, partitions, topic)
	l, err := limiter.NewLocal(150, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	log := newHandledLog(n)
	var (
		dead      atomic.Bool
		crashedAt atomic.Pointer[time.Time]
		network   crashableNet
		total     atomic.Int64
		crashNow  = make(chan struct{})
		stuckMu   sync.Mutex
		stuck     []pos // in the crashed replica's handlers when it died
	)
	for i := range replicas {
		cfg := Config{
			Options: consumer.Options{Concurrency: 2, Limiter: l, Logger: testLogger(t), DrainTimeout: 200 * time.Millisecond},
			Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup, CommitTimeout: 300 * time.Millisecond,
		}
		if i == crashed {
			cfg.Dialer = &kafkago.Dialer{DialFunc: network.dial, Timeout: time.Second}
		}
		c, err := New(cfg, func(ctx context.Context, m consumer.Message) error {
			if i == crashed && dead.Load() {
				stuckMu.Lock()
				stuck = append(stuck, pos{m.Source.Partition, m.Source.Offset})
				stuckMu.Unlock()
				<-ctx.Done() // a dead replica finishes nothing
				return ctx.Err()
			}
			log.add(i, m)
			if total.Add(1) == n/3 {
				close(crashNow)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		stop := runConsumer(t, c)
		defer func() {
			if err := stop(); err != nil {
				t.Errorf("replica %d: Run = %v", i, err)
			}
		}()
	}
	testenv.WaitGroupStable(t, newAdmin(t, brokers), group, replicas, 20*time.Second)
	produce(t, brokers, records(topic, partitions, n)...)

	<-crashNow
	dead.Store(true)
	now := time.Now()
	crashedAt.Store(&now)
	network.crash()

	log.waitAll(t, 30*time.Second)

	calls := log.snapshot()
	owned := map[int]bool{}
	for _, c := range calls {
		if c.replica == crashed {
			owned[c.partition] = true
		}
	}
	takenOver := map[int]bool{}
	for _, c := range calls {
		if c.replica != crashed && owned[c.partition] && c.at.After(*crashedAt.Load()) {
			takenOver[c.partition] = true
		}
	}
	t.Logf("the crashed replica handled partitions %v before the crash; live replicas handled %v of them after it",
		keys(owned), keys(takenOver))
	if len(owned) == 0 {
		t.Fatal("the crashed replica had no partitions before the crash")
	}
	if len(takenOver) != len(owned) {
		t.Fatalf("live replicas took over partitions %v of the crashed replica's %v", keys(takenOver), keys(owned))
	}
	// The messages the crashed replica was handling were never committed:
	// a live replica got them again.
	stuckMu.Lock()
	defer stuckMu.Unlock()
	for _, p := range stuck {
		if !slices.ContainsFunc(calls, func(c handledCall) bool { return c.pos == p && c.replica != crashed }) {
			t.Errorf("message %+v, in flight at the crashed replica, was not redelivered", p)
		}
	}
	t.Logf("%d messages in flight at the crash were redelivered to live replicas", len(stuck))
}

func keys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// recordHeaders returns a record's headers as a map.
func recordHeaders(r *kgo.Record) map[string]string {
	h := map[string]string{}
	for _, kv := range r.Headers {
		h[kv.Key] = string(kv.Value)
	}
	return h
}

// TestHandlerErrors checks retries, dead-lettering and that the offsets of
// dead-lettered messages are committed: a restarted consumer does not see
// them again.
func TestHandlerErrors(t *testing.T) {
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	dlq := topic + ".dlq"
	brokers := newTopics(t, 1, topic, dlq)
	produce(t, brokers,
		&kgo.Record{Topic: topic, Key: []byte("k0"), Value: []byte("ok")},
		&kgo.Record{Topic: topic, Key: []byte("k1"), Value: []byte("flaky")},
		&kgo.Record{Topic: topic, Key: []byte("k2"), Value: []byte("failing"),
			Headers: []kgo.RecordHeader{{Key: "trace-id", Value: []byte("abc")}}},
		&kgo.Record{Topic: topic, Key: []byte("k3"), Value: []byte("invalid")},
		&kgo.Record{Topic: topic, Key: []byte("k4"), Value: []byte("last")},
	)

	var (
		mu       sync.Mutex
		attempts = map[string][]int{}
		last     = make(chan struct{})
		retried  atomic.Int64
		dead     atomic.Int64
	)
	h := func(ctx context.Context, m consumer.Message) error {
		mu.Lock()
		attempts[string(m.Body)] = append(attempts[string(m.Body)], m.Attempt)
		mu.Unlock()
		switch string(m.Body) {
		case "flaky":
			if m.Attempt < 3 {
				return errors.New("temporarily unavailable")
			}
		case "failing":
			return errors.New("provider down")
		case "invalid":
			return consumer.Permanent(errors.New("payload does not parse"))
		case "last":
			close(last)
		}
		return nil
	}
	cfg := Config{
		Options: consumer.Options{Logger: testLogger(t), Retry: consumer.RetryPolicy{MaxAttempts: 3, Backoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}, Observer: &consumer.MessageObserver{
			Retried:      func(consumer.Message, error, time.Duration) { retried.Add(1) },
			DeadLettered: func(consumer.Message, error) { dead.Add(1) },
		}},
		Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
	}
	c, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, c)
	select {
	case <-last:
	case <-time.After(20 * time.Second):
		t.Fatal("the last message was not handled")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}

	wantAttempts := map[string][]int{"ok": {1}, "flaky": {1, 2, 3}, "failing": {1, 2, 3}, "invalid": {1}, "last": {1}}
	for body, want := range wantAttempts {
		if got := attempts[body]; !slices.Equal(got, want) {
			t.Errorf("attempts of %q = %v, want %v", body, got, want)
		}
	}
	if retried.Load() != 4 || dead.Load() != 2 {
		t.Errorf("observed %d retries and %d dead-letters, want 4 and 2", retried.Load(), dead.Load())
	}

	recs := consumeAll(t, brokers, dlq, 2)
	wantDLQ := map[string]map[string]string{
		"failing": {
			consumer.HeaderError: "provider down", consumer.HeaderAttempts: "3", "trace-id": "abc",
			HeaderOriginalTopic: topic, HeaderOriginalPartition: "0", HeaderOriginalOffset: "2",
		},
		"invalid": {
			consumer.HeaderError: "payload does not parse", consumer.HeaderAttempts: "1",
			HeaderOriginalTopic: topic, HeaderOriginalPartition: "0", HeaderOriginalOffset: "3",
		},
	}
	for _, r := range recs {
		want, ok := wantDLQ[string(r.Value)]
		if !ok {
			t.Errorf("unexpected dead-letter %q", r.Value)
			continue
		}
		got := recordHeaders(r)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("dead-letter %q: header %s = %q, want %q (all: %v)", r.Value, k, got[k], v, got)
			}
		}
		if string(r.Key) == "" {
			t.Errorf("dead-letter %q lost its key", r.Value)
		}
	}

	if got := committed(t, brokers, group, topic); got[0] != 5 {
		t.Fatalf("committed offsets %v, want partition 0 at 5", got)
	}
	// A restarted member of the group sees only what is new.
	seen := make(chan string, 10)
	c2, err := New(cfg, func(ctx context.Context, m consumer.Message) error {
		seen <- string(m.Body)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop2 := runConsumer(t, c2)
	produce(t, brokers, &kgo.Record{Topic: topic, Value: []byte("after restart")})
	select {
	case got := <-seen:
		if got != "after restart" {
			t.Fatalf("restarted consumer got %q first, want only the new message", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("restarted consumer got nothing")
	}
	if err := stop2(); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// TestGracefulShutdown cancels Run while a handler is in flight.
func TestGracefulShutdown(t *testing.T) {
	cases := []struct {
		name  string
		drain time.Duration
		// work is how long the first handler takes after shutdown began;
		// 0 means until its context ends.
		work          time.Duration
		wantCommitted int64 // -1: no commit
		wantCancelled bool
	}{
		{"in-flight handler finishes within the drain timeout", 5 * time.Second, 300 * time.Millisecond, 1, false},
		{"drain deadline cancels the handler", 200 * time.Millisecond, 0, -1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
			brokers := newTopics(t, 1, topic)
			produce(t, brokers, records(topic, 1, 5)...)

			started := make(chan struct{})
			var calls atomic.Int64
			var cancelled atomic.Bool
			c, err := New(Config{
				Options: consumer.Options{Logger: testLogger(t), DrainTimeout: tc.drain, Retry: consumer.RetryPolicy{MaxAttempts: 1}},
				Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
			}, func(ctx context.Context, m consumer.Message) error {
				if calls.Add(1) > 1 {
					return nil
				}
				close(started)
				var timeout <-chan time.Time
				if tc.work > 0 {
					timeout = time.After(tc.work)
				}
				select {
				case <-ctx.Done():
					cancelled.Store(true)
					return ctx.Err()
				case <-timeout:
					return nil
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, c)
			select {
			case <-started:
			case <-time.After(20 * time.Second):
				t.Fatal("the handler was not called")
			}
			begin := time.Now()
			if err := stop(); err != nil {
				t.Fatalf("Run = %v", err)
			}
			took := time.Since(begin)
			if calls.Load() != 1 {
				t.Errorf("handler called %d times, want 1: queued messages must not start after shutdown", calls.Load())
			}
			if cancelled.Load() != tc.wantCancelled {
				t.Errorf("handler context cancelled = %v, want %v", cancelled.Load(), tc.wantCancelled)
			}
			if took > tc.drain+5*time.Second {
				t.Errorf("Run took %v to return", took)
			}
			got, ok := committed(t, brokers, group, topic)[0]
			if !ok {
				got = -1
			}
			if got != tc.wantCommitted {
				t.Errorf("committed offset %d, want %d", got, tc.wantCommitted)
			}
		})
	}
}

// TestCostAboveBurst dead-letters a message whose cost the limiter can
// never grant, or cannot be read, instead of hanging on it.
func TestCostAboveBurst(t *testing.T) {
	topic, group := testenv.Name(t, "t"), testenv.Name(t, "g")
	dlq := topic + ".dlq"
	brokers := newTopics(t, 1, topic, dlq)
	cost := func(v string) []kgo.RecordHeader { return []kgo.RecordHeader{{Key: "x-segments", Value: []byte(v)}} }
	cases := []struct {
		body    string
		headers []kgo.RecordHeader
		dead    bool
	}{
		{"two segments", cost("2"), false},
		{"ten segments", cost("10"), true},
		{"unreadable cost", cost("many"), true},
		{"no cost header", nil, false},
	}
	var recs []*kgo.Record
	for _, tc := range cases {
		recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(tc.body), Headers: tc.headers})
	}
	produce(t, brokers, recs...)

	l, err := limiter.NewLocal(100, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	delivered := make(chan string, len(cases))
	c, err := New(Config{
		Options: consumer.Options{Logger: testLogger(t), Limiter: l, Cost: consumer.CostFromHeader("x-segments")},
		Brokers: brokers, Topic: topic, Group: group, ConfigureReader: fastGroup,
	}, func(ctx context.Context, m consumer.Message) error {
		delivered <- string(m.Body)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, c)
	var got []string
	for range 2 {
		select {
		case b := <-delivered:
			got = append(got, b)
		case <-time.After(20 * time.Second):
			t.Fatalf("delivered %v, the consumer is stuck", got)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	dead := map[string]map[string]string{}
	for _, r := range consumeAll(t, brokers, dlq, 2) {
		dead[string(r.Value)] = recordHeaders(r)
	}
	for _, tc := range cases {
		h, isDead := dead[tc.body]
		if isDead != tc.dead || isDead == slices.Contains(got, tc.body) {
			t.Errorf("%q: dead-lettered=%v delivered=%v, want dead-lettered=%v", tc.body, isDead, slices.Contains(got, tc.body), tc.dead)
		}
		if isDead && h[consumer.HeaderAttempts] != "1" {
			t.Errorf("%q: attempts %q, want 1 (permanent)", tc.body, h[consumer.HeaderAttempts])
		}
	}
	if got := committed(t, brokers, group, topic); got[0] != int64(len(cases)) {
		t.Errorf("committed %v, want partition 0 at %d", got, len(cases))
	}
}
