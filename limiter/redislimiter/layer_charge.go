package redislimiter

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
)

// chargeBatch is how many layer keys one script call of ChargeLayers
// charges on a single node.
const chargeBatch = 128

// chargeNoCheck is the "from" instant given to layersDelayScript by
// ChargeLayers: later than any key's last send, so the script takes the
// tokens without asking whether a later message of the key still fits.
var chargeNoCheck = strconv.FormatInt(1<<62, 10)

// layersChargeQuotaScript adds to quotas and budgets what a local fallback
// used: math.lua, lua/layer_prelude.lua, then lua/layers_charge_quota.lua.
var layersChargeQuotaScript = redis.NewScript(mathLua + luaSource("layer_prelude.lua") + luaSource("layers_charge_quota.lua"))

// ChargeLayers implements backend.LayerCharger: each charge's tokens are
// taken from its token bucket as of Redis's clock, its last send instant
// kept (layersDelayScript), or added to its quota or budget while the
// window holding the charge's At is Redis's current one
// (layersChargeQuotaScript). Charges of one key (and window) are summed
// first. It sends one script call per chargeBatch keys of a kind on a
// single node, one per shard or key on a Cluster, all in one pipeline. A
// Bucket calls it when it comes back from its local fallback: its cost is
// that of the keys the fallback granted, not of the messages.
func (l *Layered) ChargeLayers(ctx context.Context, charges []backend.LayerCharge) error {
	return l.chargeLayers(ctx, time.Time{}, charges)
}

// chargeLoc is where a charge goes: layer i's key, and for a quota or
// budget the window (µs) it is charged in.
type chargeLoc struct {
	i          int
	key        string
	start, end int64 // 0 for a token bucket
}

// chargeCall is one script call of chargeLayers.
type chargeCall struct {
	script *redis.Script
	rk     layerKeys
	args   []any
}

// chargeLayers is ChargeLayers at an explicit instant (zero: Redis's TIME).
func (l *Layered) chargeLayers(ctx context.Context, at time.Time, charges []backend.LayerCharge) error {
	nowUS := int64(0)
	if !at.IsZero() {
		nowUS = at.UnixMicro()
	}
	owed := map[chargeLoc]float64{}
	var buckets, counts []chargeLoc // in the order first charged
	for _, c := range charges {
		i, err := l.layerIndex(c.Layer)
		if err != nil || c.Tokens <= 0 {
			continue
		}
		ly := l.layers[i]
		counted, charged := backend.Charged(ly)
		if !charged {
			continue
		}
		k := chargeLoc{i: i, key: c.Key}
		if !ly.Keyed {
			k.key = ""
		}
		if counted {
			start, end := backend.ChargeWindow(ly, c.At)
			k.start, k.end = start.UnixMicro(), end.UnixMicro()
		}
		if _, ok := owed[k]; !ok {
			if counted {
				counts = append(counts, k)
			} else {
				buckets = append(buckets, k)
			}
		}
		owed[k] += c.Tokens
	}
	calls := append(l.chargeCalls(layersDelayScript, buckets, owed, nowUS), l.chargeCalls(layersChargeQuotaScript, counts, owed, nowUS)...)
	if len(calls) == 0 {
		return nil
	}
	// One pipeline (on a Cluster the client sends each master its calls
	// at once); a call that finds its script gone (a restart, SCRIPT
	// FLUSH) runs again with the script loaded, as the takes do.
	pipe := l.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = c.script.EvalSha(ctx, pipe, c.rk.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx)
	for i, cmd := range cmds {
		if err := l.rerunUnknown(ctx, calls[i].script, cmd, calls[i].rk.keys, calls[i].args); err != nil {
			return l.fail("charge layers", err)
		}
	}
	return nil
}

// chargeCalls returns the calls of script (layersDelayScript for token
// buckets, layersChargeQuotaScript for quotas and budgets) that charge
// locs what owed holds for each: on a Cluster one call per shard or key
// (one slot), else one per chargeBatch keys.
func (l *Layered) chargeCalls(script *redis.Script, locs []chargeLoc, owed map[chargeLoc]float64, nowUS int64) []*chargeCall {
	buckets := script == layersDelayScript
	var calls []*chargeCall
	bySlot := map[string]*chargeCall{}
	for _, k := range locs {
		rk, _ := l.bucketLoc(k.i, k.key)
		var c *chargeCall
		switch {
		case l.cluster:
			c = bySlot[rk]
		case len(calls) > 0 && len(calls[len(calls)-1].rk.keys) < chargeBatch:
			c = calls[len(calls)-1]
		}
		if c == nil {
			c = &chargeCall{script: script, args: []any{nowUS}}
			if buckets {
				c.args = append(c.args, chargeNoCheck, 0) // from, to: no check, last send kept
			}
			calls = append(calls, c)
			bySlot[rk] = c
		}
		if buckets {
			c.rk.addLayer(l, k.i, k.key)
			c.args = append(c.args, l.spec[k.i][2], l.spec[k.i][3], owed[k])
		} else {
			c.rk.add(rk)
			c.args = append(c.args, k.start, k.end, int64(math.Round(owed[k])))
		}
	}
	if buckets {
		for _, c := range calls {
			c.args = append(c.args, string(c.rk.fields), 0) // the fields, cost 0
		}
	}
	return calls
}
