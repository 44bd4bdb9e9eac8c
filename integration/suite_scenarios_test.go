package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// suiteBroker is a message broker as the scenarios use it.
type suiteBroker interface {
	// newQueue makes a fresh topic or queue, with its dead-letter
	// destination, for one test, and removes it when the test ends.
	newQueue(t *testing.T) suiteQueue
}

// suiteQueue is one topic (with one consumer group) or one queue.
type suiteQueue interface {
	// replica returns a consumer of the queue that runs spec.
	replica(t *testing.T, spec suiteReplicaSpec) suiteRunner
	// waitConsumers waits until n replicas consume the queue, so that the
	// messages published next are shared among them.
	waitConsumers(t *testing.T, n int)
	// publish sends one message per body and waits until the broker has
	// them all.
	publish(t *testing.T, bodies []string)
	// deadLettered returns the messages in the dead-letter destination,
	// reading until there are n of them.
	deadLettered(t *testing.T, n int) []suiteDLMessage
	// origin returns the dead-letter header that names the topic or queue
	// a dead letter came from, and its value for this one.
	origin() (header, value string)
	// pending returns how many messages were neither committed nor acked.
	// Call it after the replicas stopped.
	pending(t *testing.T) int
}

// suiteDLMessage is a message read from the dead-letter destination.
type suiteDLMessage struct {
	body    string
	headers map[string]string
}

// suiteReplicaSpec is what a replica does: wait on limiter before each
// attempt, call handler under retry, and report to observer.
type suiteReplicaSpec struct {
	limiter  *limiter.Bucket
	retry    consumer.RetryPolicy
	observer *consumer.MessageObserver
	handler  consumer.Handler
	// drain is the drain timeout; default 5s.
	drain time.Duration
}

// options returns the consumer.Options that every backend's replica uses,
// the same for both.
func (s suiteReplicaSpec) options(t testing.TB) consumer.Options {
	o := consumer.Options{Retry: s.retry, Observer: s.observer, Logger: suiteLogger(t), DrainTimeout: s.drain}
	if s.limiter != nil {
		o.Limiter = s.limiter
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 5 * time.Second
	}
	return o
}

// suiteRunner is a replica: *kafka.Consumer or *rabbitmq.Consumer.
type suiteRunner interface {
	Run(ctx context.Context) error
}

// suiteScenarios are the end-to-end scenarios, each run against every
// broker on whichever environment TestSuite picked.
var suiteScenarios = []struct {
	name string
	run  func(t *testing.T, env suiteEnv, b suiteBroker)
}{
	{"SharedRate", suiteSharedRate},
	{"DeadLetter", suiteDeadLetter},
	{"GracefulShutdown", suiteGracefulShutdown},
}

// suiteSharedRate runs three replicas that share one Redis bucket at 50/s
// with burst 5, over 300 messages: nothing may be lost, the replicas must
// share the work, and their aggregate rate after the first burst must be
// within 3% of 50/s. The consumer packages test the same at greater length;
// this checks it end to end on real containers too.
//
// Once the burst is spent, a saturated bucket grants one token every 1/50 s:
// call k (sorted by time) happens at about t0 + (k-burst)/50 s. The rate is
// the slope of a least-squares line through those calls, which a late
// first or last call, delayed by the scheduler, moves far less than it
// moves the span between the two. Every call counts, redeliveries
// included, since each took a token.
func suiteSharedRate(t *testing.T, env suiteEnv, b suiteBroker) {
	const (
		n        = 300
		rate     = 50.0
		burst    = 5
		replicas = 3
	)
	redisAddr := env.redisAddr(t)
	q := b.newQueue(t)
	bucket := suiteName(t, "bucket")
	rec := newSuiteRecorder(n, replicas)
	var runners []suiteRunner
	for i := range replicas {
		runners = append(runners, q.replica(t, suiteReplicaSpec{
			limiter: suiteRedisBucket(t, redisAddr, bucket, rate, burst),
			handler: func(_ context.Context, m consumer.Message) error {
				rec.handled(i, string(m.Body))
				return nil
			},
		}))
	}
	stop := suiteStart(t, runners...)
	q.waitConsumers(t, replicas)
	bodies := suiteBodies("rate", n)
	q.publish(t, bodies)
	rec.wait(t, 60*time.Second)
	stop()

	if missing := rec.missing(bodies); len(missing) > 0 {
		t.Fatalf("%d messages never handled, first %s", len(missing), missing[0])
	}
	if p := q.pending(t); p != 0 {
		t.Errorf("%d messages neither committed nor acked after all were handled", p)
	}
	times, perReplica := rec.calls()
	m := len(times)
	measured := suiteSlope(times[burst:])
	maxWindow := 0
	for i, j := 0, 0; i < m; i++ {
		for j < m && times[j].Sub(times[i]) < time.Second {
			j++
		}
		maxWindow = max(maxWindow, j-i)
	}
	t.Logf("%s: %d handler calls for %d messages by replicas %v; aggregate rate after the first burst %.2f/s (target %.0f, %+.2f%%); at most %d calls in a 1 s window",
		env.name, m, n, perReplica, measured, rate, 100*(measured-rate)/rate, maxWindow)
	if d := (measured - rate) / rate; d < -0.03 || d > 0.03 {
		t.Errorf("aggregate rate %.2f/s is not within 3%% of %.0f/s", measured, rate)
	}
	// The bucket grants at most burst + rate·w tokens in any window w. The
	// calls are timed in the handlers, a scheduling delay after their
	// grants, and under -race on two busy cores such delays bunch up to a
	// few hundred ms of calls: allow 0.5 s. Replicas that did not share the
	// bucket would put about 3 × 50 calls in a window.
	if limit := burst + int(rate*1.5); maxWindow > limit {
		t.Errorf("a 1 s window holds %d calls, want at most burst + rate × 1.5 s = %d", maxWindow, limit)
	}
	for i, c := range perReplica {
		if c == 0 {
			t.Errorf("replica %d handled nothing; the work was not shared", i)
		}
	}
}

// suiteDeadLetter checks that every message ends delivered or dead-lettered,
// none lost: two replicas on one bucket handle 30 messages, of which some
// fail once and are retried, three fail permanently and one never succeeds.
// Those four must be in the dead-letter destination, every other message
// delivered, and nothing left uncommitted or unacked.
func suiteDeadLetter(t *testing.T, env suiteEnv, b suiteBroker) {
	const (
		n           = 30
		replicas    = 2
		maxAttempts = 3
	)
	redisAddr := env.redisAddr(t)
	q := b.newQueue(t)
	bucket := suiteName(t, "bucket")
	bodies := suiteBodies("dl", n)
	var wantDelivered, wantDead, flaky []string
	fate := map[string]string{}
	for i, body := range bodies {
		switch {
		case i%10 == 9:
			fate[body] = "permanent"
			wantDead = append(wantDead, body)
		case i == 4:
			fate[body] = "always"
			wantDead = append(wantDead, body)
		case i%4 == 1:
			fate[body] = "once"
			flaky = append(flaky, body)
			wantDelivered = append(wantDelivered, body)
		default:
			wantDelivered = append(wantDelivered, body)
		}
	}

	rec := newSuiteRecorder(n, replicas)
	obs := &consumer.MessageObserver{
		DeadLettered: func(m consumer.Message, _ error) { rec.deadLettered(string(m.Body)) },
	}
	var runners []suiteRunner
	for i := range replicas {
		runners = append(runners, q.replica(t, suiteReplicaSpec{
			limiter:  suiteRedisBucket(t, redisAddr, bucket, 500, 20),
			retry:    consumer.RetryPolicy{MaxAttempts: maxAttempts, Backoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond},
			observer: obs,
			handler: func(_ context.Context, m consumer.Message) error {
				body := string(m.Body)
				rec.attempted(body)
				switch fate[body] {
				case "permanent":
					return consumer.Permanent(fmt.Errorf("message %s is malformed", body))
				case "always":
					return errors.New("provider unavailable")
				case "once":
					if m.Attempt == 1 {
						return errors.New("provider timed out")
					}
				}
				rec.handled(i, body)
				return nil
			},
		}))
	}
	stop := suiteStart(t, runners...)
	q.waitConsumers(t, replicas)
	q.publish(t, bodies)
	rec.wait(t, 60*time.Second)
	stop()

	delivered, dead := rec.outcomes()
	slices.Sort(wantDelivered)
	slices.Sort(wantDead)
	if !slices.Equal(delivered, wantDelivered) {
		t.Errorf("delivered %v, want %v", delivered, wantDelivered)
	}
	if !slices.Equal(dead, wantDead) {
		t.Errorf("consumers dead-lettered %v, want %v", dead, wantDead)
	}
	dls := q.deadLettered(t, len(wantDead))
	var inDLQ []string
	originHeader, origin := q.origin()
	for _, dl := range dls {
		inDLQ = append(inDLQ, dl.body)
		// The same reason headers on both backends, with the backend's
		// own position.
		wantErr, wantAttempts := "provider unavailable", strconv.Itoa(maxAttempts)
		if fate[dl.body] == "permanent" {
			wantErr, wantAttempts = fmt.Sprintf("message %s is malformed", dl.body), "1"
		}
		if h := dl.headers; h[consumer.HeaderError] != wantErr || h[consumer.HeaderAttempts] != wantAttempts || h[originHeader] != origin {
			t.Errorf("dead letter %s has headers %v; want %s=%q, %s=%s, %s=%s", dl.body, h,
				consumer.HeaderError, wantErr, consumer.HeaderAttempts, wantAttempts, originHeader, origin)
		}
	}
	slices.Sort(inDLQ)
	if !slices.Equal(inDLQ, wantDead) {
		t.Errorf("dead-letter destination holds %v, want %v", inDLQ, wantDead)
	}
	for _, body := range flaky {
		if a := rec.attemptsOf(body); a < 2 {
			t.Errorf("message %s failed once but was attempted %d times", body, a)
		}
	}
	if a := rec.attemptsOf(bodies[4]); a < maxAttempts {
		t.Errorf("message %s always fails but was attempted %d times, want at least %d", bodies[4], a, maxAttempts)
	}
	if p := q.pending(t); p != 0 {
		t.Errorf("%d messages neither committed nor acked after every message ended", p)
	}
	t.Logf("%s: %d delivered (%d after a retry), %d dead-lettered, 0 lost", env.name, len(delivered), len(flaky), len(dead))
}

// suiteGracefulShutdown checks the shutdown contract both backends share,
// with one replica whose handlers block until the test releases them:
// after Run's context ends, no handler starts; Run waits for the running
// handlers until the drain timeout; what they finished is committed or
// acked, and nothing else is. Two cases: the handlers finish within the
// drain timeout, and the drain deadline cancels them.
func suiteGracefulShutdown(t *testing.T, env suiteEnv, b suiteBroker) {
	for _, tc := range []struct {
		name    string
		drain   time.Duration
		release bool // whether the handlers finish within the drain
	}{
		{"in-flight finish", 10 * time.Second, true},
		{"drain deadline cancels", 300 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 12
			q := b.newQueue(t)
			var mu sync.Mutex
			started, finished, cancelled := 0, 0, 0
			startedCh := make(chan struct{}, n)
			release := make(chan struct{})
			r := q.replica(t, suiteReplicaSpec{
				drain: tc.drain,
				retry: consumer.RetryPolicy{MaxAttempts: 1},
				handler: func(ctx context.Context, _ consumer.Message) error {
					mu.Lock()
					started++
					mu.Unlock()
					startedCh <- struct{}{}
					select {
					case <-release:
						mu.Lock()
						finished++
						mu.Unlock()
						return nil
					case <-ctx.Done():
						mu.Lock()
						cancelled++
						mu.Unlock()
						return ctx.Err()
					}
				},
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			q.waitConsumers(t, 1)
			q.publish(t, suiteBodies("stop", n))
			select {
			case <-startedCh:
			case <-time.After(30 * time.Second):
				t.Fatal("no handler started within 30s")
			}
			cancel()
			stopAt := time.Now()
			// Run waits for the blocked handlers.
			select {
			case err := <-errc:
				t.Fatalf("Run returned %v while its handlers were blocked", err)
			case <-time.After(100 * time.Millisecond):
			}
			mu.Lock()
			atStop := started
			mu.Unlock()
			if tc.release {
				close(release)
			}
			select {
			case err := <-errc:
				if err != nil {
					t.Fatalf("Run = %v", err)
				}
			case <-time.After(tc.drain + 15*time.Second):
				t.Fatal("Run did not return after the drain")
			}
			took := time.Since(stopAt)
			mu.Lock()
			defer mu.Unlock()
			if started != atStop {
				t.Errorf("%d handlers started after shutdown began, want 0", started-atStop)
			}
			if !tc.release && (took < tc.drain || cancelled != started) {
				t.Errorf("Run returned %v after cancel with %d of %d handlers cancelled; want after the drain timeout %v, all cancelled",
					took, cancelled, started, tc.drain)
			}
			if tc.release && finished != started {
				t.Errorf("%d of %d started handlers finished, want all", finished, started)
			}
			if p := q.pending(t); p != n-finished {
				t.Errorf("%d messages neither committed nor acked, want %d (all but the %d finished)", p, n-finished, finished)
			}
			t.Logf("%s: %d handlers in flight at shutdown, %d finished, %d cancelled; Run returned %v after cancel",
				env.name, started, finished, cancelled, took.Round(time.Millisecond))
		})
	}
}

// suiteSlope returns the least-squares slope, in calls per second, of the
// call index against the call time.
func suiteSlope(times []time.Time) float64 {
	n := float64(len(times))
	var sx, sy, sxx, sxy float64
	for i, at := range times {
		x, y := at.Sub(times[0]).Seconds(), float64(i)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}

// suiteBodies returns n distinct message bodies.
func suiteBodies(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

// suiteRedisBucket returns a limiter on the shared Redis bucket, with its
// own client as a replica has, closed and deleted when t ends.
func suiteRedisBucket(t *testing.T, addr, bucket string, rate float64, burst int) *limiter.Bucket {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: addr})
	store, err := redislimiter.New(client, redislimiter.Config{Bucket: bucket, Rate: rate, Burst: burst})
	if err != nil {
		t.Fatalf("redislimiter.New: %v", err)
	}
	l, err := limiter.New(store, limiter.Options{})
	if err != nil {
		t.Fatalf("limiter.New: %v", err)
	}
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Del(context.Background(), store.Keys()...).Err()
		_ = client.Close()
	})
	return l
}

// suiteStart runs every runner until the returned stop is called (at the
// latest when t ends). stop waits for them all and reports an error that
// Run returned.
func suiteStart(t *testing.T, runners ...suiteRunner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, len(runners))
	var wg sync.WaitGroup
	for i, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.Run(ctx)
		}()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("replica %d: Run = %v", i, err)
				}
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// suiteRecorder records what the handlers and observers saw. It is safe for
// concurrent use.
type suiteRecorder struct {
	mu        sync.Mutex
	want      int         // messages that must end delivered or dead-lettered
	times     []time.Time // every successful handler call
	perCalls  []int       // successful handler calls per replica
	delivered map[string]bool
	dead      map[string]bool
	attempts  map[string]int
	done      chan struct{}
	closed    bool
}

func newSuiteRecorder(want, replicas int) *suiteRecorder {
	return &suiteRecorder{
		want:      want,
		perCalls:  make([]int, replicas),
		delivered: map[string]bool{},
		dead:      map[string]bool{},
		attempts:  map[string]int{},
		done:      make(chan struct{}),
	}
}

// handled records a successful handler call.
func (r *suiteRecorder) handled(replica int, body string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.times = append(r.times, time.Now())
	r.perCalls[replica]++
	r.delivered[body] = true
	r.checkDone()
}

// attempted records a handler call, successful or not.
func (r *suiteRecorder) attempted(body string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts[body]++
}

// deadLettered records that a consumer dead-lettered a message.
func (r *suiteRecorder) deadLettered(body string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dead[body] = true
	r.checkDone()
}

func (r *suiteRecorder) checkDone() {
	if !r.closed && len(r.delivered)+len(r.dead) >= r.want {
		r.closed = true
		close(r.done)
	}
}

// wait waits until every message was delivered or dead-lettered.
func (r *suiteRecorder) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(d):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("after %v, %d messages delivered and %d dead-lettered of %d", d, len(r.delivered), len(r.dead), r.want)
	}
}

// missing returns the bodies that were never handled successfully.
func (r *suiteRecorder) missing(bodies []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, b := range bodies {
		if !r.delivered[b] {
			out = append(out, b)
		}
	}
	return out
}

// calls returns the times of the successful handler calls, sorted, and
// their number per replica.
func (r *suiteRecorder) calls() ([]time.Time, []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	times := slices.Clone(r.times)
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	return times, slices.Clone(r.perCalls)
}

// outcomes returns the delivered and the dead-lettered bodies, sorted.
func (r *suiteRecorder) outcomes() (delivered, dead []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for b := range r.delivered {
		delivered = append(delivered, b)
	}
	for b := range r.dead {
		dead = append(dead, b)
	}
	slices.Sort(delivered)
	slices.Sort(dead)
	return delivered, dead
}

func (r *suiteRecorder) attemptsOf(body string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[body]
}
