package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// WaitGroupStable waits up to d until the consumer group is Stable with
// exactly members members that all have partitions assigned, so that no
// rebalance interrupts what the test measures next. It fails t otherwise.
func WaitGroupStable(t testing.TB, adm *kadm.Client, group string, members int, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		gs, err := adm.DescribeGroups(ctx, group)
		if err == nil {
			g := gs[group]
			ok := g.State == "Stable" && len(g.Members) == members
			for _, m := range g.Members {
				if a, isConsumer := m.Assigned.AsConsumer(); !isConsumer || len(a.Topics) == 0 {
					ok = false
				}
			}
			if ok {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("group %s did not become stable with %d members within %v (last error: %v)", group, members, d, err)
		case <-tick.C:
		}
	}
}
