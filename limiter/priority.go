package limiter

import (
	"strconv"
	"time"
)

// Priority is a request's class. Across every replica and deployment that
// shares a bucket, a waiting request of a higher class gets tokens before
// any request of a lower class, including lower-class requests that already
// hold reservations further out: those reservations move back by the
// tokens the higher class took ahead of them (see Push). A lower class gets
// what the higher ones leave, and Options.MinShare keeps a floor under it.
//
// The zero value is PriorityNormal, so a caller that never names a class
// gets the behaviour of a bucket without classes.
type Priority uint8

// The classes, from the first served to the last.
const (
	PriorityNormal Priority = iota
	PriorityHigh
	PriorityLow
)

// NumPriorities is the number of classes; Shares is indexed by Priority.
const NumPriorities = 3

// Rank returns the class's place in the order of service: 0 for high, 1 for
// normal, 2 for low. The stores order reservations by it.
func (p Priority) Rank() int {
	switch p {
	case PriorityHigh:
		return 0
	case PriorityLow:
		return 2
	}
	return 1
}

// PriorityOfRank is the inverse of Rank.
func PriorityOfRank(rank int) Priority {
	switch rank {
	case 0:
		return PriorityHigh
	case 2:
		return PriorityLow
	}
	return PriorityNormal
}

// String returns "high", "normal" or "low".
func (p Priority) String() string {
	switch p {
	case PriorityHigh:
		return "high"
	case PriorityLow:
		return "low"
	case PriorityNormal:
		return "normal"
	}
	return "Priority(" + strconv.Itoa(int(p)) + ")"
}

// ParsePriority parses "high", "normal" or "low". The empty string is
// PriorityNormal.
func ParsePriority(s string) (Priority, error) {
	switch s {
	case "high":
		return PriorityHigh, nil
	case "normal", "":
		return PriorityNormal, nil
	case "low":
		return PriorityLow, nil
	}
	return PriorityNormal, &ParamError{Param: "Priority", Msg: "must be high, normal or low", Value: s}
}

// Shares holds a fraction of the rate per class, indexed by Priority, such
// as Options.MinShare. The zero value is no floor for any class.
type Shares [NumPriorities]float64

// Validate returns a *ParamError naming param (such as "MinShare.low") for
// a share outside [0, 1), or for shares that add up to 1 or more, or nil.
func (s Shares) Validate(param string) error {
	sum := 0.0
	for p, v := range s {
		if !(v >= 0 && v < 1) {
			return &ParamError{Param: param + "." + Priority(p).String(), Msg: "must be a fraction >= 0 and < 1", Value: v}
		}
		sum += v
	}
	if sum >= 1 {
		return &ParamError{Param: param, Msg: "the shares must add up to less than 1", Value: sum}
	}
	return nil
}

// Push is a store's announcement that a take of a higher class moved every
// reservation of Class made before it, and not yet due at At, back by
// Tokens: Tokens/rate later. Counter is the class's push counter after the
// move: a reservation remembers the counter its take saw
// (TakeResult.Pushed) and applies each Push with a larger Counter once.
type Push struct {
	Class   Priority
	Tokens  float64
	Counter float64
	At      time.Time
}
