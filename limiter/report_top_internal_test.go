package limiter

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/topk"
	"github.com/throttlehq/throttle/limiter/internal/clocktest"
)

// recordingTracker keeps the last report a heartbeat carried.
type recordingTracker struct{ last backend.ReplicaReport }

func (r *recordingTracker) Heartbeat(context.Context, string, time.Duration) (int, error) {
	return 1, nil
}
func (r *recordingTracker) Leave(context.Context, string) error { return nil }
func (r *recordingTracker) HeartbeatReport(_ context.Context, _ string, _ time.Duration, rep backend.ReplicaReport) (int, error) {
	r.last = rep
	return 1, nil
}

// TestHeartbeatCarriesTopKeysAndTenants: the heartbeat's report names the
// keys a layer refused (and a shadow layer would have) and the tenants'
// tokens over the last minute, and the tenants waiting now; a minute later
// the refusals and tokens have left the window.
func TestHeartbeatCarriesTopKeysAndTenants(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC))
	s, err := NewLocalFairStore(1000, 10, Fair{},
		Layer{Name: "per-recipient", Keyed: true, Rate: 0.001, Burst: 1, OnExceed: ActionDeadLetter},
		Layer{Name: "per-sender", Keyed: true, Rate: 0.001, Burst: 1, Shadow: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(s, Options{Clock: clk, Lease: LeaseOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	req := func(to, from, tenant string) Request {
		return Request{Cost: 1, Keys: map[string]string{"per-recipient": to, "per-sender": from}, Tenant: tenant}
	}
	for _, r := range []Request{
		req("+33612345678", "s1", "acme"),
		req("+33612345678", "s1", "acme"),  // refused by per-recipient
		req("+33612345678", "s2", "beta"),  // refused
		req("+447700900123", "s1", "acme"), // granted; per-sender would have refused
	} {
		_ = b.WaitN(ctx, r)
	}
	b.layered.tenantEnter("gamma") // a call in progress
	rec := &recordingTracker{}
	if _, err := b.beat(ctx, rec); err != nil {
		t.Fatal(err)
	}
	wantRefused := map[string][]topk.Entry{
		"per-recipient": {{Key: "+33612345678", Count: 2}},
		"per-sender":    {{Key: "s1", Count: 1}},
	}
	if got := rec.last.RefusedKeys; !reflect.DeepEqual(got, wantRefused) {
		t.Errorf("RefusedKeys = %v, want %v", got, wantRefused)
	}
	if got, want := rec.last.TenantTokens, []topk.Entry{{Key: "acme", Count: 2}}; !reflect.DeepEqual(got, want) || rec.last.TenantTokensTotal != 2 {
		t.Errorf("TenantTokens = %v of %d, want %v of 2", got, rec.last.TenantTokensTotal, want)
	}
	if got, want := rec.last.TenantsWaiting, []topk.Entry{{Key: "gamma", Count: 1}}; !reflect.DeepEqual(got, want) {
		t.Errorf("TenantsWaiting = %v, want %v", got, want)
	}
	b.layered.tenantLeave("gamma")
	clk.Advance(61 * time.Second)
	if _, err := b.beat(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if r := rec.last; r.RefusedKeys != nil || r.TenantTokens != nil || r.TenantTokensTotal != 0 || r.TenantsWaiting != nil {
		t.Errorf("a minute later: %+v, want no refusals, tokens or waiting", r)
	}
}
