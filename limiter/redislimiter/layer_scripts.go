package redislimiter

import "github.com/redis/go-redis/v9"

// layerPrelude holds the functions of the layer scripts: the prelude, then
// lua/layer_prelude.lua. A layer's state is one string key, or a keyed
// token bucket's a field of its shard (Layered.bucketLoc): tokens, ts and
// last as three doubles (24 bytes) for a bucket, "window_end used" for a
// quota.
var layerPrelude = prelude + luaSource("layer_prelude.lua")

// layersScript decides the shared bucket (optionally) and layers in one
// atomic step: all grant and are charged, or none is. It mirrors
// backend.LayeredMemory.TakeLayersAt line by line. layerPrelude, then
// lua/fair.lua (fair shares among tenants), then lua/layers.lua (KEYS, ARGV and reply in its header).
var layersScript = redis.NewScript(layerPrelude + luaSource("fair.lua") + luaSource("layers.lua"))

// layersRefundScript gives back what layersScript charged: layerPrelude,
// then lua/layers_refund.lua.
var layersRefundScript = redis.NewScript(layerPrelude + luaSource("layers_refund.lua"))

// layerStatusScript reads one key of a layer: layerPrelude, then
// lua/layer_status.lua.
var layerStatusScript = redis.NewScript(layerPrelude + luaSource("layer_status.lua"))
