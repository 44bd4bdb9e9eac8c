package limiter

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
