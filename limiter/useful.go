package limiter

import "math"

// UsefulReplicas returns the smallest number of replicas that together
// reach rate tokens per second when each delivers perReplica tokens per
// second on its own (its sink's and concurrency's throughput, not the
// bucket's share): ceil(rate/perReplica), at least 1. Replicas beyond it
// only wait on the shared bucket. It returns 0 (unknown) when rate or
// perReplica is not positive. A small tolerance keeps a measured 40.0001
// per replica at 100/s from reading 3 as 2.5 rounded up twice.
func UsefulReplicas(rate, perReplica float64) int {
	if !(rate > 0) || !(perReplica > 0) {
		return 0
	}
	n := rate / perReplica
	return max(1, int(math.Ceil(n-1e-9)))
}
