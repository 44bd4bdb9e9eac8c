package redislimiter

import (
	"context"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// withoutBeats returns reps with BeatAt cleared, after checking that each
// has one.
func withoutBeats(t *testing.T, reps []Replica) []Replica {
	t.Helper()
	out := make([]Replica, len(reps))
	for i, r := range reps {
		if r.BeatAt.IsZero() {
			t.Errorf("replica %s: no BeatAt", r.ID)
		}
		r.BeatAt = time.Time{}
		out[i] = r
	}
	return out
}

// TestHeartbeatCountsConsumers: the heartbeat counts the live replicas
// whose report does not say idle (a replica without a report counts as
// consuming), and Replicas says which are idle and when each beat, on
// Redis's clock.
func TestHeartbeatCountsConsumers(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	s := newStore(t, c, uniqueBucket(t, c), 10, 5)
	before, err := s.Admin().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	report := func(id string, idle bool, granted int64) (int, int) {
		t.Helper()
		live, consuming, err := s.HeartbeatConsumers(ctx, id, time.Minute, backend.ReplicaReport{Mode: limiter.ModeShared, Granted: granted, Idle: idle})
		if err != nil {
			t.Fatal(err)
		}
		return live, consuming
	}
	report("a", false, 10)
	report("b", true, 0)
	if _, err := s.Heartbeat(ctx, "old", time.Minute); err != nil { // no report: consuming
		t.Fatal(err)
	}
	if _, err := s.HeartbeatReport(ctx, "c", time.Minute, backend.ReplicaReport{Mode: limiter.ModeShared, Idle: true}); err != nil {
		t.Fatal(err)
	}
	if live, consuming := report("d", true, 0); live != 5 || consuming != 2 {
		t.Errorf("5 live replicas, 3 idle: HeartbeatConsumers = %d live, %d consuming; want 5, 2", live, consuming)
	}
	if live, consuming := report("b", false, 5); live != 5 || consuming != 3 {
		t.Errorf("b no longer idle: %d live, %d consuming; want 5, 3", live, consuming)
	}
	// An idle replica that leaves, or whose heartbeats expire, no longer
	// counts as idle.
	if err := s.Leave(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.HeartbeatConsumers(ctx, "e", time.Millisecond, backend.ReplicaReport{Mode: limiter.ModeShared, Idle: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if live, consuming := report("a", false, 20); live != 4 || consuming != 3 {
		t.Errorf("d left, e expired: %d live, %d consuming; want 4, 3 (c idle)", live, consuming)
	}
	report("d", true, 0)
	after, err := s.Admin().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := s.Admin().Replicas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	idle := map[string]bool{}
	for _, r := range reps {
		idle[r.ID] = r.Idle
		if r.BeatAt.Before(before.At) || r.BeatAt.After(after.At) {
			t.Errorf("replica %s beat at %v, not between %v and %v (Redis's clock)", r.ID, r.BeatAt, before.At, after.At)
		}
	}
	if want := map[string]bool{"a": false, "b": false, "c": true, "d": true, "old": false}; len(idle) != len(want) || idle["c"] != true || idle["d"] != true || idle["a"] || idle["b"] || idle["old"] {
		t.Errorf("idle replicas %v, want %v", idle, want)
	}
}
