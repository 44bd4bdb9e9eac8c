package redislimiter

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
)

// LayerKeyCount is how many keys of a layer hold state in Redis: the keys in
// use (a key whose bucket is full again, or whose quota window ended, has
// none).
type LayerKeyCount struct {
	// Layer is the layer's name.
	Layer string
	// Keys is the count, exact when Exact is set, else an estimate from a
	// sample of the keyspace.
	Keys  int64
	Exact bool
}

// layerScanLimit bounds the keys CountLayerKeys reads from each master
// before it estimates instead of counting; layerScanCount is the COUNT of
// each SCAN. Tests lower them.
var layerScanLimit, layerScanCount int64 = 100000, 1000

// shardOwnFields is how many fields of a keyed layer's shard are its own,
// not a bucket's: "~" (its TTL) and "^" (when it was made; see
// lua/layer_prelude.lua). A shard an older version made has no "^", and
// counts one bucket less.
const shardOwnFields = 2

// CountLayerKeys counts the keys in use of a layer with SCAN (never KEYS),
// on every master of a Cluster client; for a keyed token bucket, the
// fields of its shards (HLEN, less the shard's own fields "~" and "^", shardOwnFields; a bucket
// full again that no sweep deleted yet counts). Up to 100000 keys per master it
// counts exactly; beyond, it stops and estimates the count as the share of
// the layer's keys among those read times the master's DBSIZE. It suits an
// operator's command, not a hot path.
func (l *Layered) CountLayerKeys(ctx context.Context, client redis.UniversalClient, layer string) (LayerKeyCount, error) {
	i, err := l.layerIndex(layer)
	if err != nil {
		return LayerKeyCount{}, err
	}
	out := LayerKeyCount{Layer: layer, Exact: true}
	if !l.layers[i].Keyed {
		n, err := client.Exists(ctx, l.unkeyed[i]).Result()
		if err != nil {
			return LayerKeyCount{}, l.fail("count layer keys", err)
		}
		out.Keys = n
		return out, nil
	}
	prefix := l.keyPrefix[i]
	sharded := l.sharded(i)
	var mu sync.Mutex
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		var scanned, matched int64
		for {
			keys, next, err := c.Scan(ctx, cursor, "", layerScanCount).Result()
			if err != nil {
				return err
			}
			scanned += int64(len(keys))
			pipe := c.Pipeline()
			var lens []*redis.IntCmd
			for _, k := range keys {
				switch {
				case !strings.HasPrefix(k, prefix):
				case sharded && isShard(k, prefix): // a shard: its buckets
					lens = append(lens, pipe.HLen(ctx, k))
				default:
					matched++
				}
			}
			if len(lens) > 0 {
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
				for _, cmd := range lens {
					matched += max(cmd.Val()-shardOwnFields, 0)
				}
			}
			cursor = next
			if cursor == 0 {
				break
			}
			if scanned >= layerScanLimit {
				size, err := c.DBSize(ctx).Result()
				if err != nil {
					return err
				}
				matched = matched * size / scanned
				mu.Lock()
				out.Exact = false
				mu.Unlock()
				break
			}
		}
		mu.Lock()
		out.Keys += matched
		mu.Unlock()
		return nil
	}
	err = forEachPrimary(ctx, client, scan)
	if err != nil {
		return LayerKeyCount{}, l.fail("count layer keys", fmt.Errorf("scanning the keys of layer %q: %w", layer, err))
	}
	return out, nil
}

// Layer returns the layer named name, with its defaults filled in.
func (l *Layered) Layer(name string) (limiter.Layer, error) {
	i, err := l.layerIndex(name)
	if err != nil {
		return limiter.Layer{}, err
	}
	return l.layers[i], nil
}

// ResetLayerKeys deletes the state of every key of a layer with UNLINK: each
// key's bucket is full again, its quota unused. It finds a keyed layer's
// keys with SCAN (never KEYS), on every master of a Cluster client, and
// returns how many keys it deleted (a keyed token bucket's: the buckets
// in the shards it deleted); a key taken while it scans may remain.
// It suits an operator's command, not a hot path.
func (l *Layered) ResetLayerKeys(ctx context.Context, client redis.UniversalClient, layer string) (int64, error) {
	i, err := l.layerIndex(layer)
	if err != nil {
		return 0, err
	}
	if !l.layers[i].Keyed {
		if l.needsSince([]int{i}) { // the slots booked on the deleted key no longer pass
			if err := client.Unlink(ctx, l.sinceKey).Err(); err != nil {
				return 0, l.fail("reset layer keys", err)
			}
		}
		n, err := client.Unlink(ctx, l.unkeyed[i]).Result()
		if err != nil {
			return 0, l.fail("reset layer keys", err)
		}
		return n, nil
	}
	prefix := l.keyPrefix[i]
	sharded := l.sharded(i)
	var mu sync.Mutex
	var deleted int64
	reset := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, "", layerScanCount).Result()
			if err != nil {
				return err
			}
			// One key per UNLINK: a Cluster's keys of a layer lie in
			// different slots.
			pipe := c.Pipeline()
			var cmds, lens []*redis.IntCmd
			for _, k := range keys {
				if strings.HasPrefix(k, prefix) {
					var n *redis.IntCmd // a shard: its buckets
					if sharded && isShard(k, prefix) {
						n = pipe.HLen(ctx, k)
					}
					lens = append(lens, n)
					cmds = append(cmds, pipe.Unlink(ctx, k))
				}
			}
			if len(cmds) > 0 {
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
				mu.Lock()
				for j, cmd := range cmds {
					if lens[j] != nil {
						deleted += cmd.Val() * max(lens[j].Val()-shardOwnFields, 0)
					} else {
						deleted += cmd.Val()
					}
				}
				mu.Unlock()
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	err = forEachPrimary(ctx, client, reset)
	if err != nil {
		return deleted, l.fail("reset layer keys", fmt.Errorf("scanning the keys of layer %q: %w", layer, err))
	}
	return deleted, nil
}

// isShard reports whether k, a key of a layer whose keys start with
// prefix, is a shard of keyed token buckets (Layered.bucketLoc) rather
// than a key of its own written by an older binary.
func isShard(k, prefix string) bool { return len(k) == len(prefix)+2 }
