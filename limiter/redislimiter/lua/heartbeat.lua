-- heartbeat.lua: the body of heartbeatScript, after prelude.lua.
--
-- heartbeatScript records a live replica and its configured "rate burst"
-- (with its report, when it sends one) followed by " a:NOW_US", the
-- instant of the beat on Redis's clock, forgets the replicas whose
-- heartbeats expired, and counts the live ones.
--
-- KEYS: replicas, configs. ARGV: id, ttl_us, now_us, config, count ("1":
-- count the consumers too). Reply: live replicas; with count,
-- {live, consuming}, consuming being the live replicas whose config has no
-- "idle" token.

local now = now_us(ARGV[3])
local ttl = tonumber(ARGV[2])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4] .. string.format(' a:%d', now))
local keep = math.ceil(ttl / 1000) * 2
for _, k in ipairs(KEYS) do
  if redis.call('PTTL', k) < keep then redis.call('PEXPIRE', k, keep) end
end
local live = redis.call('ZCARD', KEYS[1])
if ARGV[5] ~= '1' then return live end
local consuming = 0
for _, c in ipairs(redis.call('HMGET', KEYS[2], unpack(redis.call('ZRANGE', KEYS[1], 0, -1)))) do
  if not (c and string.find(' ' .. c .. ' ', ' idle ', 1, true)) then consuming = consuming + 1 end
end
return {live, consuming}
