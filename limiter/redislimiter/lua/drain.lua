-- drain.lua: the body of drainScript, after prelude.lua.
--
-- drainScript empties the bucket and leaves at least debt tokens reserved ahead
-- (tokens = min(tokens, -debt)), keeping a pause, and announces it: replicas
-- still in fallback then probe at once.
--
-- KEYS: state, override. ARGV: rate, burst, debt, now_us, channel. Reply:
-- remaining_milli.

local now = now_us(ARGV[4])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local t0, ts = load(KEYS[1], now, rate, burst)
local tokens = math.min(t0, -math.max(tonumber(ARGV[3]), 0))
Q0 = Q0 + (math.max(0, -tokens) - math.max(0, -t0)) -- the debt is at the front (priority.lua)
save(KEYS[1], tokens, ts, now, rate, burst)
redis.call('HSET', KEYS[1], 'chg', string.format('%d', now))
redis.call('PUBLISH', ARGV[5], 'recovered')
return milli(tokens)
