-- resume.lua: the body of resumeScript, after prelude.lua.
--
-- resumeScript ends a pause now, whoever set it, and announces it: the
-- bucket refills again from now, with the tokens it had (reservations made
-- during the pause stay valid and fall due at the rate). A bucket that is
-- not paused is left as it is, and nothing is announced.
--
-- KEYS: state, override. ARGV: rate, burst, now_us, channel. Reply: 1 when
-- a pause ended, else 0.

local now = now_us(ARGV[3])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local ts = tonumber(redis.call('HGET', KEYS[1], 'ts'))
if not ts or ts <= now then return 0 end
local tokens = load(KEYS[1], now, rate, burst)
save(KEYS[1], tokens, now, now, rate, burst)
redis.call('HDEL', KEYS[1], 'by')
redis.call('HSET', KEYS[1], 'chg', string.format('%d', now))
redis.call('PUBLISH', ARGV[4], 'resume')
return 1
