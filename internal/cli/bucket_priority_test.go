package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// TestBucketStatusClasses: bucket status shows the tokens each class holds
// reserved, from the store, and the messages each class has waiting,
// summed over the replicas' heartbeats; a bucket whose classes are all
// normal shows no classes line.
func TestBucketStatusClasses(t *testing.T) {
	path, store := statusBucket(t, "cli", 1, 2)
	ctx := testenv.Context(t, 10*time.Second)

	if code, out, _ := runCLI(t, "bucket", "status", "--config", path); code != ExitOK || strings.Contains(out, "\n  classes") {
		t.Errorf("a new bucket: exit %d, a classes line:\n%s", code, out)
	}
	// The burst, then 3 low tokens reserved ahead, then 1 high token,
	// which goes ahead of them.
	take := func(p limiter.Priority) {
		t.Helper()
		res, err := store.Take(ctx, backend.TakeRequest{Cost: 1, MaxWait: time.Minute, Priority: p})
		if err != nil || !res.Granted {
			t.Fatalf("take %v: %+v, %v", p, res, err)
		}
	}
	// The refill counts from the first take (the bucket's tokens are kept
	// as of each take), so the clock starts before it.
	took := time.Now()
	for _, p := range []limiter.Priority{limiter.PriorityLow, limiter.PriorityLow, limiter.PriorityLow, limiter.PriorityLow, limiter.PriorityLow, limiter.PriorityHigh} {
		take(p)
	}
	var w1, w2 [limiter.NumPriorities]int
	w1[limiter.PriorityLow], w1[limiter.PriorityHigh] = 3, 1
	w2[limiter.PriorityLow] = 2
	for id, w := range map[string][limiter.NumPriorities]int{"marketing-1": w1, "marketing-2": w2} {
		if _, err := store.HeartbeatReport(ctx, id, time.Minute, backend.ReplicaReport{Mode: limiter.ModeShared, WaitingByPriority: w}); err != nil {
			t.Fatal(err)
		}
	}

	code, stdout, stderr := runCLI(t, "bucket", "status", "--config", path, "--json")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	refilled := time.Since(took).Seconds() * 1 // at most, at 1/s, repaying the front of the queue
	var st struct {
		Classes []classJSON `json:"classes"`
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Classes) != 3 {
		t.Fatalf("classes %+v, want high, normal, low", st.Classes)
	}
	for i, want := range []struct {
		class    string
		reserved float64
		waiting  int
	}{{"high", 1, 1}, {"normal", 0, 0}, {"low", 3, 5}} {
		c := st.Classes[i]
		// Some ms pass between the takes and the status: the refill at
		// 1/s repays the front of the queue, high's token first.
		if c.Priority != want.class || c.Reserved == nil || *c.Reserved > want.reserved || *c.Reserved < want.reserved-refilled-0.001 || c.Waiting != want.waiting {
			t.Errorf("class %d: %+v (reserved %v), want %+v", i, c, c.Reserved, want)
		}
	}
	_, out, _ := runCLI(t, "bucket", "status", "--config", path)
	if !strings.Contains(out, "classes     high ") || !strings.Contains(out, ", 1 waiting; normal 0 reserved, 0 waiting; low ") || !strings.Contains(out, ", 5 waiting\n") {
		t.Errorf("the classes line:\n%s", out)
	}
	t.Logf("bucket status:\n%s", out)
}
