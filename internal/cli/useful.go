package cli

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// usefulGauge registers throttle_useful_replicas on reg.
func usefulGauge(reg prometheus.Registerer) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "throttle_useful_replicas",
		Help: "The smallest replica count that reaches the bucket's rate at the measured per-replica throughput (docs/kubernetes.md); replicas beyond it only wait on the shared bucket.",
	})
	reg.MustRegister(g)
	return g
}

// usefulEstimator computes throttle_useful_replicas from what 'bucket
// status' reads: the bucket's rate and each live replica's heartbeat.
//
// A replica's throughput is the increase of its granted tokens between
// its heartbeats (grantTrack, as 'bucket watch' computes it). The
// per-replica throughput is the mean of those of the replicas that report
// no call waiting for the bucket (Replica.Waiting == 0) and delivered
// something: they deliver as fast as their sink and concurrency allow, so
// their throughput is theirs, not their share of the bucket. The useful
// count is limiter.UsefulReplicas(rate, that mean). When every replica
// that delivers waits on the bucket, the bucket is the limit already: the
// count is the live replicas that deliver. Unknown (no rate, nothing
// delivered yet): no value is set.
type usefulEstimator struct {
	grants map[string]*grantTrack
}

// observe feeds one read of the replicas and returns the useful count, 0
// when unknown.
func (u *usefulEstimator) observe(at time.Time, rate float64, replicas []redislimiter.Replica) int {
	if u.grants == nil {
		u.grants = map[string]*grantTrack{}
	}
	live := map[string]bool{}
	var sum float64
	free, busy := 0, 0
	for _, r := range replicas {
		if !r.Reported {
			continue
		}
		live[r.ID] = true
		g := u.grants[r.ID]
		if g == nil {
			g = &grantTrack{}
			u.grants[r.ID] = g
		}
		g.observe(at, r.BeatAt, r.Granted)
		d := g.rate(at)
		if !(d > 0) {
			continue
		}
		if r.Waiting == 0 {
			sum += d
			free++
		} else {
			busy++
		}
	}
	for id := range u.grants {
		if !live[id] {
			delete(u.grants, id)
		}
	}
	switch {
	case free > 0:
		return limiter.UsefulReplicas(rate, sum/float64(free))
	case busy > 0:
		return busy
	}
	return 0
}

// watchUseful sets throttle_useful_replicas every interval from admin's
// bucket status and replicas, until ctx ends.
func watchUseful(ctx context.Context, admin *redislimiter.Admin, g prometheus.Gauge, interval time.Duration) {
	var u usefulEstimator
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, interval)
		st, err := admin.Status(rctx)
		var reps []redislimiter.Replica
		if err == nil {
			reps, err = admin.Replicas(rctx)
		}
		cancel()
		if err != nil {
			continue
		}
		at := st.At
		if at.IsZero() {
			at = time.Now()
		}
		if n := u.observe(at, st.Rate, reps); n > 0 {
			g.Set(float64(n))
		}
	}
}
