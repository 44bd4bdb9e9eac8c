// Package consumertest is the conformance suite of the consumer backends:
// Run checks that a backend keeps the contract of consumer.Consumer and
// consumer.Options, the same way for every backend, against a real broker
// (or an in-process one). consumer/kafka and consumer/rabbitmq run it from
// their conformance_test.go; a new backend passes by running it too:
//
//	func TestConformance(t *testing.T) {
//		consumertest.Run(t, consumertest.Backend{Name: "mybroker", NewSource: newSource})
//	}
//
// where newSource makes a fresh topic or queue for one test (Source). Each
// behaviour is a subtest, run in parallel with the others, each on its own
// Source:
//
//   - Throttle: the limiter's pace is kept across handlers.
//   - Retry: a failing handler is retried with Message.Attempt counting up,
//     and delivered once it succeeds.
//   - DeadLetter: a permanent error, a panic and the last failed attempt
//     dead-letter the message with consumer.HeaderError,
//     consumer.HeaderAttempts and its own headers.
//   - SetAside: with Options.SetAside, a message set aside frees its
//     handler, waits in the backend's delay destination (counted by
//     Backlog as SetAside) and comes back when due, with consumer.HeaderDue
//     and consumer.HeaderSetAsideReason; without, the handler waits.
//   - Drain: at shutdown the handlers in flight finish and their messages
//     are not delivered again, nothing else starts, and nothing is lost;
//     past Options.DrainTimeout their context ends and the message comes
//     back.
//   - Reconnect: a cut connection shows in Connected and in the
//     MessageObserver's Disconnected, ReconnectAttempt and Reconnected, and
//     no message is lost.
//   - Ordering: OrderPartition with Concurrency 1 handles one message at a
//     time in order, OrderKey the messages of a key one at a time in order
//     and keys concurrently, OrderNone up to Concurrency at once.
//   - Backlog: what waits at the broker is counted until it is handled.
//   - Tracing: with Options.TracerProvider, a message published with a
//     traceparent gets one consumer span in that trace, with its limiter
//     wait under it, the span in the handler's context, and its dead
//     letter as an event.
//
// Messages are told apart by the header "x-id"; keys travel in the
// message key and in the header "x-key".
package consumertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
)

// Backend is a consumer backend under test.
type Backend struct {
	// Name names the backend in failures.
	Name string
	// NewSource returns a fresh topic or queue for one test, with its
	// dead-letter and delay destinations, removed when t ends. It is
	// called from parallel subtests.
	NewSource func(t *testing.T) Source
}

// Source is one test's topic or queue, and the consumers of it.
type Source interface {
	// Publish publishes msgs in order, with their Key (the Kafka key; a
	// queue may ignore it), Headers and Body, and returns once the broker
	// has them all.
	Publish(t testing.TB, msgs ...consumer.Message)
	// NewConsumer returns a consumer of the source (one consumer group
	// for all of a source's consumers) with opts and h, not yet running.
	// It dead-letters to the source's dead-letter destination and holds
	// at most opts.Concurrency messages the broker counts as not waiting
	// (a RabbitMQ prefetch of Concurrency), when Concurrency is set. Its
	// broker connections go through the source, so that Cut reaches them.
	NewConsumer(t testing.TB, opts consumer.Options, h consumer.Handler) consumer.Consumer
	// DeadLetters waits until the dead-letter destination holds at least
	// n messages and returns them, with their headers and body.
	DeadLetters(t testing.TB, n int) []consumer.Message
	// Cut breaks every connection of the source's consumers to the broker
	// and makes their new ones fail until Restore. Publish and
	// DeadLetters keep working.
	Cut(t testing.TB)
	// Restore lets the consumers connect again.
	Restore(t testing.TB)
}

// Run runs every behaviour of the suite against b, each in a parallel
// subtest with its own Source.
func Run(t *testing.T, b Backend) {
	t.Helper()
	tests := []struct {
		name string
		run  func(t *testing.T, src Source)
	}{
		{"Throttle", testThrottle},
		{"Retry", testRetry},
		{"DeadLetter", testDeadLetter},
		{"SetAside", testSetAside},
		{"SetAsideOff", testSetAsideOff},
		{"Drain", testDrain},
		{"DrainDeadline", testDrainDeadline},
		{"Reconnect", testReconnect},
		{"OrderPartition", testOrderPartition},
		{"OrderKey", testOrderKey},
		{"OrderNone", testOrderNone},
		{"Backlog", testBacklog},
		{"Tracing", testTracing},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			tc.run(t, b.NewSource(t))
			t.Logf("%s %s: %v", b.Name, tc.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// timeout bounds every wait of the suite for a state: generous, since
// the suite runs beside the rest of the tests on a loaded machine.
const timeout = 30 * time.Second

// msg returns the message id, with key, as the suite publishes it.
func msg(id, key string) consumer.Message {
	return consumer.Message{
		Key:     []byte(key),
		Body:    []byte("body of " + id),
		Headers: map[string]string{"x-id": id, "x-key": key, "x-trace": "trace-" + id},
	}
}

// msgs returns n messages m-000... with keys k-0..k-(keys-1) in turn.
func msgs(prefix string, n, keys int) []consumer.Message {
	out := make([]consumer.Message, n)
	for i := range out {
		out[i] = msg(fmt.Sprintf("%s-%03d", prefix, i), fmt.Sprintf("k-%d", i%max(keys, 1)))
	}
	return out
}

func idOf(m consumer.Message) string { return m.Headers["x-id"] }

// keyOf is the OrderingKey of the suite: the header x-key.
func keyOf(m consumer.Message) (string, error) { return m.Headers["x-key"], nil }

// running is a consumer that Run runs in its own goroutine.
type running struct {
	c      consumer.Consumer
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// start runs c until stop or the end of the test.
func start(t testing.TB, c consumer.Consumer) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = c.Run(ctx)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run's context and returns what Run returned, failing t if
// it does not return in time.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(timeout):
		t.Fatalf("Run did not return within %v of its context's end", timeout)
	}
	_ = r.c.Close()
	return r.err
}

// returned reports whether Run returned.
func (r *running) returned() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// call is one handler call.
type call struct {
	id      string
	key     string
	attempt int
	at      time.Time
	headers map[string]string
}

// recorder records the handler calls and how many run at once.
type recorder struct {
	mu       sync.Mutex
	calls    []call
	inFlight int
	maxIn    int
	perKey   map[string]int // calls in flight by key
	keyClash bool           // two calls of one key ran at once
}

func newRecorder() *recorder { return &recorder{perKey: map[string]int{}} }

// enter records the start of a call of m and returns the function that
// records its end.
func (r *recorder) enter(m consumer.Message) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := m.Headers["x-key"]
	r.calls = append(r.calls, call{id: idOf(m), key: k, attempt: m.Attempt, at: time.Now(), headers: m.Headers})
	r.inFlight++
	r.maxIn = max(r.maxIn, r.inFlight)
	r.perKey[k]++
	if r.perKey[k] > 1 {
		r.keyClash = true
	}
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.inFlight--
		r.perKey[k]--
	}
}

// snapshot returns the calls so far.
func (r *recorder) snapshot() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// ids returns how often each id was called.
func (r *recorder) ids() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, c := range r.calls {
		out[c.id]++
	}
	return out
}

// waitCalls waits until at least n calls were made.
func (r *recorder) waitCalls(t testing.TB, n int, what string) {
	t.Helper()
	testenv.Eventually(t, timeout, what, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.calls) >= n
	})
}

// waitIDs waits until every id of want was called at least once.
func (r *recorder) waitIDs(t testing.TB, want []consumer.Message, what string) {
	t.Helper()
	testenv.Eventually(t, timeout, what, func() bool {
		got := r.ids()
		for _, m := range want {
			if got[idOf(m)] == 0 {
				return false
			}
		}
		return true
	})
}

// observed counts the observer's events.
type observed struct {
	mu                                  sync.Mutex
	delivered, retried, dead, setAside  int
	disconnected, attempts, reconnected int
	failedAttempts                      int
	brokers                             map[string]bool
	deadErrs                            []error
}

func (o *observed) observer() *consumer.MessageObserver {
	inc := func(n *int) {
		o.mu.Lock()
		defer o.mu.Unlock()
		*n++
	}
	conn := func(n *int) func(string, error) {
		return func(broker string, err error) {
			o.mu.Lock()
			defer o.mu.Unlock()
			*n++
			if o.brokers == nil {
				o.brokers = map[string]bool{}
			}
			o.brokers[broker] = true
			if n == &o.attempts && err != nil {
				o.failedAttempts++
			}
		}
	}
	return &consumer.MessageObserver{
		Delivered: func(consumer.Message) { inc(&o.delivered) },
		Retried:   func(consumer.Message, error, time.Duration) { inc(&o.retried) },
		DeadLettered: func(_ consumer.Message, err error) {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.dead++
			o.deadErrs = append(o.deadErrs, err)
		},
		SetAside:         func(consumer.Message, time.Duration) { inc(&o.setAside) },
		Disconnected:     conn(&o.disconnected),
		ReconnectAttempt: conn(&o.attempts),
		Reconnected:      conn(&o.reconnected),
	}
}

func (o *observed) get(n *int) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return *n
}

// backlog returns the consumer's backlog in its parts, failing t on an
// error.
func backlog(t testing.TB, c consumer.Consumer) consumer.Backlog {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	b, err := c.BacklogParts(ctx)
	if err != nil {
		t.Fatalf("BacklogParts: %v", err)
	}
	return b
}

// waitConnected waits until c says it is connected.
func waitConnected(t testing.TB, c consumer.Consumer) {
	t.Helper()
	var last error
	if !testenv.Within(timeout, func() bool { last = c.Connected(); return last == nil }) {
		t.Fatalf("Connected() = %v after %v, want nil", last, timeout)
	}
}

// errSentinel is a handler error the suite recognizes.
var errSentinel = errors.New("sink unavailable")
