-- layer_status.lua: the body of layerStatusScript, after prelude.lua and
-- layer_prelude.lua (layerPrelude).
--
-- layerStatusScript reads one key of a layer.
--
-- KEYS: the layer's key (a keyed token bucket's shard). ARGV: kind, rate
-- or quota, burst, b0..b3, now_us, the bucket's field in its shard ("" for
-- a key of its own). kept: the key, or the field, exists.
-- Reply: {tokens_milli (bucket) or used (quota; slots held, concurrency), window_end_us (quota, 0
-- for a bucket; -1 when no window holds now), now_us, kept (1 when the key
-- exists)}.

local now = now_us(ARGV[8])
local field = ARGV[9]
if field == '' then field = nil end
local kept
if field then kept = redis.call('HEXISTS', KEYS[1], field) else kept = redis.call('EXISTS', KEYS[1]) end
if ARGV[1] == 'c' then -- a concurrency layer: the slots held now
  return {redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf'), 0, now, kept}
end
if ARGV[1] == 'q' then
  local e = window_end(4, now)
  if not e then return {0, -1, now, kept} end
  return {quota_used(KEYS[1], e), e, now, kept}
end
local tokens = bucket_load(KEYS[1], field, now, tonumber(ARGV[2]), tonumber(ARGV[3]))
return {milli(tokens), 0, now, kept}
