package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/internal/redisconn"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// faultName returns a bucket, queue or topic name unique to this test run.
func faultName(t testing.TB) string { return testenv.Name(t, "fault") }

// faultLogger returns a logger that writes to the test's log.
func faultLogger(t testing.TB) *slog.Logger { return testenv.Logger(t, slog.LevelInfo) }

// faultReplica is one replica's Bucket on its own Redis client, with
// counters of what its Observer saw.
type faultReplica struct {
	Bucket      *limiter.Bucket
	Client      redis.UniversalClient
	Store       *redislimiter.Store
	StoreErrors atomic.Int64
	Transitions atomic.Int64
}

// faultBucketSpec says how to build the replicas of one bucket.
type faultBucketSpec struct {
	Redis    config.Redis
	Bucket   string
	Rate     float64
	Burst    int
	Replicas int
	Options  limiter.Options
}

// faultNewReplicas builds spec.Replicas Buckets, each on its own client
// from redisconn, closed when the test ends.
func faultNewReplicas(t testing.TB, spec faultBucketSpec) []*faultReplica {
	t.Helper()
	var out []*faultReplica
	for i := range spec.Replicas {
		client, err := redisconn.New(spec.Redis)
		if err != nil {
			t.Fatalf("redisconn.New: %v", err)
		}
		store, err := redislimiter.New(client, redislimiter.Config{Bucket: spec.Bucket, Rate: spec.Rate, Burst: spec.Burst})
		if err != nil {
			t.Fatal(err)
		}
		r := &faultReplica{Client: client, Store: store}
		opts := spec.Options
		opts.ReplicaID = fmt.Sprintf("%s-replica-%d", spec.Bucket, i)
		if opts.Logger == nil {
			opts.Logger = faultLogger(t).With("replica", i)
		}
		opts.Observer = &limiter.Observer{
			StoreError:  func(error) { r.StoreErrors.Add(1) },
			ModeChanged: func(from, to limiter.Mode, err error) { r.Transitions.Add(1) },
		}
		r.Bucket, err = limiter.New(store, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			r.Bucket.Close()
			client.Close()
		})
		out = append(out, r)
	}
	return out
}

// faultAllModes reports whether every replica is in mode m.
func faultAllModes(reps []*faultReplica, m limiter.Mode) bool {
	for _, r := range reps {
		if r.Bucket.Mode() != m {
			return false
		}
	}
	return true
}

// faultRun records the grants of goroutines that call Wait in a loop.
type faultRun struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	grants  []time.Time
	perRep  []int
	errs    []error
	handled atomic.Int64
}

// faultDrive starts perReplica goroutines on each replica that call
// Wait(ctx, 1) in a loop until ctx ends, then spend handle (if not nil) on
// the message. Call Wait on the result to join them.
func faultDrive(ctx context.Context, reps []*faultReplica, perReplica int, handle func()) *faultRun {
	run := &faultRun{perRep: make([]int, len(reps))}
	for i, r := range reps {
		for range perReplica {
			run.wg.Add(1)
			go func() {
				defer run.wg.Done()
				for {
					err := r.Bucket.Wait(ctx, 1)
					now := time.Now()
					if ctx.Err() != nil {
						return // a grant racing the end of the run is not counted
					}
					run.mu.Lock()
					if err != nil {
						run.errs = append(run.errs, err)
					} else {
						run.grants = append(run.grants, now)
						run.perRep[i]++
					}
					run.mu.Unlock()
					if err != nil {
						return
					}
					if handle != nil {
						handle()
					}
					run.handled.Add(1)
				}
			}()
		}
	}
	return run
}

// Wait joins the goroutines and returns the errors they saw, other than
// the end of their context.
func (r *faultRun) Wait() error {
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.errs...)
}

// Count returns the grants in [from, to).
func (r *faultRun) Count(from, to time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, g := range r.grants {
		if !g.Before(from) && g.Before(to) {
			n++
		}
	}
	return n
}

// Total returns all grants and the per-replica counts.
func (r *faultRun) Total() (int, []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.grants), append([]int(nil), r.perRep...)
}

// faultRate returns n events over [from, to) as events per second.
func faultRate(n int, from, to time.Time) float64 {
	return float64(n) / to.Sub(from).Seconds()
}

// faultSleepUntil sleeps until t, or returns early when ctx ends.
func faultSleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}
