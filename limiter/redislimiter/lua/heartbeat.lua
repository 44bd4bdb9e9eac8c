-- heartbeat.lua: the body of heartbeatScript, after prelude.lua.
--
-- heartbeatScript records a live replica and its configured "rate burst"
-- (with its report, when it sends one) followed by " a:NOW_US", the
-- instant of the beat on Redis's clock, keeps it in the set of idle
-- replicas while its report says idle, forgets the replicas whose
-- heartbeats expired, and counts the live ones.
--
-- KEYS: replicas, configs, idle. ARGV: id, ttl_us, now_us, config, idle
-- ("1": the replica is idle), count ("1": count the consumers too). Reply:
-- live replicas; with count, {live, consuming}, consuming being the live
-- replicas that are not idle.

local now = now_us(ARGV[3])
local ttl = tonumber(ARGV[2])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4] .. string.format(' a:%d', now))
local idle = 0
if KEYS[3] then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if ARGV[5] == '1' then
    redis.call('ZADD', KEYS[3], now + ttl, ARGV[1])
  else
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  idle = redis.call('ZCARD', KEYS[3])
end
local keep = math.ceil(ttl / 1000) * 2
for _, k in ipairs(KEYS) do
  if redis.call('PTTL', k) < keep then redis.call('PEXPIRE', k, keep) end
end
local live = redis.call('ZCARD', KEYS[1])
if ARGV[6] ~= '1' then return live end
return {live, live - idle}
