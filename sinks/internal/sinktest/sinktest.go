// Package sinktest is the one suite of tests that every sink passes: it
// checks the contract of sinks.Sink (delivery, the permanent or retryable
// classification of failures, returning when the context ends, concurrent
// use) against a destination the sink's own test sets up.
package sinktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks"
)

// Received is what a destination holds of one delivered message.
type Received struct {
	Body    []byte
	Key     []byte
	Headers map[string]string
}

// Kind is the class of failure a harness arranges.
type Kind int

// The kinds of failure.
const (
	// Retryable is a failure retrying may cure: the destination is down or
	// answers "later".
	Retryable Kind = iota + 1
	// Permanent is a failure of the message itself, which the sink must
	// wrap with consumer.Permanent.
	Permanent
)

func (k Kind) String() string {
	if k == Permanent {
		return "permanent"
	}
	return "retryable"
}

// Harness adapts one sink to the suite.
type Harness struct {
	// New returns a sink delivering to a fresh destination, and a function
	// returning what that destination has received so far, in any order.
	// Cleanup is the harness's business (t.Cleanup).
	New func(t *testing.T) (sinks.Sink, func() []Received)
	// KeepsKey and KeepsHeaders say whether the destination keeps the
	// message key and headers (the HTTP sink sends only the body).
	KeepsKey, KeepsHeaders bool
	// Fail returns a sink and a message whose Send fails with the given
	// kind, or a nil sink when the sink has no such failure (stdout has no
	// permanent one).
	Fail func(t *testing.T, kind Kind) (sinks.Sink, consumer.Message)
	// Block returns a sink whose destination does not answer until the
	// test ends, or nil when the sink documents that a Send cannot be
	// interrupted (stdout's write).
	Block func(t *testing.T) sinks.Sink
}

// message returns a distinct test message: Kafka offset n, so that sinks
// that derive an id from the source keep them apart.
func message(n int, body string) consumer.Message {
	return consumer.Message{
		Key:     []byte(fmt.Sprintf("key-%d", n)),
		Body:    []byte(body),
		Headers: map[string]string{"x-n": fmt.Sprint(n), "tenant": "acme"},
		Attempt: 1,
		Source:  consumer.Source{Broker: "kafka", Topic: "sinktest", Partition: 0, Offset: int64(n)},
	}
}

// Run runs the whole suite as subtests of t.
func Run(t *testing.T, h Harness) {
	t.Run("Delivered", func(t *testing.T) { testDelivered(t, h) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, h) })
	t.Run("CancelledContext", func(t *testing.T) { testCancelled(t, h) })
	t.Run("ReturnsWhenContextEnds", func(t *testing.T) { testBlocked(t, h) })
	t.Run("FailsPermanent", func(t *testing.T) { testFail(t, h, Permanent) })
	t.Run("FailsRetryable", func(t *testing.T) { testFail(t, h, Retryable) })
	t.Run("Close", func(t *testing.T) { testClose(t, h) })
}

func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// testDelivered sends messages of every shape and checks that each
// arrived with its body (and key and headers where the destination keeps
// them) unchanged.
func testDelivered(t *testing.T, h Harness) {
	s, received := h.New(t)
	msgs := []consumer.Message{
		message(1, `{"to":"+15550100","text":"Your code is 1234","n":12345678901234567890}`),
		message(2, "plain text, not JSON: \"quoted\" and ünïcode"),
		message(3, `[1,2,3]`),
		message(5, `{"a":"\ud800","nul":"a\u0000b"}`), // valid JSON that jsonb refuses
		{Body: []byte(`{}`), Source: consumer.Source{Broker: "kafka", Topic: "sinktest", Offset: 4}, Attempt: 1}, // nil key and headers
	}
	for _, m := range msgs {
		if err := s.Send(ctx(t, 30*time.Second), m); err != nil {
			t.Fatalf("Send(%s): %v", m.Body, err)
		}
	}
	got := received()
	if len(got) != len(msgs) {
		t.Fatalf("destination holds %d messages, want %d: %q", len(got), len(msgs), got)
	}
	for _, m := range msgs {
		if !contains(got, m, h) {
			t.Errorf("message %s not delivered as sent; destination holds %q", m.Body, got)
		}
	}
}

// testConcurrent sends from many goroutines at once: every message
// arrives exactly once.
func testConcurrent(t *testing.T, h Harness) {
	s, received := h.New(t)
	const goroutines, each = 16, 4
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				n := 100 + g*each + i
				if err := s.Send(ctx(t, 30*time.Second), message(n, fmt.Sprintf(`{"n":%d}`, n))); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Send: %v", err)
	}
	got := received()
	if len(got) != goroutines*each {
		t.Fatalf("destination holds %d messages, want %d", len(got), goroutines*each)
	}
	for n := 100; n < 100+goroutines*each; n++ {
		if !contains(got, message(n, fmt.Sprintf(`{"n":%d}`, n)), h) {
			t.Errorf("message %d missing", n)
		}
	}
}

// testCancelled sends with a context that has ended: Send fails, the
// failure is retryable (a cancelled attempt must never dead-letter a
// message), and nothing is delivered.
func testCancelled(t *testing.T, h Harness) {
	s, received := h.New(t)
	c, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Send(c, message(1, `{"a":1}`))
	switch {
	case err == nil:
		t.Fatal("Send with an ended context returned nil")
	case consumer.IsPermanent(err):
		t.Fatalf("Send with an ended context is permanent: %v", err)
	}
	if got := received(); len(got) != 0 {
		t.Errorf("a Send with an ended context delivered %q", got)
	}
}

// testBlocked sends to a destination that does not answer: Send returns
// soon after its context ends, with a retryable error.
func testBlocked(t *testing.T, h Harness) {
	if h.Block == nil {
		t.Skip("this sink documents that a Send cannot be interrupted")
	}
	s := h.Block(t)
	const deadline = 300 * time.Millisecond
	start := time.Now()
	err := s.Send(ctx(t, deadline), message(1, `{"a":1}`))
	elapsed := time.Since(start)
	switch {
	case err == nil:
		t.Fatal("Send to a destination that does not answer returned nil")
	case consumer.IsPermanent(err):
		t.Errorf("Send cut short by its context is permanent: %v", err)
	case !errors.Is(err, context.DeadlineExceeded):
		t.Errorf("Send cut short by its context: %v, want context.DeadlineExceeded in the chain", err)
	}
	// Generous for a loaded machine, yet far below any sink timeout (5s).
	if elapsed > deadline+3*time.Second {
		t.Errorf("Send returned %v after its context ended", elapsed-deadline)
	}
}

// testFail checks the classification of a failure the harness arranges.
func testFail(t *testing.T, h Harness, kind Kind) {
	if h.Fail == nil {
		t.Skip("no failure harness")
	}
	s, msg := h.Fail(t, kind)
	if s == nil {
		t.Skipf("this sink has no %s failure", kind)
	}
	err := s.Send(ctx(t, 30*time.Second), msg)
	switch {
	case err == nil:
		t.Fatalf("Send = nil, want a %s error", kind)
	case kind == Permanent && !consumer.IsPermanent(err):
		t.Errorf("Send = %v, want a permanent error", err)
	case kind == Retryable && consumer.IsPermanent(err):
		t.Errorf("Send = %v, want a retryable error", err)
	}
}

// testClose checks a sink that holds connections (an io.Closer, as the
// sinks package asks): Close after use returns nil, and a second Close is
// harmless, since shutdown paths may close twice.
func testClose(t *testing.T, h Harness) {
	s, _ := h.New(t)
	c, ok := s.(io.Closer)
	if !ok {
		t.Skip("this sink holds no connection")
	}
	if err := s.Send(ctx(t, 30*time.Second), message(1, `{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// contains reports whether got holds m as the harness keeps it.
func contains(got []Received, m consumer.Message, h Harness) bool {
	for _, r := range got {
		if !sameBody(r.Body, m.Body) {
			continue
		}
		if h.KeepsKey && !bytes.Equal(r.Key, m.Key) {
			continue
		}
		if h.KeepsHeaders && !sameHeaders(r.Headers, m.Headers) {
			continue
		}
		return true
	}
	return false
}

// sameBody compares bodies, JSON ones by value: a destination such as
// jsonb may reformat them.
func sameBody(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	if da.Decode(&va) != nil || db.Decode(&vb) != nil {
		return false
	}
	if _, err := da.Token(); err != io.EOF {
		return false
	}
	return reflect.DeepEqual(normalizeNumbers(va), normalizeNumbers(vb))
}

// normalizeNumbers rewrites json.Numbers in their shortest exact form, so
// that "1" and "1.0" from a reformatting destination compare equal.
func normalizeNumbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		return v.String()
	case map[string]any:
		for k, e := range v {
			v[k] = normalizeNumbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = normalizeNumbers(e)
		}
	}
	return v
}

func sameHeaders(a, b map[string]string) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}
