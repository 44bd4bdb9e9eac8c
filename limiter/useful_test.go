package limiter_test

import (
	"fmt"
	"testing"

	"github.com/throttlehq/throttle/limiter"
)

func TestUsefulReplicas(t *testing.T) {
	for _, c := range []struct {
		rate, per float64
		want      int
	}{
		{100, 40, 3}, {100, 50, 2}, {100, 49.9, 3}, {10, 40, 1}, {100, 0, 0}, {0, 40, 0},
	} {
		if got := limiter.UsefulReplicas(c.rate, c.per); got != c.want {
			t.Errorf("UsefulReplicas(%v, %v) = %d, want %d", c.rate, c.per, got, c.want)
		}
	}
}

func ExampleUsefulReplicas() {
	// A bucket of 100/s; each replica's sink takes 40/s.
	fmt.Println(limiter.UsefulReplicas(100, 40))
	// Output: 3
}
