-- layers_delay.lua: the body of layersDelayScript, after math.lua and
-- layer_prelude.lua.
--
-- layersDelayScript takes from layer buckets the tokens that a granted
-- request's later send costs them: the request was charged for one instant
-- and goes out later (a push or a rate change moved its reservation on
-- the shared bucket), so the refill between the two instants is not there
-- to be spent by the key's next message (limiter's LayeredMemory.DelayLayersAt).
--
-- KEYS: one key per layer bucket. ARGV: now_us (0: TIME); then 3 values
-- per key: rate, burst, and the tokens to take (min(delay * rate, cost)).
-- Reply: 1.

local now = tonumber(ARGV[1])
if not (now and now > 0) then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
for i = 1, #KEYS do
  local a = 1 + (i - 1) * 3
  local rate, burst, debit = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local tokens, ts = bucket_load(KEYS[i], now, rate, burst)
  bucket_save(KEYS[i], tokens - debit, ts, now, rate, burst)
end
return 1
