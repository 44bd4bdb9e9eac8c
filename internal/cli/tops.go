package cli

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/throttlehq/throttle/internal/topk"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// The replicas each report at most 10 keys a layer refused most and 10
// tenants (limiter heartbeats); 'bucket status --json' and the console
// show the topJSON largest of their sums, the text of status and watch
// the topText largest.
const (
	topJSON = 10
	topText = 5
)

// keyCountJSON is a key a layer refused, and how many times over the last
// minute, summed over the live replicas.
type keyCountJSON struct {
	Key     string `json:"key"`
	Refused int64  `json:"refused"`
}

// tenantsJSON is the top tenants of fair shares (limit.fair), from the
// live replicas' heartbeats.
type tenantsJSON struct {
	// ByShare is the tenants granted the most tokens over the last
	// minute, with their share of the tokens granted to every tenant.
	ByShare []tenantShareJSON `json:"by_share"`
	// ByWaiting is the tenants with the most messages waiting now, on a
	// reservation or for their share.
	ByWaiting []tenantWaitingJSON `json:"by_waiting"`
}

type tenantShareJSON struct {
	Tenant string  `json:"tenant"`
	Tokens int64   `json:"tokens"`
	Share  float64 `json:"share"`
}

type tenantWaitingJSON struct {
	Tenant  string `json:"tenant"`
	Waiting int64  `json:"waiting"`
}

// topRefused sums the keys each layer refused most, as the live replicas
// reported them, and returns the n largest of each layer (never nil).
func topRefused(reps []redislimiter.Replica, n int) map[string][]keyCountJSON {
	byLayer := map[string][]map[string]int64{}
	for _, r := range reps {
		for layer, keys := range r.RefusedKeys {
			byLayer[layer] = append(byLayer[layer], keys)
		}
	}
	out := map[string][]keyCountJSON{}
	for layer, lists := range byLayer {
		for _, e := range topk.Merge(lists, n) {
			out[layer] = append(out[layer], keyCountJSON{Key: e.Key, Refused: e.Count})
		}
	}
	return out
}

// topTenants sums the tenants' tokens and waiting messages the live
// replicas reported, and returns the n largest of each; nil when no
// replica reports tenants (no fair shares, or none granted or waiting).
func topTenants(reps []redislimiter.Replica, n int) *tenantsJSON {
	var tokens, waiting []map[string]int64
	var total int64
	for _, r := range reps {
		tokens, waiting, total = append(tokens, r.TenantTokens), append(waiting, r.TenantsWaiting), total+r.TenantTokensTotal
	}
	byShare, byWaiting := topk.Merge(tokens, n), topk.Merge(waiting, n)
	if len(byShare) == 0 && len(byWaiting) == 0 {
		return nil
	}
	out := &tenantsJSON{ByShare: []tenantShareJSON{}, ByWaiting: []tenantWaitingJSON{}}
	for _, e := range byShare {
		out.ByShare = append(out.ByShare, tenantShareJSON{Tenant: e.Key, Tokens: e.Count, Share: float64(e.Count) / float64(max(total, e.Count))})
	}
	for _, e := range byWaiting {
		out.ByWaiting = append(out.ByWaiting, tenantWaitingJSON{Tenant: e.Key, Waiting: e.Count})
	}
	return out
}

// showKey writes a key for a line of text: as it is, or quoted when it
// holds white space, a separator or a character that does not print.
func showKey(k string) string {
	if k == "" || strings.ContainsAny(k, " \t\r\n,:=\"") || strconv.Quote(k) != `"`+k+`"` {
		return strconv.Quote(k)
	}
	return k
}

// describeRefused says the keys of a layer refused most, such as
// "+33612345678 12, +447700900123 3".
func describeRefused(keys []keyCountJSON, n int) string {
	parts := make([]string, 0, min(n, len(keys)))
	for _, k := range keys[:min(n, len(keys))] {
		parts = append(parts, fmt.Sprintf("%s %d", showKey(k.Key), k.Refused))
	}
	return strings.Join(parts, ", ")
}

// describeShares says the tenants by share, such as "acme 62%, beta 38%".
func describeShares(ts []tenantShareJSON, n int) string {
	parts := make([]string, 0, min(n, len(ts)))
	for _, t := range ts[:min(n, len(ts))] {
		parts = append(parts, fmt.Sprintf("%s %d%%", showKey(t.Tenant), int(math.Round(100*t.Share))))
	}
	return strings.Join(parts, ", ")
}

// describeWaiting says the tenants by waiting, such as "acme 4, beta 1".
func describeWaiting(ts []tenantWaitingJSON, n int) string {
	parts := make([]string, 0, min(n, len(ts)))
	for _, t := range ts[:min(n, len(ts))] {
		parts = append(parts, fmt.Sprintf("%s %d", showKey(t.Tenant), t.Waiting))
	}
	return strings.Join(parts, ", ")
}

// writeTops prints the status lines of the keys refused most and the top
// tenants, when the replicas report any.
func writeTops(w io.Writer, refused map[string][]keyCountJSON, tenants *tenantsJSON) {
	line := func(k, format string, args ...any) { fmt.Fprintf(w, "  %-11s %s\n", k, fmt.Sprintf(format, args...)) }
	for _, layer := range slices.Sorted(maps.Keys(refused)) {
		line("refused", "%s, last minute: %s", layer, describeRefused(refused[layer], topText))
	}
	if tenants == nil {
		return
	}
	if len(tenants.ByShare) > 0 {
		line("tenants", "by share of the last minute's tokens: %s", describeShares(tenants.ByShare, topText))
	}
	if len(tenants.ByWaiting) > 0 {
		line("tenants", "by messages waiting now: %s", describeWaiting(tenants.ByWaiting, topText))
	}
}
