-- pause.lua: the body of pauseScript, after prelude.lua.
--
-- pauseScript stops refilling and granting until now + d, and announces
-- it. A longer pause already in place is kept. Reservations already made
-- stay valid.
--
-- KEYS: state, override. ARGV: rate, burst, d_us, now_us, channel, by (the
-- pausing replica, recorded in the state's "by" field when this pause is
-- the longer). Reply: paused_us.

local now = now_us(ARGV[4])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local tokens, ts = load(KEYS[1], now, rate, burst)
local untl = now + tonumber(ARGV[3])
local longer = untl > ts
if longer then ts = untl end
save(KEYS[1], math.min(tokens, 0), ts, now, rate, burst)
if longer then redis.call('HSET', KEYS[1], 'by', ARGV[6]) end
redis.call('HSET', KEYS[1], 'chg', string.format('%d', now))
redis.call('PUBLISH', ARGV[5], 'pause')
return clamp(ts - now)
