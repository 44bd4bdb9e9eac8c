package cli

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// twoReplicas report the keys they refused and their tenants, as their
// heartbeats carry them.
var twoReplicas = []redislimiter.Replica{
	{ID: "r1", Reported: true, Mode: "shared", Exceeded: map[string]int64{"per-recipient": 6},
		RefusedKeys:  map[string]map[string]int64{"per-recipient": {"+33612345678": 5, "+447700900123": 1}},
		TenantTokens: map[string]int64{"acme": 60, "beta": 20}, TenantTokensTotal: 90,
		TenantsWaiting: map[string]int64{"acme": 4}},
	{ID: "r2", Reported: true, Mode: "shared", Exceeded: map[string]int64{"per-recipient": 4, "fair": 2},
		RefusedKeys:  map[string]map[string]int64{"per-recipient": {"+447700900123": 3, "a b": 1}, "fair": {"acme": 2}},
		TenantTokens: map[string]int64{"acme": 40, "beta": 60}, TenantTokensTotal: 110,
		TenantsWaiting: map[string]int64{"beta": 1, "acme": 1}},
}

func TestTopsMergeTheReplicas(t *testing.T) {
	got := topRefused(twoReplicas, 2)
	want := map[string][]keyCountJSON{
		"per-recipient": {{"+33612345678", 5}, {"+447700900123", 4}},
		"fair":          {{"acme", 2}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("topRefused = %v, want %v", got, want)
	}
	tenants := topTenants(twoReplicas, 10)
	wantT := &tenantsJSON{
		ByShare:   []tenantShareJSON{{"acme", 100, 0.5}, {"beta", 80, 0.4}},
		ByWaiting: []tenantWaitingJSON{{"acme", 5}, {"beta", 1}},
	}
	if !reflect.DeepEqual(tenants, wantT) {
		t.Errorf("topTenants = %+v, want %+v", tenants, wantT)
	}
	if got := topTenants([]redislimiter.Replica{{ID: "x"}}, 10); got != nil {
		t.Errorf("topTenants without fair shares = %+v, want nil", got)
	}
	var b bytes.Buffer
	writeTops(&b, topRefused(twoReplicas, topText), tenants)
	for _, line := range []string{
		"  refused     fair, last minute: acme 2\n",
		"  refused     per-recipient, last minute: +33612345678 5, +447700900123 4, \"a b\" 1\n",
		"  tenants     by share of the last minute's tokens: acme 50%, beta 40%\n",
		"  tenants     by messages waiting now: acme 5, beta 1\n",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("status lacks %q:\n%s", line, b.String())
		}
	}
}

func TestWatchShowsTops(t *testing.T) {
	h := newWatchHistory("sms", time.Second)
	h.layersKnown = true
	s := sample{at: time.Unix(1000, 0), replicas: twoReplicas, layers: []layerView{{name: "per-recipient", desc: "1/h", state: "3 keys in use"}}}
	v := h.add(s, nil, time.Unix(1000, 0))
	line := watchLine(v)
	for _, want := range []string{
		` top_refused[per-recipient]=+33612345678:5,+447700900123:4,"a b":1`,
		` top_refused[fair]=acme:2`,
		` tenants_share=acme:50%,beta:40% tenants_waiting=acme:5,beta:1`,
	} {
		if !strings.Contains(line, want) {
			t.Errorf("watch line lacks %q: %s", want, line)
		}
	}
	screen := renderWatch(v)
	for _, want := range []string{"+33612345678 5, +447700900123 4, \"a b\" 1", "tenants     by share of the last minute's tokens: acme 50%, beta 40%", "by messages waiting now: acme 5, beta 1"} {
		if !strings.Contains(screen, want) {
			t.Errorf("watch screen lacks %q:\n%s", want, screen)
		}
	}
}

// TestBucketStatusShowsTopKeysAndTenants runs a replica of a bucket with
// fair shares and a keyed dead_letter layer on the shared Redis, and checks
// that 'bucket status' (text and --json) shows the key the layer refused
// and the tenants' shares, carried by the replica's heartbeats.
func TestBucketStatusShowsTopKeysAndTenants(t *testing.T) {
	path, _ := writeLayersConfig(t, "tops", `    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 1/h
      burst: 1
      on_exceed: dead_letter`)
	_, ls := openLayers(t, path)
	fls, err := ls.WithFair(limiter.Fair{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.New(fls, limiter.Options{ReplicaID: "tops-replica", HeartbeatInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		runCLI(t, "bucket", "reset", "--config", path)
	})
	ctx := testenv.Context(t, 10*time.Second)
	req := func(to, tenant string) limiter.Request {
		return limiter.Request{Cost: 1, Keys: map[string]string{"per-recipient": to}, Tenant: tenant}
	}
	for i, r := range []limiter.Request{req("+33612345678", "acme"), req("+33612345678", "acme"), req("+33612345678", "beta"), req("+447700900123", "acme"), req("+447700900124", "beta")} {
		if err := b.WaitN(ctx, r); (err != nil) != (i == 1 || i == 2) {
			t.Fatalf("WaitN %d = %v", i, err)
		}
	}
	var st bucketStatus
	testenv.Eventually(t, 5*time.Second, "the heartbeat to carry the top keys and tenants", func() bool {
		_, out, _ := runCLI(t, "bucket", "status", "--config", path, "--json")
		st = bucketStatus{}
		return json.Unmarshal([]byte(out), &st) == nil && len(st.TopRefused["per-recipient"]) > 0 && st.Tenants != nil
	})
	if got, want := st.TopRefused["per-recipient"], []keyCountJSON{{"+33612345678", 2}}; !reflect.DeepEqual(got, want) {
		t.Errorf("top_refused = %v, want %v", got, want)
	}
	if got, want := st.Tenants.ByShare, []tenantShareJSON{{"acme", 2, 2.0 / 3}, {"beta", 1, 1.0 / 3}}; !reflect.DeepEqual(got, want) {
		t.Errorf("tenants by share = %v, want %v", got, want)
	}
	_, out, _ := runCLI(t, "bucket", "status", "--config", path)
	for _, want := range []string{"refused     per-recipient, last minute: +33612345678 2\n", "tenants     by share of the last minute's tokens: acme 67%, beta 33%\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("bucket status lacks %q:\n%s", want, out)
		}
	}
}
