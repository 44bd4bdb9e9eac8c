package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// TestBucketSetWithoutReplicas: 'bucket set' on a bucket that no replica
// uses stores the override all the same, but says that no replica is
// using the bucket now, on stdout and as a warning on stderr, instead of
// claiming that every running replica takes it up.
func TestBucketSetWithoutReplicas(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli")
	t.Cleanup(func() { runCLI(t, "bucket", "reset", name, "--redis", addr) })
	code, stdout, stderr := runCLI(t, "bucket", "set", name, "--redis", addr, "--rate", "40")
	if code != ExitOK {
		t.Fatalf("set: exit %d, stderr %q", code, stderr)
	}
	if strings.Contains(stdout, "every running replica") || !strings.Contains(stdout, "no replica is using it now (no live heartbeat)") {
		t.Errorf("set without replicas: stdout %q, want it to say that no replica is using the bucket", stdout)
	}
	if !strings.HasPrefix(stderr, "throttle: warning: no replica is using bucket "+name+" now") {
		t.Errorf("set without replicas: stderr %q, want a warning naming the bucket", stderr)
	}
	if st := bucketJSON(t, "status", name, "--redis", addr); st.Override == nil || st.Override.Rate != 40 {
		t.Errorf("override %+v after set, want 40/s: it is stored for replicas started later", st.Override)
	}
	// With --json the warning goes to stderr too.
	_, _, stderr = runCLI(t, "bucket", "set", name, "--redis", addr, "--rate", "30", "--json")
	if !strings.Contains(stderr, "warning: no replica is using bucket "+name) {
		t.Errorf("set --json without replicas: stderr %q, want the warning", stderr)
	}

	// A live replica: no warning.
	_, store := redisStore(t, addr, name, 5, 1)
	if _, err := store.Heartbeat(context.Background(), "r1", time.Minute); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, "bucket", "set", name, "--redis", addr, "--rate", "50")
	if code != ExitOK || !strings.Contains(stdout, "every running replica takes it up") || stderr != "" {
		t.Errorf("set with a live replica: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestBucketStatusUnknownName: 'bucket status' of a name that nothing uses
// (no state, no override, no heartbeat) warns that it is likely a typo.
func TestBucketStatusUnknownName(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli") + "-typo"
	st := bucketJSON(t, "status", name, "--redis", addr)
	if len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "nothing uses bucket "+name) || !strings.Contains(st.Warnings[0], "typo") {
		t.Errorf("warnings %q, want one saying that nothing uses %s (a typo?)", st.Warnings, name)
	}
	code, stdout, _ := runCLI(t, "bucket", "status", name, "--redis", addr)
	if code != ExitOK || !strings.Contains(stdout, "warning     nothing uses bucket "+name) {
		t.Errorf("status: exit %d:\n%s", code, stdout)
	}
	// A bucket with an override is in use, with or without replicas.
	t.Cleanup(func() { runCLI(t, "bucket", "reset", name, "--redis", addr) })
	runCLI(t, "bucket", "set", name, "--redis", addr, "--rate", "10")
	if st := bucketJSON(t, "status", name, "--redis", addr); len(st.Warnings) != 0 {
		t.Errorf("warnings %q with an override, want none", st.Warnings)
	}
}

// TestBucketStatusIdleReplicas: a replica whose Bucket is idle (a Kafka
// member without partitions) is shown so by 'bucket status', in text and
// JSON, from its heartbeat.
func TestBucketStatusIdleReplicas(t *testing.T) {
	addr := testenv.RedisAddr(t)
	name := testenv.Name(t, "cli")
	t.Cleanup(func() { runCLI(t, "bucket", "reset", name, "--redis", addr) })
	for _, id := range []string{"consuming", "idle"} {
		_, store := redisStore(t, addr, name, 10, 5)
		b, err := limiter.New(store, limiter.Options{ReplicaID: id, HeartbeatInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		b.SetIdle(id == "idle")
	}
	_, store := redisStore(t, addr, name, 10, 5)
	ctx := testenv.Context(t, 10*time.Second)
	for {
		reps, err := store.Admin().Replicas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(reps) == 2 && reps[1].Idle {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("replicas %+v: want the idle one to report it", reps)
		case <-time.After(20 * time.Millisecond):
		}
	}
	st := bucketJSON(t, "status", name, "--redis", addr)
	idle := map[string]bool{}
	for _, r := range st.Replicas {
		idle[r.ID] = r.Idle
	}
	if len(idle) != 2 || idle["consuming"] || !idle["idle"] {
		t.Errorf("replicas %+v: want consuming not idle, idle idle", st.Replicas)
	}
	code, stdout, _ := runCLI(t, "bucket", "status", name, "--redis", addr)
	if code != ExitOK || !strings.Contains(stdout, "replicas    2 alive, 1 idle: consuming, idle (idle: consumes nothing)") {
		t.Errorf("status: exit %d:\n%s", code, stdout)
	}
}
