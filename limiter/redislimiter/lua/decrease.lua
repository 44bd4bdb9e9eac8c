-- decrease.lua: the body of decreaseScript, after prelude.lua.
--
-- decreaseScript records a push-back for the adaptive rate: unless the
-- last decrease is within the merge window, it multiplies the rate in force
-- by decrease (floored at min_rate, capped at the ceiling), restarts the
-- climb from now (or the end of a pause in force), and announces it. The
-- adaptive fields expire with an override that has a TTL, and otherwise
-- when the rate is back at the ceiling.
--
-- KEYS: state, override. ARGV: rate, burst, decrease, min_rate, slope
-- (tokens/s per µs), window_us, now_us, channel. Reply: {decreased (1/0),
-- rate_milli}.

local now = now_us(ARGV[7])
local cur, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local last = tonumber(redis.call('HGET', KEYS[2], 'adec'))
if AD and last and now - last < tonumber(ARGV[6]) then return {0, milli(cur)} end
local tokens, ts = load(KEYS[1], now, cur, burst)
save(KEYS[1], tokens, ts, now, cur, burst)
redis.call('HSET', KEYS[1], 'chg', string.format('%d', now))
local nr = math.min(CEIL, math.max(tonumber(ARGV[4]), cur * tonumber(ARGV[3])))
local at = math.max(now, ts)
local k = tonumber(ARGV[5])
redis.call('HSET', KEYS[2], 'arate', string.format('%.17g', nr), 'ats', string.format('%d', at),
  'ainc', ARGV[5], 'adec', string.format('%d', now))
if redis.call('HEXISTS', KEYS[2], 'rate') == 0 then
  local ms = 1000 + (at - now) / 1000
  if k > 0 then ms = ms + (CEIL - nr) / k / 1000 end
  redis.call('PEXPIRE', KEYS[2], math.ceil(math.min(ms, 1e12)))
end
redis.call('PUBLISH', ARGV[8], 'adaptive')
return {1, milli(nr)}
