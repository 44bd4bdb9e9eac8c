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
	ReservedError     = backend.ReservedError
	ReservesOnRefusal = backend.ReservesOnRefusal
	SystemClock       = backend.SystemClock
	ValidateBurst     = backend.ValidateBurst
	ValidateLayers    = backend.ValidateLayers
	ValidateRate      = backend.ValidateRate
	ValidateWarmup    = backend.ValidateWarmup
)
