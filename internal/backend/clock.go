package backend

import "time"

// Clock is the time source of a Bucket: it reads the time for the Observer
// and the replica-count grace period, and makes the timers of Wait's
// sleeps, the store probe, the heartbeats and the lease expiry. The token
// arithmetic never uses it: the store keeps its own clock. Tests pass a
// fake clock to run a Bucket at fixed instants.
//
// A Clock must be safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer whose channel receives once, after d.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine after d. The returned timer's
	// C is nil.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a timer made by a Clock, as time.Timer.
type Timer interface {
	// C returns the channel the time is sent on, or nil for AfterFunc.
	C() <-chan time.Time
	// Stop and Reset behave as time.Timer's.
	Stop() bool
	Reset(d time.Duration) bool
}

// SystemClock is the real time, the default Clock.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer {
	return systemTimer{time.AfterFunc(d, f)}
}

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time        { return t.t.C }
func (t systemTimer) Stop() bool                 { return t.t.Stop() }
func (t systemTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
