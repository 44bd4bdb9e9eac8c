package kit

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is exponential backoff with equal jitter, the one backoff of the
// consumers: handler retries (RetryDelay), reconnects, dead-letter writes
// and fetch errors all use it. It is a plain value, safe for concurrent
// use.
type Backoff struct {
	// Initial is the delay before the first retry. It must be positive.
	Initial time.Duration
	// Max caps the delay; below Initial it counts as Initial.
	Max time.Duration
}

// Delay returns the delay after the given number of earlier failures
// (0 for the first retry): Initial·2^failures, capped at Max, with equal
// jitter (uniformly random between half and all of it) so that replicas
// that failed together do not retry together. A non-positive Initial gives
// 0.
func (b Backoff) Delay(failures int) time.Duration {
	d := b.Initial
	if d <= 0 {
		return 0
	}
	hi := max(b.Max, d)
	for i := 0; i < failures && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d/2 + rand.N(d/2+1)
}

// Sleep waits for d or until ctx ends, and then returns ctx's error. It
// returns nil at once for d <= 0 while ctx is live.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
