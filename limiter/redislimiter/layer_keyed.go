package redislimiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/limiter"
)

// layersKeyedScript decides, for one or more requests in turn, layers that
// are all token buckets, concurrency layers or send windows, without the
// shared bucket: what a Bucket sends
// while its lease pays the shared bucket, and a Cluster's keyed steps. Each
// request is decided as layersScript decides it with shared 0 and no
// quota or budget, at a fraction of its cost: it carries only clamp and wait_us
// (mathLua) and the layer functions (lua/layer_prelude.lua), not the rest
// of the prelude, and replies with one string. lua/layers_keyed.lua holds
// its body, with KEYS, ARGV and reply in its header. A batch of concurrent
// requests is one call (see layerBatcher).
var layersKeyedScript = redis.NewScript(layersKeyedSrc)

var layersKeyedSrc = mathLua + luaSource("layer_prelude.lua") + luaSource("layers_keyed.lua")

// layersKeyedClusterScript is layersKeyedScript, the same Lua, declaring
// allow-cross-slot-keys (Redis 7): what a Cluster's batch sends to a
// master, the requests whose keys it holds, in many slots, in one call
// (layerBatcher.sendCluster). Redis refuses declared KEYS of several slots
// (CROSSSLOT) even with the flag, so the call declares one key, which
// routes it to its master, and carries the requests' keys in ARGV; the
// script checks, before each request, that this node serves its keys
// (lua/layers_keyed.lua). A script without flags may touch undeclared keys
// of other slots too, for compatibility; the flag states it and does not
// depend on that.
var layersKeyedClusterScript = redis.NewScript("#!lua flags=allow-cross-slot-keys\n" + layersKeyedSrc)

// keyedOnly reports whether a step can go to layersKeyedScript: it leaves
// the shared bucket out, its layers are token buckets, concurrency layers
// and send windows only (no quota or budget, which that script does not
// know) and none is a shadow.
func (l *Layered) keyedOnly(st step) bool {
	if st.shared || st.shadow {
		return false
	}
	for _, i := range st.layers {
		if ly := l.layers[i]; !(ly.IsBucket() || ly.IsConcurrency() || ly.IsWindow()) || ly.Shadow {
			return false
		}
	}
	return true
}

// keyedArgs returns the KEYS and ARGV of layersKeyedScript for the requests
// reqs, whose keys (by layer index) are keys, on the layers of one step.
// With inArgv the keys go in ARGV, each request's after its values, and
// KEYS is the first of them alone, which routes the call to its master
// (layersKeyedClusterScript).
func (l *Layered) keyedArgs(at time.Time, layers []int, reqs []backend.LayerRequest, keys [][]string, base time.Duration, inArgv bool) ([]string, []any) {
	nowUS, clock := int64(0), at
	if at.IsZero() {
		clock = time.Now()
	} else {
		nowUS = at.UnixMicro()
	}
	var rk layerKeys
	per, mode := 4, ""
	if inArgv {
		per, mode = 4+len(layers), "a"
	}
	args := make([]any, 0, 4+6*len(layers)+per*len(reqs))
	args = append(args, nowUS, len(layers), mode)
	for _, i := range layers {
		args = append(args, l.spec[i]...) // index, kind, rate, burst, action, max_wait_us
	}
	for j, req := range reqs {
		k0 := len(rk.keys)
		for _, i := range layers {
			rk.addLayer(l, i, keys[j][i])
		}
		args = append(args, req.Holder, req.Cost, max(base, 0).Microseconds(), l.paidArg(layers, keys[j], req.Paid))
		for _, i := range layers {
			if ly := l.layers[i]; ly.IsWindow() {
				// checkWindows made sure the key is a number; the
				// spans are cached.
				spans, _ := backend.WindowSpans(ly, keys[j][i], req.Priority, clock)
				args = append(args, backend.FormatSpans(spans))
			}
		}
		if inArgv {
			for _, k := range rk.keys[k0:] {
				args = append(args, k)
			}
		}
	}
	args = append(args, string(rk.fields)) // lua/layers_keyed.lua: last
	if inArgv && len(rk.keys) > 0 {
		return rk.keys[:1], args
	}
	return rk.keys, args
}

// keyedReplies turns layersKeyedScript's reply s, or its error, into the
// results of reqs, in out and errs (of len(reqs)), and returns how many
// requests it set: all of them, but for a reply that ends with "m" (the
// keys in ARGV, lua/layers_keyed.lua), after which the requests were not
// run. Without the shared bucket a result's Remaining, Rate and Burst
// are 0, as layersScript replies then.
func (l *Layered) keyedReplies(reqs []backend.LayerRequest, base time.Duration, s string, err error, out []backend.LayerResult, errs []error) int {
	if err != nil {
		err = l.fail("take layers", err)
		for j := range reqs {
			out[j], errs[j] = backend.LayerResult{}, err
		}
		return len(reqs)
	}
	reply := s
	now, s, ok := nextInt(s)
	for j, req := range reqs {
		if ok && s == "m" {
			return j
		}
		var status, wait, idx int64
		if ok {
			status, s, ok = nextInt(s)
		}
		if ok {
			wait, s, ok = nextInt(s)
		}
		if ok {
			idx, s, ok = nextInt(s)
		}
		if !ok || idx < 0 || int(idx) > len(l.layers) {
			out[j], errs[j] = backend.LayerResult{}, l.fail("take layers", fmt.Errorf("%w: %q", backend.ErrMalformedReply, reply))
			continue
		}
		out[j], errs[j] = l.keyedResult(req, base, status, wait, idx, now)
	}
	return len(reqs)
}

// keyedResult is one request's result from layersKeyedScript, decided
// for base after now: status, wait_us, layer (1-based, 0 for none) and the
// store's clock now_us.
func (l *Layered) keyedResult(req backend.LayerRequest, base time.Duration, status, wait, idx, now int64) (backend.LayerResult, error) {
	res := backend.LayerResult{TakeResult: backend.TakeResult{
		Wait: time.Duration(wait) * time.Microsecond,
		At:   time.UnixMicro(now),
	}}
	var layer limiter.Layer
	if idx > 0 {
		layer = l.layers[idx-1]
		res.Limiting = layer.Name
	}
	switch status {
	case 1:
		res.Granted, res.Tokens = true, req.Cost
		res.Wait, res.LayersDue = base, res.Wait
	case 0:
	case 2:
		res.Exceeded = backend.ExceededError(layer, res.At, res.Wait)
	case 4:
		if idx == 0 {
			return backend.LayerResult{}, l.malformed("take layers", []int64{status, wait, idx, now})
		}
		res.Exceeded = backend.ReservedError(layer, layerKeyOf(layer, req), res.At, res.Wait)
	case -2:
		return res, backend.CostError(layer, req.Cost)
	case -3:
		if idx == 0 {
			return backend.LayerResult{}, l.malformed("take layers", []int64{status, wait, idx, now})
		}
		return res, l.fail("take layers", fmt.Errorf("layer %q: the Redis clock (%v) is outside the windows computed around this host's clock", layer.Name, res.At))
	default:
		return backend.LayerResult{}, l.malformed("take layers", []int64{status, wait, idx, now})
	}
	return res, nil
}

// nextInt parses the integer at the start of s, up to a space, and returns
// the rest after that space.
func nextInt(s string) (int64, string, bool) {
	f, rest, _ := strings.Cut(s, " ")
	v, err := strconv.ParseInt(f, 10, 64)
	return v, rest, err == nil
}

// takeKeyed decides one request on a step that keyedOnly accepts.
func (l *Layered) takeKeyed(ctx context.Context, at time.Time, req backend.LayerRequest, keys []string, st step, base time.Duration) (backend.LayerResult, error) {
	reqs, ks := []backend.LayerRequest{req}, [][]string{keys}
	rkeys, args := l.keyedArgs(at, st.layers, reqs, ks, base, false)
	s, err := layersKeyedScript.Run(ctx, l.client, rkeys, args...).Text()
	var (
		out  [1]backend.LayerResult
		errs [1]error
	)
	l.keyedReplies(reqs, base, s, err, out[:], errs[:])
	return out[0], errs[0]
}
