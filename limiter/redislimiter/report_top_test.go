package redislimiter

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/topk"
	"github.com/throttlehq/throttle/limiter"
)

// TestReplicaReportsTops: a heartbeat carries the keys each layer refused
// most and the tenants' tokens and waiting, keys of any characters, and
// Replicas reads them back, beside the other tokens of the report.
func TestReplicaReportsTops(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 40, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	odd := "a b,c=d:e%f+g é"
	r := backend.ReplicaReport{
		Mode:     limiter.ModeShared,
		Exceeded: map[string]int64{"per-recipient": 7},
		RefusedKeys: map[string][]topk.Entry{
			"per-recipient": {{Key: "+33612345678", Count: 5}, {Key: odd, Count: 2}},
			"fair":          {{Key: "acme", Count: 1}},
		},
		TenantTokens:      []topk.Entry{{Key: "acme", Count: 90}, {Key: odd, Count: 10}},
		TenantTokensTotal: 120,
		TenantsWaiting:    []topk.Entry{{Key: "acme", Count: 4}},
		Backlog:           &backend.Backlog{Ready: 3},
	}
	if _, err := s.HeartbeatReport(ctx, "r1", time.Minute, r); err != nil {
		t.Fatal(err)
	}
	if _, err := s.HeartbeatReport(ctx, "bare", time.Minute, backend.ReplicaReport{Mode: limiter.ModeShared}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Admin().Replicas(ctx)
	if err != nil || len(got) != 2 {
		t.Fatalf("Replicas = %+v, %v", got, err)
	}
	bare, r1 := got[0], got[1]
	wantRefused := map[string]map[string]int64{"per-recipient": {"+33612345678": 5, odd: 2}, "fair": {"acme": 1}}
	if !reflect.DeepEqual(r1.RefusedKeys, wantRefused) {
		t.Errorf("RefusedKeys = %v, want %v", r1.RefusedKeys, wantRefused)
	}
	if want := map[string]int64{"acme": 90, odd: 10}; !reflect.DeepEqual(r1.TenantTokens, want) || r1.TenantTokensTotal != 120 {
		t.Errorf("TenantTokens = %v of %d, want %v of 120", r1.TenantTokens, r1.TenantTokensTotal, want)
	}
	if want := map[string]int64{"acme": 4}; !reflect.DeepEqual(r1.TenantsWaiting, want) {
		t.Errorf("TenantsWaiting = %v, want %v", r1.TenantsWaiting, want)
	}
	if r1.Exceeded["per-recipient"] != 7 || r1.Backlog == nil || r1.Backlog.Ready != 3 || r1.BeatAt.IsZero() {
		t.Errorf("the rest of the report: %+v", r1)
	}
	if bare.RefusedKeys != nil || bare.TenantTokens != nil || bare.TenantsWaiting != nil || bare.TenantTokensTotal != 0 {
		t.Errorf("a report without tops: %+v", bare)
	}
}

func TestParseTopsMalformed(t *testing.T) {
	for _, bad := range []string{"k:layer:a", "k::a=1", "k:layer:a=-1", "t:x:a=1", "q:%zz=1", "q:=1"} {
		var r Replica
		if !r.parseTops(bad) {
			t.Errorf("%q not taken as a top list", bad)
		}
		if r.RefusedKeys != nil || r.TenantTokens != nil || r.TenantsWaiting != nil {
			t.Errorf("%q parsed as %+v", bad, r)
		}
	}
}
