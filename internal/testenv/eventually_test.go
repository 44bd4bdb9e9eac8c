package testenv

import (
	"fmt"
	"testing"
	"time"
)

// fatalTB records Fatalf instead of ending the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

func TestWithin(t *testing.T) {
	calls := 0
	if !Within(time.Second, func() bool { calls++; return calls == 3 }) {
		t.Fatal("Within = false for a condition that holds on the third call")
	}
	if calls != 3 {
		t.Errorf("cond called %d times, want 3: once more after it held", calls)
	}

	start := time.Now()
	calls = 0
	if Within(50*time.Millisecond, func() bool { calls++; return false }) {
		t.Fatal("Within = true for a condition that never holds")
	}
	took := time.Since(start)
	if took < 50*time.Millisecond {
		t.Errorf("Within gave up after %v, before its timeout of 50ms", took)
	}
	// Pauses of 50 µs doubling to 20 ms: about 12 calls in 50 ms, not one
	// every 50 µs.
	if calls < 3 || calls > 30 {
		t.Errorf("cond called %d times in 50ms, want a poll that backs off to every 20ms", calls)
	}

	if !Within(0, func() bool { return true }) {
		t.Error("Within(0) = false for a condition that holds at once")
	}
}

func TestEventually(t *testing.T) {
	f := &fatalTB{TB: t}
	Eventually(f, time.Second, "ready", func() bool { return true })
	if f.msg != "" {
		t.Errorf("Eventually failed for a condition that holds: %q", f.msg)
	}
	Eventually(f, 30*time.Millisecond, "two consumers on the queue", func() bool { return false })
	if want := "two consumers on the queue: not within 30ms"; f.msg != want {
		t.Errorf("Eventually failed with %q, want %q", f.msg, want)
	}
}
