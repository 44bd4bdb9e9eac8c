package limiter

import "github.com/throttlehq/throttle/internal/backend"

// FloorQueued returns how many callers of b wait in line behind their
// class's head while a floor holds the class back (floor.go), for the
// tests that drive a Bucket at fixed instants: those callers sleep on no
// timer.
func FloorQueued(b *Bucket) int {
	n := 0
	for c := range NumPriorities {
		n += b.floor.waiting(Priority(c))
	}
	return n
}

// The store-level names of package backend, under the names the tests of
// this package knew them by before they left its API.
type (
	Adapter          = backend.Adapter
	AttributedPauser = backend.AttributedPauser
	ClassRefunder    = backend.ClassRefunder
	Clock            = backend.Clock
	ConsumerTracker  = backend.ConsumerTracker
	LayerRequest     = backend.LayerRequest
	LayerCharge      = backend.LayerCharge
	LayerResult      = backend.LayerResult
	LayerState       = backend.LayerState
	LayeredMemory    = backend.LayeredMemory
	LayeredStore     = backend.LayeredStore
	Memory           = backend.Memory
	Notifier         = backend.Notifier
	Override         = backend.Override
	PaidSecretStore  = backend.PaidSecretStore
	Push             = backend.Push
	ReplicaReport    = backend.ReplicaReport
	ReplicaTracker   = backend.ReplicaTracker
	ReportingTracker = backend.ReportingTracker
	StoreError       = backend.StoreError
	TakeRequest      = backend.TakeRequest
	TakeResult       = backend.TakeResult
	Timer            = backend.Timer
	WarmupStore      = backend.WarmupStore
)

const (
	MaxBurst  = backend.MaxBurst
	MaxRate   = backend.MaxRate
	MaxWarmup = backend.MaxWarmup
)

var (
	CostError         = backend.CostError
	DefaultBurst      = backend.DefaultBurst
	ErrMalformedReply = backend.ErrMalformedReply
	ExceededError     = backend.ExceededError
	LayerKeys         = backend.LayerKeys
	NewLayeredMemory  = backend.NewLayeredMemory
	NewMemory         = backend.NewMemory
	PaidCharge        = backend.PaidCharge
	PaidLateness      = backend.PaidLateness
	PaidLayers        = backend.PaidLayers
	PaidUntil         = backend.PaidUntil
	ParseAction       = backend.ParseAction
	ParseMode         = backend.ParseMode
	ParsePeriod       = backend.ParsePeriod
	PriorityOfRank    = backend.PriorityOfRank
	QuotaWindow       = backend.QuotaWindow
	QuotaWindows      = backend.QuotaWindows
	Rank              = backend.Rank
	ReservedError     = backend.ReservedError
	ReservesOnRefusal = backend.ReservesOnRefusal
	SystemClock       = backend.SystemClock
	ValidateBurst     = backend.ValidateBurst
	ValidateLayers    = backend.ValidateLayers
	ValidateRate      = backend.ValidateRate
	ValidateWarmup    = backend.ValidateWarmup
)

// The counters of Stats, one by one, as the tests of this package read them.
func (b *Bucket) Granted() int64                        { return b.Stats().Granted }
func (b *Bucket) Waiting() int                          { return b.Stats().Waiting }
func (b *Bucket) WaitingByPriority() [NumPriorities]int { return b.Stats().WaitingByPriority }
func (b *Bucket) Exceeded() map[string]int64            { return b.Stats().Exceeded }
func (b *Bucket) PaidRefused() int64                    { return b.Stats().PaidRefused }
func (b *Bucket) Replicas() int                         { return b.Stats().Replicas }
func (b *Bucket) Idle() bool                            { return b.Stats().Idle }

// LeaseWaiting returns how many callers of b wait in the lease's queue
// on no timer: those queued behind the caller that leads the refill.
func LeaseWaiting(b *Bucket) int {
	b.lease.mu.Lock()
	defer b.lease.mu.Unlock()
	n := len(b.lease.queue)
	if b.lease.refilling {
		n--
	}
	return n
}

// LeaseTokens returns the tokens b holds leased.
func LeaseTokens(b *Bucket) int {
	b.lease.mu.Lock()
	defer b.lease.mu.Unlock()
	return b.lease.tokens
}

// FairQueued returns how many of tenant's requests wait for its fair share
// in b (Request.FairWaiting), for the tests that drive a Bucket at fixed
// instants: all but the first of them sleep on no timer.
func FairQueued(b *Bucket, tenant string) int {
	b.layered.fairMu.Lock()
	defer b.layered.fairMu.Unlock()
	if q := b.layered.fairWaiting[tenant]; q != nil {
		return len(q.waiting)
	}
	return 0
}

// LeaseTimers returns how many of the lease's timers of b are armed: the
// idle timer and the deadline timer, for the tests that drive many
// Buckets at fixed instants and wait until every one is asleep.
func LeaseTimers(b *Bucket) int {
	b.lease.mu.Lock()
	defer b.lease.mu.Unlock()
	n := 0
	if b.lease.idle != nil {
		n++
	}
	if !b.lease.dueAt.IsZero() {
		n++
	}
	return n
}
