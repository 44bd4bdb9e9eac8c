package limiter

import (
	"context"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
)

// heartbeat reports this replica alive every HeartbeatInterval. The first
// beat goes at once and the second after at most 500 ms, so that replicas
// started together learn each other's count quickly and size their leases
// and fallback shares for it.
func (b *Bucket) heartbeat(rt backend.ReplicaTracker) {
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

// SetIdle tells the Bucket whether this replica consumes nothing now, such
// as a Kafka group member that owns no partition (idle), or consumes again
// (not idle). A Bucket starts not idle. Its heartbeats carry it from the
// next one on, and on a store that counts them (the Redis store) the
// other replicas leave an idle one out when
// they divide the rate for a local fallback (Options.OnStoreError
// ModeLocal): members without work would shrink the share of those with.
// A replica counts itself in its own share even while idle, since it may
// be given work during the outage. Safe for concurrent use.
func (b *Bucket) SetIdle(idle bool) { b.fb.idle.Store(idle) }

// SetBacklog records the source's backlog as this replica last read it:
// ready messages and those set aside by a delay layer (negative ready:
// unknown, as when the read failed). The heartbeats carry it from the next
// one on, so that an operator's view of Redis ('throttle console') shows
// it. Safe for concurrent use.
func (b *Bucket) SetBacklog(ready, setAside int64) {
	if ready < 0 {
		b.backlog.Store(nil)
		return
	}
	b.backlog.Store(&backend.Backlog{Ready: ready, SetAside: max(0, setAside)})
}

// beat sends one heartbeat, with this replica's report when the tracker
// takes one, and returns the live replicas. A tracker that counts the
// replicas that consume also updates the idle count.
func (b *Bucket) beat(ctx context.Context, rt backend.ReplicaTracker) (int, error) {
	ttl := 3 * b.opts.HeartbeatInterval
	if _, ok := rt.(backend.ReportingTracker); !ok {
		return rt.Heartbeat(ctx, b.opts.ReplicaID, ttl)
	}
	st := b.Stats()
	b.layeredStore() // sets b.layered.tenantTokens, once
	r := backend.ReplicaReport{
		Mode:              b.Mode(),
		Granted:           st.Granted,
		Waiting:           st.Waiting,
		WaitingByPriority: st.WaitingByPriority,
		Exceeded:          st.Exceeded,
		Idle:              st.Idle,
		Backlog:           b.backlog.Load(),
		RefusedKeys:       b.layered.topRefused(b.clock.Now()),
	}
	if b.layered.tenantTokens != nil {
		r.TenantTokens, r.TenantTokensTotal = b.layered.tenantTokens.Top(b.clock.Now(), reportTop)
		r.TenantsWaiting = b.layered.tenantsWaiting()
	}
	ct, ok := rt.(backend.ConsumerTracker)
	if !ok {
		return rt.(backend.ReportingTracker).HeartbeatReport(ctx, b.opts.ReplicaID, ttl, r)
	}
	live, consuming, err := ct.HeartbeatConsumers(ctx, b.opts.ReplicaID, ttl, r)
	if err == nil && live > 0 {
		if r.Idle {
			consuming++ // this one keeps its place in its own share
		}
		b.setIdleReplicas(max(0, live-consuming))
	}
	return live, err
}

// setReplicas records the live replica count. For three heartbeat
// intervals after the store came back it only lets the count grow: a Redis
// restarted without persistence, or a promoted Sentinel replica, may have
// lost the heartbeats, and a count of 1 then would size a second fallback
// at the whole rate on every replica.
func (b *Bucket) setReplicas(n int) {
	defer b.countKnown.Store(true)
	if int64(n) < b.replicas.Load() && b.recovering() {
		return
	}
	b.replicas.Store(int64(n))
}

// setIdleReplicas records the live replicas that reported themselves idle,
// this one never included. Right after the store came back it only lets
// the count shrink, as setReplicas only lets the live count grow.
func (b *Bucket) setIdleReplicas(n int) {
	if int64(n) > b.fb.idleReplicas.Load() && b.recovering() {
		return
	}
	b.fb.idleReplicas.Store(int64(n))
}

// recovering reports whether the store came back less than three
// heartbeat intervals ago.
func (b *Bucket) recovering() bool {
	return b.clock.Now().Sub(time.Unix(0, b.recoveredAt.Load())) < 3*b.opts.HeartbeatInterval
}

// shareReplicas is how many replicas the rate is divided among in a local
// fallback: the live replicas less those that reported themselves idle in
// the last heartbeats (SetIdle), at least 1. On a store that does not count
// idle replicas, every live one.
func (b *Bucket) shareReplicas() int64 {
	return max(1, b.replicas.Load()-b.fb.idleReplicas.Load())
}
