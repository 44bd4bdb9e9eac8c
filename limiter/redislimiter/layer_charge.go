package redislimiter

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
)

// chargeBatch is how many layer buckets one ChargeLayers call takes from
// on a single node.
const chargeBatch = 128

// chargeNoCheck is the "from" instant given to layersDelayScript by
// ChargeLayers: later than any key's last send, so the script takes the
// tokens without asking whether a later message of the key still fits.
var chargeNoCheck = strconv.FormatInt(1<<62, 10)

// ChargeLayers implements backend.LayerCharger with layersDelayScript: each
// charge's tokens are taken from its key as of Redis's clock, its last send
// instant kept. Charges of one key are summed first. It sends one script
// call per chargeBatch keys on a single node, one per shard on a Cluster
// (a shard's buckets share a slot), all in one pipeline. A Bucket calls it
// once, when it comes back from its local fallback: its cost is that of the
// keys the fallback granted, not of the messages.
func (l *Layered) ChargeLayers(ctx context.Context, charges []backend.LayerCharge) error {
	return l.chargeLayers(ctx, time.Time{}, charges)
}

// chargeLayers is ChargeLayers at an explicit instant (zero: Redis's TIME).
func (l *Layered) chargeLayers(ctx context.Context, at time.Time, charges []backend.LayerCharge) error {
	nowUS := int64(0)
	if !at.IsZero() {
		nowUS = at.UnixMicro()
	}
	type loc struct {
		i   int
		key string
	}
	owed := map[loc]float64{}
	var order []loc
	for _, c := range charges {
		i, err := l.layerIndex(c.Layer)
		if err != nil || c.Tokens <= 0 {
			continue
		}
		ly := l.layers[i]
		if !ly.IsBucket() || ly.Shadow {
			continue
		}
		k := loc{i, c.Key}
		if !ly.Keyed {
			k.key = ""
		}
		if _, ok := owed[k]; !ok {
			order = append(order, k)
		}
		owed[k] += c.Tokens
	}
	// A call's keys: on a Cluster those of one shard (bucketLoc's key),
	// else up to chargeBatch.
	type call struct {
		rk   layerKeys
		args []any
	}
	var calls []*call
	byShard := map[string]*call{}
	for _, k := range order {
		rk, _ := l.bucketLoc(k.i, k.key)
		var c *call
		switch {
		case l.cluster:
			if c = byShard[rk]; c == nil {
				c = &call{}
				byShard[rk] = c
				calls = append(calls, c)
			}
		case len(calls) == 0 || len(calls[len(calls)-1].rk.keys) >= chargeBatch:
			c = &call{}
			calls = append(calls, c)
		default:
			c = calls[len(calls)-1]
		}
		if c.args == nil {
			c.args = []any{nowUS, chargeNoCheck, 0}
		}
		c.rk.addLayer(l, k.i, k.key)
		c.args = append(c.args, l.spec[k.i][2], l.spec[k.i][3], owed[k])
	}
	if len(calls) == 0 {
		return nil
	}
	for i := range calls {
		calls[i].args = append(calls[i].args, string(calls[i].rk.fields), 0)
	}
	// One pipeline: on a Cluster the client sends each master its calls
	// at once. A call that finds the script gone (a master restarted
	// since the load) is sent again after a load, once; the others are
	// not, so that no key is charged twice.
	for attempt := 0; len(calls) > 0; attempt++ {
		if err := layersDelayScript.Load(ctx, l.client).Err(); err != nil {
			return l.fail("charge layers", err)
		}
		pipe := l.client.Pipeline()
		cmds := make([]*redis.Cmd, len(calls))
		for i, c := range calls {
			cmds[i] = layersDelayScript.EvalSha(ctx, pipe, c.rk.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx)
		var again []*call
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
