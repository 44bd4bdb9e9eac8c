package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// TestReplicaReportsWaitingByPriority: a replica's heartbeat carries the
// calls waiting in each class, beside the layers' refusals, and Replicas
// reads them back; a replica with none waiting reports zeros.
func TestReplicaReportsWaitingByPriority(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	name := uniqueBucket(t, c)
	s, err := New(c, Config{Bucket: name, Rate: 40, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	var w [limiter.NumPriorities]int
	w[limiter.PriorityHigh], w[limiter.PriorityLow] = 2, 31
	reports := map[string]backend.ReplicaReport{
		"busy": {Mode: limiter.ModeShared, Waiting: 33, WaitingByPriority: w, Exceeded: map[string]int64{"daily": 4}},
		"idle": {Mode: limiter.ModeShared},
	}
	for id, r := range reports {
		if _, err := s.HeartbeatReport(ctx, id, time.Minute, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Admin().Replicas(ctx)
	if err != nil || len(got) != 2 {
		t.Fatalf("Replicas = %+v, %v", got, err)
	}
	for _, r := range got {
		want := reports[r.ID]
		if !r.Reported || r.Waiting != want.Waiting || r.WaitingByPriority != want.WaitingByPriority || r.Exceeded["daily"] != want.Exceeded["daily"] {
			t.Errorf("replica %s: %+v, want the report %+v", r.ID, r, want)
		}
	}
}

func TestParseWaitingByPriority(t *testing.T) {
	var want [limiter.NumPriorities]int
	want[limiter.PriorityHigh], want[limiter.PriorityNormal], want[limiter.PriorityLow] = 1, 2, 3
	if got, ok := parseWaitingByPriority("w:1,2,3"); !ok || got != want {
		t.Errorf("w:1,2,3 = %v, %v; want %v", got, ok, want)
	}
	for _, bad := range []string{"x:daily:3", "w:1,2", "w:1,2,3,4", "w:1,-2,3", "w:a,b,c", "w:"} {
		if got, ok := parseWaitingByPriority(bad); ok {
			t.Errorf("%q parsed as %v", bad, got)
		}
	}
}

// TestReplicaReportsBacklog: a heartbeat carries the source's backlog
// while the replica knows it, and Replicas reads it back; unknown stays
// nil.
func TestReplicaReportsBacklog(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 40, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	reports := map[string]backend.ReplicaReport{
		"knows":   {Mode: limiter.ModeShared, Backlog: &backend.Backlog{Ready: 1200, SetAside: 35}, WaitingByPriority: [limiter.NumPriorities]int{1, 2, 3}},
		"unknown": {Mode: limiter.ModeShared, Idle: true},
	}
	for id, r := range reports {
		if _, err := s.HeartbeatReport(ctx, id, time.Minute, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Admin().Replicas(ctx)
	if err != nil || len(got) != 2 {
		t.Fatalf("Replicas = %+v, %v", got, err)
	}
	for _, r := range got {
		want := reports[r.ID].Backlog
		if (want == nil) != (r.Backlog == nil) || (want != nil && *want != *r.Backlog) || r.Idle != reports[r.ID].Idle {
			t.Errorf("replica %s: backlog %v, want %v", r.ID, r.Backlog, want)
		}
	}
	for _, bad := range []string{"b:", "b:1", "b:-1,2", "b:1,x", "b:1,2,3"} {
		if bl, ok := parseBacklog(bad); ok {
			t.Errorf("%q parsed as %+v", bad, bl)
		}
	}
}
