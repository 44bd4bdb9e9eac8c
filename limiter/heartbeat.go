package limiter

import (
	"context"
	"time"
)

// heartbeat reports this replica alive every HeartbeatInterval. The first
// beat goes at once and the second after at most 500 ms, so that replicas
// started together learn each other's count quickly and size their leases
// and fallback shares for it.
func (b *Bucket) heartbeat(rt ReplicaTracker) {
	defer b.wg.Done()
	t := b.clock.NewTimer(min(b.opts.HeartbeatInterval, 500*time.Millisecond))
	defer t.Stop()
	for {
		if b.Mode() == ModeShared {
			ctx, cancel := context.WithTimeout(context.Background(), b.opts.HeartbeatInterval)
			n, err := b.beat(ctx, rt)
			cancel()
			if err == nil && n > 0 {
				b.setReplicas(n)
			}
		}
		select {
		case <-b.done:
			return
		case <-t.C():
			t.Reset(b.opts.HeartbeatInterval)
		}
	}
}

// beat sends one heartbeat, with this replica's report when the tracker
// takes one.
func (b *Bucket) beat(ctx context.Context, rt ReplicaTracker) (int, error) {
	ttl := 3 * b.opts.HeartbeatInterval
	if r, ok := rt.(ReportingTracker); ok {
		return r.HeartbeatReport(ctx, b.opts.ReplicaID, ttl, ReplicaReport{
			Mode:              b.Mode(),
			Granted:           b.Granted(),
			Waiting:           b.Waiting(),
			WaitingByPriority: b.WaitingByPriority(),
			Exceeded:          b.Exceeded(),
		})
	}
	return rt.Heartbeat(ctx, b.opts.ReplicaID, ttl)
}

// setReplicas records the live replica count. For three heartbeat
// intervals after the store came back it only lets the count grow: a Redis
// restarted without persistence, or a promoted Sentinel replica, may have
// lost the heartbeats, and a count of 1 then would size a second fallback
// at the whole rate on every replica.
func (b *Bucket) setReplicas(n int) {
	defer b.countKnown.Store(true)
	if int64(n) < b.replicas.Load() &&
		b.clock.Now().Sub(time.Unix(0, b.recoveredAt.Load())) < 3*b.opts.HeartbeatInterval {
		return
	}
	b.replicas.Store(int64(n))
}
