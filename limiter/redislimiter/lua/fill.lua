-- fill.lua: the body of fillScript, after prelude.lua.
--
-- fillScript fills the bucket to its effective burst, keeping a pause, and
-- announces it. When the burst is unknown (0: an Admin without configured
-- limits and no override burst), a bucket that is not paused loses its
-- state, which means full to every replica's own burst, and a paused one
-- is filled to MaxBurst, which every replica caps at its own burst.
--
-- KEYS: state, override. ARGV: rate, burst, now_us, channel. Reply: 1.

local now = now_us(ARGV[3])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local st = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local ts = tonumber(st[2])
local paused = ts and ts > now
if rate > 0 and burst > 0 then
  local _, lts = load(KEYS[1], now, rate, burst)
  save(KEYS[1], burst, lts, now, rate, burst)
  redis.call('HSET', KEYS[1], 'chg', string.format('%d', now))
elseif paused then
  local keep = math.ceil((ts - now) / 1000) + 1000
  redis.call('HSET', KEYS[1], 'tokens', MAXBURST, 'ts', ts, 'chg', string.format('%d', now), 'x', string.format('%d', real_ms() + keep - 1))
  redis.call('PEXPIRE', KEYS[1], keep)
else
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[4], 'fill')
return 1
