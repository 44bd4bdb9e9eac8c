package redislimiter

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
)

// chargeBatch is how many layer keys one ChargeLayers call charges on a
// single node.
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
// Bucket calls it once, when it comes back from its local fallback: its
// cost is that of the keys the fallback granted, not of the messages.
func (l *Layered) ChargeLayers(ctx context.Context, charges []backend.LayerCharge) error {
	return l.chargeLayers(ctx, time.Time{}, charges)
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
	type loc struct {
		i     int
		key   string
		start int64 // a quota's or budget's window, in µs; 0 for a bucket
		end   int64
	}
	owed := map[loc]float64{}
	var order []loc
	for _, c := range charges {
		i, err := l.layerIndex(c.Layer)
		if err != nil || c.Tokens <= 0 {
			continue
		}
		ly := l.layers[i]
		counted := ly.IsQuota() || ly.IsBudget()
		if ly.Shadow || !(ly.IsBucket() || counted) {
			continue
		}
		k := loc{i: i, key: c.Key}
		if !ly.Keyed {
			k.key = ""
		}
		if counted {
			w := backend.QuotaWindows(ly.Per, c.At, ly.Location)
			k.start, k.end = w[1].UnixMicro(), w[2].UnixMicro()
		}
		if _, ok := owed[k]; !ok {
			order = append(order, k)
		}
		owed[k] += c.Tokens
	}
	// A call charges keys of one kind: on a Cluster those of one shard
	// or key (one slot), else up to chargeBatch.
	var calls []*chargeCall
	bySlotKey := map[string]*chargeCall{}
	var lastBucket, lastQuota *chargeCall
	for _, k := range order {
		counted := k.end != 0
		script, last := layersDelayScript, &lastBucket
		if counted {
			script, last = layersChargeQuotaScript, &lastQuota
		}
		rk, _ := l.bucketLoc(k.i, k.key)
		var c *chargeCall
		switch {
		case l.cluster:
			if c = bySlotKey[rk]; c == nil || c.script != script {
				c = &chargeCall{script: script}
				bySlotKey[rk] = c
				calls = append(calls, c)
			}
		case *last == nil || len((*last).rk.keys) >= chargeBatch:
			c = &chargeCall{script: script}
			*last = c
			calls = append(calls, c)
		default:
			c = *last
		}
		if c.args == nil {
			c.args = []any{nowUS}
			if !counted {
				c.args = append(c.args, chargeNoCheck, 0)
			}
		}
		if counted {
			c.rk.add(rk)
			c.args = append(c.args, k.start, k.end, int64(math.Round(owed[k])))
			continue
		}
		c.rk.addLayer(l, k.i, k.key)
		c.args = append(c.args, l.spec[k.i][2], l.spec[k.i][3], owed[k])
	}
	for _, c := range calls {
		if c.script == layersDelayScript {
			c.args = append(c.args, string(c.rk.fields), 0)
		}
	}
	// One pipeline: on a Cluster the client sends each master its calls
	// at once. A call that finds its script gone (a master restarted
	// since the load) is sent again after a load, once; the others are
	// not, so that no key is charged twice.
	for attempt := 0; len(calls) > 0; attempt++ {
		for _, s := range []*redis.Script{layersDelayScript, layersChargeQuotaScript} {
			if err := s.Load(ctx, l.client).Err(); err != nil {
				return l.fail("charge layers", err)
			}
		}
		pipe := l.client.Pipeline()
		cmds := make([]*redis.Cmd, len(calls))
		for i, c := range calls {
			cmds[i] = c.script.EvalSha(ctx, pipe, c.rk.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx)
		var again []*chargeCall
		for i, cmd := range cmds {
			err := cmd.Err()
			if err == nil {
				continue
			}
			if attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
				again = append(again, calls[i])
				continue
			}
			return l.fail("charge layers", err)
		}
		calls = again
	}
	return nil
}
