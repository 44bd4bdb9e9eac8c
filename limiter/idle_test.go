package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// consumerStore counts live replicas and, of them, those that consume, as
// Redis does from the heartbeats' reports: the other replicas are fixed,
// othersLive of them of which othersIdle report themselves idle.
type consumerStore struct {
	*trackedStore
	othersLive, othersIdle int
	reports                chan limiter.ReplicaReport
}

func (s *consumerStore) HeartbeatReport(ctx context.Context, id string, ttl time.Duration, r limiter.ReplicaReport) (int, error) {
	live, _, err := s.HeartbeatConsumers(ctx, id, ttl, r)
	return live, err
}

func (s *consumerStore) HeartbeatConsumers(_ context.Context, _ string, _ time.Duration, r limiter.ReplicaReport) (int, int, error) {
	if err := s.fail(); err != nil {
		return 0, 0, err
	}
	s.reports <- r
	consuming := s.othersLive - s.othersIdle
	if !r.Idle {
		consuming++
	}
	return s.othersLive + 1, consuming, nil
}

// TestFallbackShareLeavesIdleReplicasOut: four live replicas share 40/s,
// two of them idle (Kafka group members without partitions). When the
// store fails, a replica that consumes limits locally at 40/2, not 40/4;
// an idle one counts itself (it may be given partitions during the
// outage): 40/3. Its heartbeats say it is idle.
func TestFallbackShareLeavesIdleReplicasOut(t *testing.T) {
	for _, tc := range []struct {
		idle bool
		want float64
	}{
		{false, 20}, // 4 live, 2 idle
		{true, 40.0 / 3},
	} {
		clk := clocktest.New(storetest.Base)
		s := &consumerStore{
			trackedStore: &trackedStore{clockedStore: newClockedStore(t, clk, 40, 40, 0)},
			othersLive:   3, othersIdle: 2 - btoi(tc.idle),
			reports: make(chan limiter.ReplicaReport, 8),
		}
		b, err := limiter.New(s, limiter.Options{Clock: clk, Logger: discardLogger(), Lease: limiter.LeaseOptions{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		b.SetIdle(tc.idle)
		<-s.reports // the first beat, at start, may have gone before SetIdle
		clk.WaitTimers(t, 1)
		clk.Advance(500 * time.Millisecond) // the second beat
		if r := <-s.reports; r.Idle != tc.idle {
			t.Errorf("idle %v: the heartbeat reports Idle %v", tc.idle, r.Idle)
		}
		if b.Idle() != tc.idle {
			t.Errorf("Idle() = %v after SetIdle(%v)", b.Idle(), tc.idle)
		}
		s.down.Store(true)
		if _, err := b.Allow(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		if b.Mode() != limiter.ModeLocal {
			t.Fatalf("mode %s after the store failed, want local", b.Mode())
		}
		st, err := b.State(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if d := st.Rate - tc.want; d > 1e-9 || d < -1e-9 {
			t.Errorf("idle %v: local rate %v, want %v (40/s among the replicas that consume, this one included)", tc.idle, st.Rate, tc.want)
		}
		b.Close()
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
