-- slots_release.lua: the body of slotsReleaseScript, after math.lua.
--
-- slotsReleaseScript gives back concurrency slots (layers.lua's kind c),
-- several in one call: for each key, the holder's member is removed, and
-- when the key had every slot held before (its ended leases dropped
-- first), the release is announced on the channel, so that the replicas
-- whose requests wait for that key ask again at once.
--
-- KEYS: one sorted set per slot. ARGV: now_us (0: TIME), channel; then 3
-- values per key:
-- holder, limit, the announcement ("slot LAYER KEY"). Reply: the number of
-- slots released.

local now = tonumber(ARGV[1])
if not (now and now > 0) then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local released = 0
for i = 1, #KEYS do
  local key = KEYS[i]
  local a = 2 + (i - 1) * 3
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local held = redis.call('ZCARD', key)
  if redis.call('ZREM', key, ARGV[a + 1]) == 1 then
    released = released + 1
    if held >= tonumber(ARGV[a + 2]) then
      redis.call('PUBLISH', ARGV[2], ARGV[a + 3])
    end
  end
end
return released
