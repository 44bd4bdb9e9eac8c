package testenv

import "time"

// RateFloor is the lowest aggregate rate that consumers saturating a bucket
// may show over intervals grants: 3% below rate, and less the tokens lost to
// a stall of stall. A stall no longer than the bucket can store (burst/rate)
// loses nothing, since the bucket keeps the tokens for after it; a longer
// one loses the rest. Shared-rate tests pass the longest stall they
// measured (of the process, or of Redis), and only that.
func RateFloor(rate float64, burst, intervals int, stall time.Duration) float64 {
	span := float64(intervals) / (rate * 0.97)
	if lost := stall.Seconds() - float64(burst)/rate; lost > 0 {
		span += lost
	}
	return float64(intervals) / span
}
